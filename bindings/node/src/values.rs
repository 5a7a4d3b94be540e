//! Plain values both the client and the handles return: sandboxes, exec
//! output and metadata pairs.

use std::collections::HashMap;

use napi::bindgen_prelude::{BigInt, Buffer};
use napi_derive::napi;
use openshell_sdk::Metadata;
use prost::Message;

/// A sandbox: the fields the curated API shows, plus the encoded message.
#[napi(object)]
pub struct NativeSandbox {
    pub id: String,
    pub name: String,
    /// `READY`, `PROVISIONING`, ... (the proto enum name without prefix).
    pub phase: String,
    pub labels: HashMap<String, String>,
    pub exit_code: Option<i32>,
    pub resource_version: BigInt,
    /// The full `openshell.v1.Sandbox`, encoded.
    pub proto: Buffer,
}

pub fn native_sandbox(sandbox: openshell_sdk::Sandbox) -> NativeSandbox {
    let phase = sandbox.phase.as_str_name();
    let phase = phase.strip_prefix("SANDBOX_PHASE_").unwrap_or(phase);
    NativeSandbox {
        proto: Buffer::from(sandbox.proto.encode_to_vec()),
        id: sandbox.id,
        name: sandbox.name,
        phase: phase.to_owned(),
        labels: sandbox.labels.into_iter().collect(),
        exit_code: sandbox.exit_code,
        resource_version: BigInt::from(sandbox.resource_version),
    }
}

#[napi(object)]
pub struct NativeExecOutput {
    pub stdout: Buffer,
    pub stderr: Buffer,
    pub exit_code: i32,
}

pub(crate) fn pairs(metadata: &Metadata) -> Vec<Vec<String>> {
    metadata
        .iter()
        .map(|(k, v)| vec![k.to_owned(), v.to_owned()])
        .collect()
}

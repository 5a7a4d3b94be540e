//! Observation lines: how a step's outcome is written for the harness.
//!
//! A step ends in a `result` (what the call returned), an `error` (the SDK
//! error: code, gRPC status, message, retryable, served_by) or a `failure`
//! (the runner could not carry the step out). Byte output is reported as
//! lossy UTF-8 text cut at [`TEXT_LIMIT`] plus its full length in bytes.

use std::io::Write;

use openshell_sdk::Error;
use serde_json::{Map, Value, json};
use tokio::time::error::Elapsed;

/// Longest text a field reports; `<field>_bytes` always has the full length.
pub const TEXT_LIMIT: usize = 4096;

/// Why a step produced no result.
pub enum StepError {
    /// The SDK call failed: an observation, judged against `expect.error`.
    Sdk(Error),
    /// The runner could not carry the step out.
    Failure(anyhow::Error),
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Sdk(e)
    }
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> Self {
        StepError::Failure(e)
    }
}

pub type StepResult = Result<Value, StepError>;

/// One line on stdout, flushed so a crash loses no earlier step.
pub fn emit(line: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The outcome key (`result`, `error` or `failure`) and its value.
pub fn outcome(outcome: Result<StepResult, Elapsed>) -> (&'static str, Value) {
    match outcome {
        Err(_) => ("failure", json!("timed out after 120 s")),
        Ok(Ok(result)) => ("result", result),
        Ok(Err(StepError::Sdk(err))) => ("error", error(&err)),
        Ok(Err(StepError::Failure(e))) => ("failure", json!(format!("{e:#}"))),
    }
}

fn error(err: &Error) -> Value {
    json!({
        "code": err.code(),
        "grpc_status": err.grpc_code() as i32,
        "message": err.to_string(),
        "retryable": err.retryable(),
        "served_by": err.served_by(),
    })
}

/// Adds `<field>` (text) and `<field>_bytes` for a byte output.
pub fn text(into: &mut Map<String, Value>, field: &str, bytes: &[u8]) {
    let cut = &bytes[..bytes.len().min(TEXT_LIMIT)];
    into.insert(field.into(), json!(String::from_utf8_lossy(cut)));
    into.insert(format!("{field}_bytes"), json!(bytes.len()));
}

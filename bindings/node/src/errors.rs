//! Core errors and panics as rejections the TypeScript layer can read.
//!
//! napi's own error carries a coarse `Status`, so the core's error crosses
//! as a rejection whose message is a marker followed by JSON:
//! `{"code","message","grpcStatus","retryable","servedBy","metadata","logs"}`.
//! `@openshell/sdk` turns every such rejection into an `OpenShellError`
//! (with `code`, `grpcStatus`, `message`, `servedBy`; a `cluster` error's
//! `ClusterError` also `logs`, the directory a local cluster's logs were
//! kept in) before user code sees it; nothing else reads the marker. The JSON carries the core's message,
//! which never contains a token (the core scrubs them).

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use napi::Status;

/// Prefix of an encoded core error (a NUL cannot start a human message).
pub const MARKER: &str = "\u{0}openshell-error:";

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The napi error for a core error.
pub fn to_napi(err: &openshell_sdk::Error) -> napi::Error {
    let metadata = err
        .metadata()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("[{},{}]", escape(k), escape(v)))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let served_by = err.served_by().map(escape).unwrap_or_else(|| "null".into());
    let logs = err
        .logs()
        .map(|dir| escape(&dir.display().to_string()))
        .unwrap_or_else(|| "null".into());
    let json = format!(
        "{{\"code\":{},\"message\":{},\"grpcStatus\":{},\"retryable\":{},\"servedBy\":{},\"metadata\":[{}],\"logs\":{}}}",
        escape(err.code()),
        escape(&err.message()),
        err.grpc_code() as i32,
        err.retryable(),
        served_by,
        metadata,
        logs,
    );
    napi::Error::new(Status::GenericFailure, format!("{MARKER}{json}"))
}

/// An `invalid_config` error raised before any I/O.
pub fn invalid(message: impl Into<String>) -> napi::Error {
    to_napi(&openshell_sdk::Error::invalid_config(message))
}

/// A panic inside the binding or the core, as a `panic` error (gRPC
/// INTERNAL): the process keeps running and the caller gets a rejection.
pub fn panic_error(payload: Box<dyn std::any::Any + Send>) -> napi::Error {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned());
    let json = format!(
        "{{\"code\":\"panic\",\"message\":{},\"grpcStatus\":13,\"retryable\":false,\"servedBy\":null,\"metadata\":[]}}",
        escape(&format!("the native addon panicked: {what}"))
    );
    napi::Error::new(Status::GenericFailure, format!("{MARKER}{json}"))
}

/// Runs a core future: a core error becomes [`to_napi`], a panic becomes
/// [`panic_error`] (no unwind reaches napi or Node).
pub async fn guard<T, F>(fut: F) -> napi::Result<T>
where
    F: Future<Output = Result<T, openshell_sdk::Error>>,
{
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(to_napi(&err)),
        Err(payload) => Err(panic_error(payload)),
    }
}

/// Like [`guard`] for a future that already yields napi errors.
pub async fn guard_napi<T, F>(fut: F) -> napi::Result<T>
where
    F: Future<Output = napi::Result<T>>,
{
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(out) => out,
        Err(payload) => Err(panic_error(payload)),
    }
}

/// Runs a synchronous export body with panics caught.
pub fn guard_sync<T>(f: impl FnOnce() -> napi::Result<T>) -> napi::Result<T> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(panic_error(p)))
}

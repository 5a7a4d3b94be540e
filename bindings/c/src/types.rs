//! The plain values of the ABI: byte views, owned bytes, errors, cancel
//! tokens, status codes, and the runtime.

use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;

use openshell_sdk::{CancellationToken, Error};

/// Accepted: the callback of an async export will fire exactly once.
pub const OS_OK: i32 = 0;
/// A stream ended normally (completion status only).
pub const OS_END: i32 = 1;
/// The operation failed; the completion's `error` (or the `OsErrorBox`
/// written by a synchronous export) says why.
pub const OS_ERROR: i32 = 2;
/// Rejected before any work: a null handle, pointer or callback.
pub const OS_INVALID: i32 = 3;
/// A panic was caught inside the library.
pub const OS_PANIC: i32 = 4;

/// A borrowed byte view (pointer + length, not NUL-terminated).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OsBytes {
    pub ptr: *const u8,
    pub len: usize,
}

impl OsBytes {
    pub(crate) fn of(bytes: &[u8]) -> Self {
        Self {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    pub(crate) fn empty() -> Self {
        Self {
            ptr: std::ptr::null(),
            len: 0,
        }
    }

    /// The bytes, copied (empty for a null pointer or zero length).
    pub(crate) unsafe fn to_vec(self) -> Vec<u8> {
        if self.ptr.is_null() || self.len == 0 {
            return Vec::new();
        }
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec()
    }

    /// The bytes as UTF-8, copied.
    pub(crate) unsafe fn to_string(self, what: &str) -> Result<String, Error> {
        String::from_utf8(unsafe { self.to_vec() })
            .map_err(|_| Error::invalid_config(format!("{what} is not valid UTF-8")))
    }

    /// `None` for an empty value.
    pub(crate) unsafe fn to_opt_string(self, what: &str) -> Result<Option<String>, Error> {
        let s = unsafe { self.to_string(what) }?;
        Ok(if s.is_empty() { None } else { Some(s) })
    }
}

/// Bytes owned by the caller; free with [`openshell_bytes_free`].
#[repr(C)]
pub struct OsOwnedBytes {
    pub ptr: *mut u8,
    pub len: usize,
    pub cap: usize,
}

impl OsOwnedBytes {
    pub(crate) fn from_vec(bytes: Vec<u8>) -> Self {
        let mut bytes = std::mem::ManuallyDrop::new(bytes);
        Self {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
            cap: bytes.capacity(),
        }
    }
}

/// Frees bytes returned by the library (a zeroed value is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_bytes_free(bytes: OsOwnedBytes) {
    let _ = std::panic::catch_unwind(|| {
        if !bytes.ptr.is_null() {
            drop(unsafe { Vec::from_raw_parts(bytes.ptr, bytes.len, bytes.cap) });
        }
    });
}

/// A view of an error, borrowed from a completion or an `OsErrorBox`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OsError {
    /// Stable string code: `not_found`, `invalid_config`, `cancelled`, ...
    pub code: OsBytes,
    /// Human message (never a token or an environment value).
    pub message: OsBytes,
    /// Replica that produced the error, when known (empty otherwise).
    pub served_by: OsBytes,
    /// gRPC status code (0-16).
    pub grpc_status: i32,
    /// Whether the same call may succeed if retried later.
    pub retryable: bool,
    /// Code `cluster`: the directory with the local cluster's logs, kept
    /// for reading (empty otherwise).
    pub logs: OsBytes,
}

/// An error owned by the library's side of a completion or an `OsErrorBox`.
#[derive(Clone, Debug)]
pub(crate) struct ErrorParts {
    pub code: String,
    pub message: String,
    pub served_by: String,
    pub grpc_status: i32,
    pub retryable: bool,
    pub logs: String,
}

impl ErrorParts {
    pub(crate) fn of(err: &Error) -> Self {
        Self {
            code: err.code().to_owned(),
            message: err.message(),
            served_by: err.served_by().unwrap_or_default().to_owned(),
            grpc_status: err.grpc_code() as i32,
            retryable: err.retryable(),
            logs: err
                .logs()
                .map(|dir| dir.display().to_string())
                .unwrap_or_default(),
        }
    }

    pub(crate) fn panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_owned());
        Self {
            code: "panic".to_owned(),
            message: format!("the OpenShell library panicked: {what}"),
            served_by: String::new(),
            grpc_status: 13,
            retryable: false,
            logs: String::new(),
        }
    }

    pub(crate) fn view(&self) -> OsError {
        OsError {
            code: OsBytes::of(self.code.as_bytes()),
            message: OsBytes::of(self.message.as_bytes()),
            served_by: OsBytes::of(self.served_by.as_bytes()),
            grpc_status: self.grpc_status,
            retryable: self.retryable,
            logs: OsBytes::of(self.logs.as_bytes()),
        }
    }

    pub(crate) fn none() -> OsError {
        OsError {
            code: OsBytes::empty(),
            message: OsBytes::empty(),
            served_by: OsBytes::empty(),
            grpc_status: 0,
            retryable: false,
            logs: OsBytes::empty(),
        }
    }
}

/// An error returned by a synchronous export. Read it with
/// [`openshell_error_view`]; free it with [`openshell_error_free`].
pub struct OsErrorBox(pub(crate) ErrorParts);

/// A view of `error`, valid until it is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_error_view(error: *const OsErrorBox) -> OsError {
    match unsafe { error.as_ref() } {
        Some(e) => e.0.view(),
        None => ErrorParts::none(),
    }
}

/// Frees an error returned by a synchronous export (null is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_error_free(error: *mut OsErrorBox) {
    if !error.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(error) })));
    }
}

/// Writes `err` to `out` when `out` is not null.
pub(crate) unsafe fn put_error(out: *mut *mut OsErrorBox, err: ErrorParts) {
    if !out.is_null() {
        unsafe { *out = Box::into_raw(Box::new(OsErrorBox(err))) };
    }
}

/// A per-call cancellation token. Cancel it with [`openshell_cancel_cancel`]
/// (from any thread, any number of times); free it with
/// [`openshell_cancel_free`] once no export will be handed it again (calls
/// that already took it keep their own reference).
pub struct OsCancel(pub(crate) CancellationToken);

/// A new, uncancelled token.
#[unsafe(no_mangle)]
pub extern "C" fn openshell_cancel_new() -> *mut OsCancel {
    std::panic::catch_unwind(|| Box::into_raw(Box::new(OsCancel(CancellationToken::new()))))
        .unwrap_or(std::ptr::null_mut())
}

/// Cancels every call (and stream or forward) that took this token.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_cancel_cancel(token: *const OsCancel) {
    if let Some(t) = unsafe { token.as_ref() } {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| t.0.cancel()));
    }
}

/// Frees a token (null is ignored). Does not cancel it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_cancel_free(token: *mut OsCancel) {
    if !token.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(token) })));
    }
}

/// The library version (a static string, never freed).
#[unsafe(no_mangle)]
pub extern "C" fn openshell_version() -> OsBytes {
    OsBytes::of(env!("CARGO_PKG_VERSION").as_bytes())
}

/// The one runtime of the library: multi-thread, started on first use,
/// never shut down (it lives as long as the process).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("openshell-c")
            .enable_all()
            .build()
            .expect("the OpenShell runtime could not start")
    })
}

/// Runs a synchronous export body; a panic becomes [`OS_PANIC`].
pub(crate) fn guard_sync(f: impl FnOnce() -> i32) -> i32 {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(OS_PANIC)
}

//! The calls of `OpenShellBlockingClient` (sdk-jvm): the client's unary
//! calls run to their end on the calling thread, entered through three plain
//! C functions instead of uniffi's generated call path.
//!
//! Why not uniffi's path: every call it makes carries a JNA `Structure` (the
//! call status, and each `RustBuffer` passed or returned by value), which JNA
//! fills and reads by reflection, and one blocking `getSandbox` takes five
//! such calls (clone the handle, a buffer for the name, one for the optional
//! timeout, the call, freeing the answer). The functions here take and
//! return only integers and a byte array, so JNA's direct mapping passes
//! them without reflection: one call in, one to free the reply.
//!
//! The types stay uniffi's: arguments and answers are written in uniffi's
//! own serialization (`Lift::try_read`, `Lower::write`), so the Kotlin side
//! reads them with the generated `FfiConverter…` objects and an error comes
//! out as the same `OpenShellException` subclass as on the suspend path.
//!
//! Contract (internal to sdk-jvm; nothing else may call these):
//! - `client` is a value from `OpenShellClient::direct_ref` not yet passed to
//!   `openshell_jvm_release`;
//! - `args` points to `args_len` readable bytes (or `args_len` is 0);
//! - `timeout_ms` < 0 means the client's default deadline (`None` on the
//!   suspend path), 0 none;
//! - the reply is `[n: u64 native-endian][status: u8][n bytes]`, status 0 an
//!   answer, 1 an `OpenShellError`, 2 a UTF-8 message of a defect (bad
//!   arguments, a panic); it is freed with `openshell_jvm_reply_free` once.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use uniffi::{Lift, Lower};

use crate::UniFfiTag;
use crate::client::OpenShellClient;
use crate::errors::OpenShellError;

/// The calls, by the number Kotlin passes (`DirectCalls` in sdk-jvm keeps
/// the same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    Health = 0,
    CreateSandbox = 1,
    GetSandbox = 2,
    GetSandboxWithOwner = 3,
    ListSandboxes = 4,
    DeleteSandbox = 5,
    WaitReady = 6,
    WaitDeleted = 7,
    Exec = 8,
}

impl Method {
    fn from_number(n: u32) -> Option<Self> {
        Some(match n {
            0 => Self::Health,
            1 => Self::CreateSandbox,
            2 => Self::GetSandbox,
            3 => Self::GetSandboxWithOwner,
            4 => Self::ListSandboxes,
            5 => Self::DeleteSandbox,
            6 => Self::WaitReady,
            7 => Self::WaitDeleted,
            8 => Self::Exec,
            _ => return None,
        })
    }
}

#[uniffi::export]
impl OpenShellClient {
    /// A strong reference to this client for sdk-jvm's blocking calls; the
    /// client lives at least until the value is passed to
    /// `openshell_jvm_release`. Not for other callers.
    pub fn direct_ref(self: Arc<Self>) -> u64 {
        Arc::into_raw(self) as u64
    }
}

/// Drops a reference taken by `direct_ref`.
///
/// # Safety
/// `client` comes from `direct_ref` and is released once, after every call
/// made with it has returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_jvm_release(client: u64) {
    if client != 0 {
        // SAFETY: the caller hands back a pointer from `Arc::into_raw`, once.
        drop(unsafe { Arc::from_raw(client as *const OpenShellClient) });
    }
}

/// Runs call `method` on the calling thread; see the module's contract.
///
/// # Safety
/// As in the module's contract: a live `client`, `args_len` readable bytes
/// at `args`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_jvm_call(
    client: u64,
    method: u32,
    args: *const u8,
    args_len: usize,
    timeout_ms: i64,
) -> *mut u8 {
    let args: &[u8] = if args_len == 0 || args.is_null() {
        &[]
    } else {
        // SAFETY: the caller passes `args_len` readable bytes.
        unsafe { std::slice::from_raw_parts(args, args_len) }
    };
    // SAFETY: a live reference from `direct_ref`; borrowed for this call.
    let client = unsafe { &*(client as *const OpenShellClient) };
    let timeout_ms = u64::try_from(timeout_ms).ok();
    let reply = catch_unwind(AssertUnwindSafe(|| {
        dispatch(client, method, args, timeout_ms)
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Reply::Defect(format!("the core panicked: {what}"))
    });
    reply.into_raw()
}

/// Frees a reply of `openshell_jvm_call`.
///
/// # Safety
/// `reply` comes from `openshell_jvm_call` and is freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_jvm_reply_free(reply: *mut u8) {
    if reply.is_null() {
        return;
    }
    // SAFETY: the reply starts with its payload length, and was allocated as
    // a boxed slice of header + payload bytes (`Reply::into_raw`).
    unsafe {
        let n = std::ptr::read_unaligned(reply as *const u64) as usize;
        let slice = std::ptr::slice_from_raw_parts_mut(reply, HEADER + n);
        drop(Box::from_raw(slice));
    }
}

/// Bytes before a reply's payload: its length, then its status.
const HEADER: usize = 9;

enum Reply {
    Answer(Vec<u8>),
    Error(Vec<u8>),
    Defect(String),
}

impl Reply {
    fn of<T: Lower<UniFfiTag>>(result: Result<T, OpenShellError>) -> Self {
        match result {
            Ok(value) => {
                let mut out = Vec::new();
                T::write(value, &mut out);
                Reply::Answer(out)
            }
            Err(err) => Reply::error(err),
        }
    }

    /// An answer of `()`: no bytes.
    fn of_unit(result: Result<(), OpenShellError>) -> Self {
        result.map_or_else(Reply::error, |()| Reply::Answer(Vec::new()))
    }

    fn error(err: OpenShellError) -> Self {
        let mut out = Vec::new();
        <OpenShellError as Lower<UniFfiTag>>::write(err, &mut out);
        Reply::Error(out)
    }

    fn into_raw(self) -> *mut u8 {
        let (status, payload) = match self {
            Reply::Answer(bytes) => (0u8, bytes),
            Reply::Error(bytes) => (1, bytes),
            Reply::Defect(message) => (2, message.into_bytes()),
        };
        let mut buf = Vec::with_capacity(HEADER + payload.len());
        buf.extend_from_slice(&(payload.len() as u64).to_ne_bytes());
        buf.push(status);
        buf.extend_from_slice(&payload);
        Box::into_raw(buf.into_boxed_slice()) as *mut u8
    }
}

/// Reads one argument of type `T` that must fill `args` exactly.
fn only<T: Lift<UniFfiTag>>(args: &[u8]) -> Result<T, String> {
    let mut rest = args;
    let value = T::try_read(&mut rest).map_err(|e| format!("bad arguments: {e}"))?;
    if !rest.is_empty() {
        return Err(format!("bad arguments: {} bytes left over", rest.len()));
    }
    Ok(value)
}

fn dispatch(client: &OpenShellClient, method: u32, args: &[u8], timeout: Option<u64>) -> Reply {
    let Some(method) = Method::from_number(method) else {
        return Reply::Defect(format!("no call numbered {method}"));
    };
    // Each call's argument type comes from the core method it is passed to.
    let run = || -> Result<Reply, String> {
        let c = client;
        Ok(match method {
            Method::Health if args.is_empty() => Reply::of(block_on(c.health(timeout))),
            Method::Health => return Err(format!("bad arguments: {} bytes for none", args.len())),
            Method::CreateSandbox => Reply::of(block_on(c.create_sandbox(only(args)?, timeout))),
            Method::GetSandbox => Reply::of(block_on(c.get_sandbox(only(args)?, timeout))),
            Method::GetSandboxWithOwner => {
                Reply::of(block_on(c.get_sandbox_with_owner(only(args)?, timeout)))
            }
            Method::ListSandboxes => Reply::of(block_on(c.list_sandboxes(only(args)?, timeout))),
            Method::DeleteSandbox => Reply::of(block_on(c.delete_sandbox(only(args)?, timeout))),
            Method::WaitReady => Reply::of(block_on(c.wait_ready(only(args)?, timeout))),
            Method::WaitDeleted => Reply::of_unit(block_on(c.wait_deleted(only(args)?, timeout))),
            Method::Exec => Reply::of(block_on(c.exec(only(args)?, timeout))),
        })
    };
    run().unwrap_or_else(Reply::Defect)
}

/// Runs `fut` to its end on the calling thread, inside the tokio context
/// every async export uses (async-compat's runtime). On a runtime worker (a
/// JVM callback that calls back in), the worker first hands its other tasks
/// away (`block_in_place`), so they keep running.
fn block_on<F: Future>(fut: F) -> F::Output {
    tokio::task::block_in_place(|| futures::executor::block_on(async_compat::Compat::new(fut)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(raw: *mut u8) -> (u8, Vec<u8>) {
        // SAFETY: a reply just made by `into_raw`, freed below.
        let out = unsafe {
            let n = std::ptr::read_unaligned(raw as *const u64) as usize;
            (
                *raw.add(8),
                std::slice::from_raw_parts(raw.add(HEADER), n).to_vec(),
            )
        };
        unsafe { openshell_jvm_reply_free(raw) };
        out
    }

    #[test]
    fn a_reply_carries_its_status_and_payload() {
        assert_eq!(
            parts(Reply::Answer(vec![1, 2, 3]).into_raw()),
            (0, vec![1, 2, 3])
        );
        assert_eq!(parts(Reply::Error(Vec::new()).into_raw()), (1, Vec::new()));
        let (status, text) = parts(Reply::Defect("no call numbered 9".into()).into_raw());
        assert_eq!(
            (status, String::from_utf8(text).unwrap().as_str()),
            (2, "no call numbered 9")
        );
    }

    #[test]
    fn arguments_must_be_exactly_one_value() {
        let mut buf = Vec::new();
        <String as Lower<UniFfiTag>>::write("sb-1".to_owned(), &mut buf);
        assert_eq!(only::<String>(&buf).unwrap(), "sb-1");
        buf.push(0);
        assert!(
            only::<String>(&buf)
                .unwrap_err()
                .contains("1 bytes left over")
        );
        assert!(
            only::<String>(&[0, 0])
                .unwrap_err()
                .starts_with("bad arguments")
        );
    }

    #[test]
    fn every_number_names_its_method() {
        for n in 0..9 {
            assert_eq!(Method::from_number(n).map(|m| m as u32), Some(n));
        }
        assert_eq!(Method::from_number(9), None);
    }
}

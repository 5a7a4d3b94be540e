//! The calls of `OpenShellBlockingClient` (sdk-jvm): the client's unary
//! calls run to their end on the calling thread, entered through plain C
//! functions (call, free the reply, cancel, forget a cancel, release the
//! client) instead of uniffi's generated call path.
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
//! - `call_id` is unique among the calls of the process; while the call
//!   runs, `openshell_jvm_cancel(call_id)` from another thread (the JVM's
//!   interrupt of the calling one) ends it `cancelled`; a cancel that comes
//!   first ends it before it starts, and one that may have come after it
//!   ended is cleared with `openshell_jvm_forget(call_id)`;
//! - the reply is `[n: u64 native-endian][status: u8][n bytes]`, status 0 an
//!   answer, 1 an `OpenShellError`, 2 a UTF-8 message of a defect (bad
//!   arguments, a panic); it is freed with `openshell_jvm_reply_free` once.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use openshell_sdk::CancellationToken;

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

/// The calls that can be cancelled, by call id: a running call's token, or
/// a cancel that came before its call.
static CALLS: LazyLock<Mutex<HashMap<u64, Slot>>> = LazyLock::new(Default::default);

enum Slot {
    Running(CancellationToken),
    CancelledFirst,
}

fn calls() -> MutexGuard<'static, HashMap<u64, Slot>> {
    // Every change under the lock is one insert or removal, so a panic
    // elsewhere cannot leave the map half-changed: go on with it.
    CALLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Ends call `call_id` `cancelled`, or before it starts if it has not.
#[unsafe(no_mangle)]
pub extern "C" fn openshell_jvm_cancel(call_id: u64) {
    match calls().entry(call_id) {
        Entry::Occupied(slot) => {
            if let Slot::Running(token) = slot.get() {
                token.cancel();
            }
        }
        Entry::Vacant(slot) => {
            slot.insert(Slot::CancelledFirst);
        }
    }
}

/// Forgets a cancel of `call_id` that may have come after its call ended.
#[unsafe(no_mangle)]
pub extern "C" fn openshell_jvm_forget(call_id: u64) {
    let mut calls = calls();
    if let Some(Slot::CancelledFirst) = calls.get(&call_id) {
        calls.remove(&call_id);
    }
}

/// Registers call `call_id` as running: its token, or the answer it ends
/// with at once (cancelled first, or an id in use).
fn register(call_id: u64) -> Result<CancellationToken, Reply> {
    let mut calls = calls();
    match calls.entry(call_id) {
        Entry::Vacant(slot) => {
            let token = CancellationToken::new();
            slot.insert(Slot::Running(token.clone()));
            Ok(token)
        }
        Entry::Occupied(slot) if matches!(slot.get(), Slot::CancelledFirst) => {
            slot.remove();
            Err(Reply::error(openshell_sdk::Error::Cancelled.into()))
        }
        Entry::Occupied(_) => Err(Reply::Defect(format!("call id {call_id} is in use"))),
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
    call_id: u64,
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
    let cancel = match register(call_id) {
        Ok(token) => token,
        Err(reply) => return reply.into_raw(),
    };
    let call = Call { client, cancel };
    let reply = catch_unwind(AssertUnwindSafe(|| {
        dispatch(&call, method, args, timeout_ms)
    }))
    .unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Reply::Defect(format!("the core panicked: {what}"))
    });
    calls().remove(&call_id);
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

/// A running call: its client and its cancel.
struct Call<'a> {
    client: &'a OpenShellClient,
    cancel: CancellationToken,
}

impl Call<'_> {
    /// Runs `fut` to its end on the calling thread, or until the call is
    /// cancelled (which drops `fut`: the RPC is reset, an exec's process
    /// killed).
    fn block_on<T>(
        &self,
        fut: impl Future<Output = Result<T, OpenShellError>>,
    ) -> Result<T, OpenShellError> {
        block_on(async {
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => Err(openshell_sdk::Error::Cancelled.into()),
                out = fut => out,
            }
        })
    }
}

fn dispatch(call: &Call<'_>, method: u32, args: &[u8], timeout: Option<u64>) -> Reply {
    let Some(method) = Method::from_number(method) else {
        return Reply::Defect(format!("no call numbered {method}"));
    };
    // Each call's argument type comes from the core method it is passed to.
    let run = || -> Result<Reply, String> {
        let c = call.client;
        Ok(match method {
            Method::Health if args.is_empty() => Reply::of(call.block_on(c.health(timeout))),
            Method::Health => return Err(format!("bad arguments: {} bytes for none", args.len())),
            Method::CreateSandbox => {
                Reply::of(call.block_on(c.create_sandbox(only(args)?, timeout)))
            }
            Method::GetSandbox => Reply::of(call.block_on(c.get_sandbox(only(args)?, timeout))),
            Method::GetSandboxWithOwner => {
                Reply::of(call.block_on(c.get_sandbox_with_owner(only(args)?, timeout)))
            }
            Method::ListSandboxes => {
                Reply::of(call.block_on(c.list_sandboxes(only(args)?, timeout)))
            }
            Method::DeleteSandbox => {
                Reply::of(call.block_on(c.delete_sandbox(only(args)?, timeout)))
            }
            Method::WaitReady => Reply::of(call.block_on(c.wait_ready(only(args)?, timeout))),
            Method::WaitDeleted => {
                Reply::of_unit(call.block_on(c.wait_deleted(only(args)?, timeout)))
            }
            Method::Exec => Reply::of(call.block_on(c.exec(only(args)?, timeout))),
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
    fn a_cancel_reaches_its_call_whenever_it_comes() {
        // Ids of this test only (others run in parallel on the same map).
        let (during, first, late, twice) =
            (1u64 << 40, (1u64 << 40) + 1, (1 << 40) + 2, (1 << 40) + 3);

        let token = register(during).ok().unwrap();
        openshell_jvm_cancel(during);
        assert!(token.is_cancelled(), "a cancel while the call runs ends it");
        calls().remove(&during);

        openshell_jvm_cancel(first);
        let (status, _) = parts(register(first).err().unwrap().into_raw());
        assert_eq!(
            status, 1,
            "a cancel that came first ends the call before it starts"
        );
        assert!(!calls().contains_key(&first), "and is used up");

        register(late).ok().unwrap();
        calls().remove(&late);
        openshell_jvm_cancel(late);
        assert!(calls().contains_key(&late));
        openshell_jvm_forget(late);
        assert!(!calls().contains_key(&late), "a late cancel is forgotten");

        let _running = register(twice).ok().unwrap();
        let (status, text) = parts(register(twice).err().unwrap().into_raw());
        assert_eq!(
            (status, String::from_utf8(text).unwrap()),
            (2, format!("call id {twice} is in use"))
        );
        openshell_jvm_forget(twice);
        assert!(
            calls().contains_key(&twice),
            "forget leaves a running call alone"
        );
        calls().remove(&twice);
    }

    #[test]
    fn every_number_names_its_method() {
        for n in 0..9 {
            assert_eq!(Method::from_number(n).map(|m| m as u32), Some(n));
        }
        assert_eq!(Method::from_number(9), None);
    }
}

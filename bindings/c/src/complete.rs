//! Completions: how an async export reports back, exactly once.

use std::ffi::c_void;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use openshell_sdk::Error;

use crate::types::{
    ErrorParts, OS_END, OS_ERROR, OS_INVALID, OS_OK, OS_PANIC, OsBytes, OsError, runtime,
};

/// What an async export reports. Borrowed for the duration of the callback.
#[repr(C)]
pub struct OsCompletion {
    /// [`OS_OK`], [`OS_END`] (a stream ended) or [`OS_ERROR`].
    pub status: i32,
    /// The response message (encoded protobuf; see each export).
    pub value: OsBytes,
    /// An owned `OsStream`, `OsForward` or `OsLocalCluster` for the exports
    /// that make one, otherwise null.
    pub handle: *mut c_void,
    /// The replica that answered a raw unary call, when known.
    pub served_by: OsBytes,
    /// Response metadata of a raw unary call: `key \0 value \0` pairs.
    pub metadata: OsBytes,
    /// Set when `status` is [`OS_ERROR`].
    pub error: OsError,
}

/// The callback of an async export: `user_data` is the caller's value,
/// passed back untouched.
pub type OsCallback =
    Option<unsafe extern "C" fn(user_data: usize, completion: *const OsCompletion)>;

/// What a finished operation hands to the callback.
pub(crate) enum Outcome {
    /// A response message.
    Value(Vec<u8>),
    /// A response message, the replica that answered and the response
    /// metadata (`key \0 value \0` pairs).
    Answer(Vec<u8>, String, Vec<u8>),
    /// A new handle (an `OsStream` or `OsForward` as a raw pointer).
    Handle(usize),
    /// A new handle and a value that describes it (a transfer stream and
    /// its path).
    HandleValue(usize, Vec<u8>),
    /// The stream ended.
    End,
}

/// Fires the callback exactly once: by [`Completer::finish`], or on drop
/// (the task was dropped before it finished) with `cancelled`.
pub(crate) struct Completer {
    callback: unsafe extern "C" fn(usize, *const OsCompletion),
    user_data: usize,
    fired: bool,
}

impl Completer {
    pub(crate) fn new(callback: OsCallback, user_data: usize) -> Option<Self> {
        callback.map(|callback| Self {
            callback,
            user_data,
            fired: false,
        })
    }

    fn fire(&mut self, completion: &OsCompletion) {
        if std::mem::replace(&mut self.fired, true) {
            return;
        }
        // A callback must not unwind; if it does, the process keeps the
        // completion as fired rather than firing it twice.
        let callback = self.callback;
        let user_data = self.user_data;
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| unsafe {
            callback(user_data, completion)
        }));
    }

    pub(crate) fn finish(mut self, result: Result<Outcome, ErrorParts>) {
        let mut completion = OsCompletion {
            status: OS_OK,
            value: OsBytes::empty(),
            handle: std::ptr::null_mut(),
            served_by: OsBytes::empty(),
            metadata: OsBytes::empty(),
            error: ErrorParts::none(),
        };
        match &result {
            Ok(Outcome::Value(bytes)) => completion.value = OsBytes::of(bytes),
            Ok(Outcome::Answer(bytes, served_by, metadata)) => {
                completion.value = OsBytes::of(bytes);
                completion.served_by = OsBytes::of(served_by.as_bytes());
                completion.metadata = OsBytes::of(metadata);
            }
            Ok(Outcome::Handle(ptr)) => completion.handle = *ptr as *mut c_void,
            Ok(Outcome::HandleValue(ptr, bytes)) => {
                completion.handle = *ptr as *mut c_void;
                completion.value = OsBytes::of(bytes);
            }
            Ok(Outcome::End) => completion.status = OS_END,
            Err(parts) => {
                completion.status = OS_ERROR;
                completion.error = parts.view();
            }
        }
        self.fire(&completion);
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        if !self.fired {
            let parts = ErrorParts::of(&Error::Cancelled);
            let completion = OsCompletion {
                status: OS_ERROR,
                value: OsBytes::empty(),
                handle: std::ptr::null_mut(),
                served_by: OsBytes::empty(),
                metadata: OsBytes::empty(),
                error: parts.view(),
            };
            self.fire(&completion);
        }
    }
}

/// What a failed operation reports: a core error, or an error the library
/// makes itself (a refusal no core error names).
pub(crate) trait Failure {
    fn parts(&self) -> ErrorParts;
}

impl Failure for Error {
    fn parts(&self) -> ErrorParts {
        ErrorParts::of(self)
    }
}

impl Failure for ErrorParts {
    fn parts(&self) -> ErrorParts {
        self.clone()
    }
}

/// Starts an async export: `prepare` reads and copies the arguments on the
/// calling thread and returns the future, which then runs on the runtime
/// and reports its outcome through the callback (a panic inside it becomes
/// error code `panic`).
///
/// Returns [`OS_OK`] when the callback will fire exactly once,
/// [`OS_INVALID`] for a null callback, and [`OS_PANIC`] when preparing
/// panicked: then the callback never fires. The completer (whose drop fires
/// `cancelled`) is made only after everything that can fail before the
/// spawn, so a caller never sees both a completion and [`OS_PANIC`].
pub(crate) fn start<F>(callback: OsCallback, user_data: usize, prepare: impl FnOnce() -> F) -> i32
where
    F: Future<Output = Result<Outcome, Error>> + Send + 'static,
{
    start_any(callback, user_data, prepare)
}

/// [`start`] for a future that fails with an error the library made
/// itself.
pub(crate) fn start_parts<F>(
    callback: OsCallback,
    user_data: usize,
    prepare: impl FnOnce() -> F,
) -> i32
where
    F: Future<Output = Result<Outcome, ErrorParts>> + Send + 'static,
{
    start_any(callback, user_data, prepare)
}

fn start_any<F, E>(callback: OsCallback, user_data: usize, prepare: impl FnOnce() -> F) -> i32
where
    F: Future<Output = Result<Outcome, E>> + Send + 'static,
    E: Failure,
{
    if callback.is_none() {
        return OS_INVALID;
    }
    let prepared = std::panic::catch_unwind(AssertUnwindSafe(|| (prepare(), runtime())));
    let Ok((fut, runtime)) = prepared else {
        return OS_PANIC;
    };
    let Some(completer) = Completer::new(callback, user_data) else {
        return OS_INVALID;
    };
    // Past this point the completer belongs to the task: if spawning
    // unwinds, dropping the task fires `cancelled`, so the call is still
    // accepted (its one completion has fired).
    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| spawn_on(runtime, completer, fut)));
    OS_OK
}

/// Runs `fut` on `runtime` and reports its outcome through `completer`;
/// a panic inside becomes error code `panic`.
fn spawn_on<F, E>(runtime: &tokio::runtime::Runtime, completer: Completer, fut: F)
where
    F: Future<Output = Result<Outcome, E>> + Send + 'static,
    E: Failure,
{
    runtime.spawn(async move {
        let result = match AssertUnwindSafe(fut).catch_unwind().await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(err)) => Err(err.parts()),
            Err(payload) => Err(ErrorParts::panic(payload)),
        };
        completer.finish(result);
    });
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static FIRED: AtomicUsize = AtomicUsize::new(0);
    static CANCELLED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count(_: usize, completion: *const OsCompletion) {
        FIRED.fetch_add(1, Ordering::SeqCst);
        if unsafe { (*completion).status } == OS_ERROR {
            CANCELLED.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_dropped_task_still_completes_once_and_a_panic_becomes_an_error() {
        // Dropped without finishing: the guard fires `cancelled`.
        drop(Completer::new(Some(count), 0).unwrap());
        assert_eq!(FIRED.load(Ordering::SeqCst), 1);
        // Finished: fires once, and not again on drop.
        Completer::new(Some(count), 0)
            .unwrap()
            .finish(Ok(Outcome::End));
        assert_eq!(FIRED.load(Ordering::SeqCst), 2);
        // A panicking future: one completion, with an error.
        let done = std::sync::Arc::new(tokio::sync::Notify::new());
        let status = start(Some(count), 0, || async {
            if FIRED.load(Ordering::SeqCst) < 100 {
                std::panic::resume_unwind(Box::new("deliberate"));
            }
            Ok(Outcome::End)
        });
        assert_eq!(status, OS_OK);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while FIRED.load(Ordering::SeqCst) < 3 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(FIRED.load(Ordering::SeqCst), 3);
        assert_eq!(CANCELLED.load(Ordering::SeqCst), 2);
        drop(done);
    }

    static PREPARE_FIRED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn count_prepare(_: usize, _: *const OsCompletion) {
        PREPARE_FIRED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_panic_before_the_spawn_returns_os_panic_and_never_calls_back() {
        let status = start(Some(count_prepare), 0, || -> std::future::Ready<_> {
            std::panic::resume_unwind(Box::new("deliberate, while copying arguments"))
        });
        assert_eq!(status, OS_PANIC);
        // A callback that fired would make Go delete its handle twice.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(PREPARE_FIRED.load(Ordering::SeqCst), 0);
        assert_eq!(start(None, 0, || async { Ok(Outcome::End) }), OS_INVALID);
    }
}

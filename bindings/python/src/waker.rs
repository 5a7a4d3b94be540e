//! How a Rust result reaches Python: an asyncio future completed through a
//! waker of our own (async API), or the calling thread waiting with the GIL
//! released (sync API).
//!
//! # Async: one waker per event loop
//!
//! A call creates an asyncio future on the running loop and spawns its Rust
//! future on the runtime. When the Rust future finishes, the tokio worker
//! does not take the GIL: it pushes the result on the loop's completion
//! queue and, only when the queue was empty, writes one byte to a socket
//! pair whose read end the loop watches (`loop.add_reader`). The loop wakes,
//! and the reader callback ([`Drain`]), already holding the GIL on the loop's
//! thread, converts every queued result and settles its future directly
//! (`set_result` / `set_exception`; no `call_soon_threadsafe` hop, and
//! completions that arrive together cost one wake-up).
//!
//! One [`LoopWaker`] exists per event loop and process; a thread caches the
//! waker of the loop it runs (checked by identity through a weak reference,
//! and by PID, so a forked child builds its own).
//!
//! Cancellation: the future carries a done callback ([`Canceller`]) that
//! aborts the tokio task, which drops the Rust future and so cancels the RPC.
//! The callback is removed before the future is settled, so a completed call
//! schedules nothing beyond the awaiting task's own wake-up. A result whose
//! future was cancelled in the meantime is dropped. A panic in the Rust future
//! settles the future with `pyo3_runtime.PanicException`.
//!
//! A loop closed with calls in flight never reads their results; nothing is
//! ever called on a closed loop from a tokio thread.
//!
//! # Sync: wait with the GIL released
//!
//! [`block`] drives the Rust future on the calling thread
//! (`Handle::block_on`, the runtime's workers drive I/O and timers) with the
//! GIL released. Every [`SIGNAL_POLL`] it takes the GIL to run pending
//! signal handlers: Ctrl-C raises `KeyboardInterrupt` from the call and drops
//! the Rust future, which cancels the RPC. The result comes back as a
//! [`Ready`] awaitable that completes without suspending, so the sync client
//! runs the same coroutines as the async one, driven to the end in one step
//! with no event loop (`openshell_sdk._blocking`).

use std::cell::RefCell;
use std::future::Future;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::intern;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyWeakrefReference;

use crate::errors::Answer;
use crate::runtime;

/// How often a blocked sync call takes the GIL to run signal handlers.
pub const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// A finished call on its way to Python: converts its result (with the GIL).
type Convert = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

struct Completion {
    future: Py<PyAny>,
    canceller: Py<Canceller>,
    convert: Convert,
}

/// The completion queue of one event loop and the socket pair that wakes it.
pub struct LoopWaker {
    queue: Mutex<Vec<Completion>>,
    /// Written by tokio threads (one byte when the queue was empty).
    wake: UnixStream,
    /// Read by the loop (registered with `add_reader`).
    wakened: UnixStream,
}

impl LoopWaker {
    fn new() -> std::io::Result<Self> {
        let (wake, wakened) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        wakened.set_nonblocking(true)?;
        Ok(Self {
            queue: Mutex::new(Vec::new()),
            wake,
            wakened,
        })
    }

    fn push(&self, completion: Completion) {
        let was_empty = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.push(completion);
            queue.len() == 1
        };
        if was_empty {
            // WouldBlock: the socket is full of wake-ups already.
            let _ = (&self.wake).write(&[1]);
        }
    }

    /// Settles every queued future. Runs on the loop's thread.
    fn drain(&self, py: Python<'_>) {
        // The socket first, then the queue: a push after the take writes a
        // fresh byte, so no completion waits for a wake-up that never comes.
        let mut sink = [0u8; 256];
        loop {
            match (&self.wakened).read(&mut sink) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let completions =
            std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        for completion in completions {
            if let Err(err) = settle(py, completion) {
                err.write_unraisable(py, None);
            }
        }
    }
}

fn settle(py: Python<'_>, completion: Completion) -> PyResult<()> {
    let future = completion.future.bind(py);
    if future.call_method0(intern!(py, "done"))?.is_truthy()? {
        // Cancelled while the result was on its way.
        return Ok(());
    }
    future.call_method1(intern!(py, "remove_done_callback"), (completion.canceller,))?;
    match (completion.convert)(py) {
        Ok(value) => future.call_method1(intern!(py, "set_result"), (value,))?,
        Err(err) => future.call_method1(intern!(py, "set_exception"), (err.into_value(py),))?,
    };
    Ok(())
}

/// The loop's reader callback.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct Drain {
    waker: Arc<LoopWaker>,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        self.waker.drain(py);
    }
}

/// Done callback of a call's future: aborts the tokio task (a cancelled
/// future; a settled one has the callback removed first).
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct Canceller {
    abort: std::sync::OnceLock<tokio::task::AbortHandle>,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, _future: &Bound<'_, PyAny>) {
        if let Some(abort) = self.abort.get() {
            abort.abort();
        }
    }
}

struct Cached {
    pid: u32,
    event_loop: Py<PyAny>,
    /// Whether `event_loop` is a weak reference (else the loop itself).
    weak: bool,
    waker: Arc<LoopWaker>,
}

thread_local! {
    static CACHED: RefCell<Option<Cached>> = const { RefCell::new(None) };
}

static GET_RUNNING_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let get = GET_RUNNING_LOOP.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("asyncio")?.getattr("get_running_loop")?.unbind())
    })?;
    get.bind(py).call0()
}

/// The running loop and its waker (created and registered on first use).
fn loop_waker<'py>(py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Arc<LoopWaker>)> {
    let event_loop = running_loop(py)?;
    let pid = std::process::id();
    let hit = CACHED.with_borrow(|cached| {
        let cached = cached.as_ref()?;
        if cached.pid != pid {
            return None;
        }
        let same = if cached.weak {
            let referent = cached.event_loop.bind(py).call0().ok()?;
            referent.is(&event_loop)
        } else {
            cached.event_loop.bind(py).is(&event_loop)
        };
        same.then(|| Arc::clone(&cached.waker))
    });
    if let Some(waker) = hit {
        return Ok((event_loop, waker));
    }
    let waker = Arc::new(LoopWaker::new().map_err(|e| {
        PyRuntimeError::new_err(format!("creating the event loop's wake-up socket: {e}"))
    })?);
    let drain = Py::new(
        py,
        Drain {
            waker: Arc::clone(&waker),
        },
    )?;
    event_loop.call_method1(
        intern!(py, "add_reader"),
        (waker.wakened.as_raw_fd(), drain),
    )?;
    let (reference, weak) = match PyWeakrefReference::new(&event_loop) {
        Ok(weak) => (weak.into_any().unbind(), true),
        Err(_) => (event_loop.clone().unbind(), false),
    };
    CACHED.with_borrow_mut(|cached| {
        *cached = Some(Cached {
            pid,
            event_loop: reference,
            weak,
            waker: Arc::clone(&waker),
        });
    });
    Ok((event_loop, waker))
}

/// Runs `fut` on the runtime; returns an asyncio future of its result on the
/// running loop (a core error becomes the matching `openshell_sdk.errors`
/// exception). Must be called with a running event loop.
pub fn spawn<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, openshell_sdk::Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let (event_loop, waker) = loop_waker(py)?;
    if runtime::is_shut_down() {
        return Err(crate::errors::to_py(py, &openshell_sdk::Error::Cancelled));
    }
    let future = event_loop.call_method0(intern!(py, "create_future"))?;
    let canceller = Py::new(
        py,
        Canceller {
            abort: std::sync::OnceLock::new(),
        },
    )?;
    let completion_future = future.clone().unbind();
    let completion_canceller = canceller.clone_ref(py);
    let task = runtime::handle().spawn(async move {
        let convert: Convert = match AssertUnwindSafe(fut).catch_unwind().await {
            Ok(out) => Box::new(move |py: Python<'_>| {
                Answer(out).into_pyobject(py).map(|value| value.unbind())
            }),
            Err(panic) => {
                let message = panic_message(&panic);
                Box::new(move |_py: Python<'_>| Err(PanicException::new_err(message)))
            }
        };
        waker.push(Completion {
            future: completion_future,
            canceller: completion_canceller,
            convert,
        });
    });
    let _ = canceller.get().abort.set(task.abort_handle());
    future.call_method1(intern!(py, "add_done_callback"), (canceller,))?;
    Ok(future)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a Rust future panicked".to_owned()
    }
}

/// An awaitable that is already complete: `await` returns its value without
/// suspending (what a blocking native call returns).
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct Ready {
    value: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Ends the iteration at once with the value (`StopIteration(value)`).
    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let value = self
            .value
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| py.None());
        Err(PyStopIteration::new_err((value,)))
    }

    /// The value, for callers that do not `await`.
    fn result(&self, py: Python<'_>) -> Py<PyAny> {
        self.value
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|v| v.clone_ref(py))
            .unwrap_or_else(|| py.None())
    }
}

/// Runs `fut` to completion on this thread with the GIL released (see the
/// module docs) and returns its result as a [`Ready`] awaitable.
pub fn block<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, openshell_sdk::Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    block_ticking(py, fut, |_py| Ok(()))
}

/// [`block`], calling `tick` with the GIL on the calling thread every
/// [`SIGNAL_POLL`] (after the signal handlers) and once more when `fut` has
/// finished. An error from `tick` drops `fut` (cancelling its call) and is
/// raised. File transfers hand a blocking caller their progress this way.
pub fn block_ticking<'py, F, T, K>(
    py: Python<'py>,
    fut: F,
    mut tick: K,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, openshell_sdk::Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
    K: FnMut(Python<'_>) -> PyResult<()> + Send,
{
    if runtime::is_shut_down() {
        return Err(crate::errors::to_py(py, &openshell_sdk::Error::Cancelled));
    }
    let out: PyResult<Result<T, openshell_sdk::Error>> = py.detach(move || {
        let waiting = async move {
            let mut fut = std::pin::pin!(fut);
            let start = tokio::time::Instant::now() + SIGNAL_POLL;
            let mut ticks = tokio::time::interval_at(start, SIGNAL_POLL);
            loop {
                tokio::select! {
                    biased;
                    out = &mut fut => {
                        let ticked = Python::attach(&mut tick);
                        return match (out, ticked) {
                            // The call's own failure wins over the callback's.
                            (Err(err), _) => Ok(Err(err)),
                            (Ok(_), Err(err)) => Err(err),
                            (Ok(value), Ok(())) => Ok(Ok(value)),
                        };
                    }
                    _ = ticks.tick() => Python::attach(|py| {
                        py.check_signals()?;
                        tick(py)
                    })?,
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            // Already inside the runtime (a Python callback on one of its
            // blocking threads calling the sync API): wait without entering
            // it again; its workers drive the I/O.
            Ok(_) => futures::executor::block_on(waiting),
            Err(_) => runtime::handle().block_on(waiting),
        }
    });
    let value = Answer(out?).into_pyobject(py)?.unbind();
    Ok(Bound::new(
        py,
        Ready {
            value: Mutex::new(Some(value)),
        },
    )?
    .into_any())
}

/// [`block`] when `blocking`, else [`spawn`].
pub fn run<'py, F, T>(py: Python<'py>, blocking: bool, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, openshell_sdk::Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    if blocking {
        block(py, fut)
    } else {
        spawn(py, fut)
    }
}

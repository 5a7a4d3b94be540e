//! `openshell_sdk._native`: the Python binding of the OpenShell core client
//! (`openshell-sdk`). The idiomatic API (`AsyncClient`, `Client`, errors,
//! dataclasses, typed raw stubs) is Python code in `sdk-python`; this module
//! is the thin layer under it.
//!
//! # What crosses the boundary
//!
//! - a client handle ([`client::NativeClient`]) built from a configuration
//!   (endpoint, token or a Python token-provider callable, CA PEM, timeouts);
//! - the raw boundary: a unary call (path, request bytes, metadata, timeout)
//!   -> (response bytes, response metadata), and a stream handle (send, recv,
//!   close_send, cancel, response metadata, trailers);
//! - curated operations whose data plane stays in Rust: sandbox lifecycle,
//!   buffered exec (output collected in Rust), streaming exec (events in
//!   batches, and `collect()`: the rest collected in Rust under the same
//!   cap), interactive exec, forward (listener and byte pumps in Rust;
//!   Python holds a handle with the local address, stats and close), file
//!   transfer ([`files`]: paths read and written by the core, chunk streams
//!   for Python's bytes and file objects, progress reports that Python reads
//!   on its own thread), sandbox logs and resuming watches ([`logs`]);
//! - the supervisor side of the session protocol ([`config_session`]): a
//!   `ConfigSession` whose pushed or polled snapshots Python answers one at a
//!   time with an explicit acknowledgement; and its host form
//!   ([`host_session`]): a shared supervisor host's `HostSession`, whose
//!   assigned sandboxes' snapshots Python answers the same way;
//! - the core's local test cluster ([`testing`]): start, fault orders and
//!   stop of a real cluster, for `openshell_sdk.testing`.
//!
//! Protobuf messages cross as `bytes` and are `protobuf` objects in Python.
//!
//! # Ownership
//!
//! - The module owns one tokio runtime per process, built on first use
//!   ([`runtime`]), held so that it can be replaced: a forked child
//!   rebuilds its own.
//!   `atexit` stops it before the interpreter is torn down.
//! - Each Python object owns its core object: `NativeClient` a core
//!   `Client` (a cheap clone of shared state), every handle its stream,
//!   forward or session. Python's garbage collector frees them by dropping
//!   the Rust value; nothing is freed by hand and no raw pointer crosses.
//!   Dropping a handle cancels its RPC (for exec, the gateway kills the
//!   process group) or closes its forward; `cancel()` / `close()` do it
//!   explicitly and are idempotent.
//! - Data crosses by value: `bytes` in are copied into `Bytes`, results are
//!   copied into Python objects. Python never sees Rust memory.
//!
//! # Threading and the GIL
//!
//! Every class is `frozen` and `Send + Sync`: methods may be called from
//! any Python thread. No tokio thread takes the GIL to deliver a result
//! ([`waker`]): an async call's result is queued for its event loop, which
//! converts it and settles the asyncio future on its own thread; a
//! `NativeClient(blocking=True)` (the sync `Client`) drives each call on the
//! calling thread with the GIL released and converts the result there. The
//! few other synchronous calls that wait (building a client) release it
//! first. Callbacks into Python (token
//! providers, config-session acknowledgements) run on blocking threads that
//! take the GIL only for the call, never on a worker.
//!
//! # Cancellation
//!
//! Cancelling the asyncio task that awaits a call drops the Rust future
//! (Ctrl-C does the same to a blocking call), which cancels the RPC (for exec, the gateway then kills the process
//! group). Dropping a handle cancels its stream; `NativeClient.close()`
//! fires the parent token of every call it started, so calls, streams and
//! forwards in flight end with `cancelled`, and so does every later call.
//! A call that fails inside the core (an exec past its output cap) is
//! dropped there and cancelled the same way.

//! # Panics and errors
//!
//! pyo3 turns a panic in an exported function into `PanicException`, and
//! [`waker`] settles the future of a spawned future that panicked with it:
//! no unwind crosses into Python. Core errors become the exception classes
//! of `openshell_sdk.errors` ([`errors`]), with `.code` (the core's string
//! code) and `.grpc_status`.

mod client;
mod config_session;
mod errors;
mod files;
mod handles;
mod host_session;
mod logs;
mod runtime;
mod testing;
mod token;
mod waker;

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `{"pid": ..., "runtime_builds": ...}`: the process and how many runtimes
/// this module has built in it and its ancestors (a forked child that used
/// the module shows one more than its parent).
#[pyfunction]
fn runtime_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (pid, builds) = runtime::info();
    let dict = PyDict::new(py);
    dict.set_item("pid", pid)?;
    dict.set_item("runtime_builds", builds)?;
    Ok(dict)
}

/// Stops the runtime before the interpreter is torn down (registered with
/// `atexit` by `openshell_sdk`): calls still running are cancelled.
#[pyfunction]
fn _shutdown_runtime(py: Python<'_>) {
    runtime::shutdown(py);
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<client::NativeClient>()?;
    m.add_class::<handles::ExecStreamHandle>()?;
    m.add_class::<handles::InteractiveHandle>()?;
    m.add_class::<handles::WatchHandle>()?;
    m.add_class::<handles::NativeForward>()?;
    m.add_class::<handles::RawStreamHandle>()?;
    m.add_class::<files::ProgressChannel>()?;
    m.add_class::<files::UploadSinkHandle>()?;
    m.add_class::<files::DownloadSourceHandle>()?;
    m.add_class::<logs::EventWatchHandle>()?;
    m.add_class::<config_session::NativeConfigSession>()?;
    m.add_class::<host_session::NativeHostSession>()?;
    m.add_class::<testing::NativeLocalCluster>()?;
    m.add_class::<waker::Ready>()?;
    m.add_function(wrap_pyfunction!(runtime_info, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown_runtime, m)?)?;
    Ok(())
}

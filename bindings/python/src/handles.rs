//! Handles of running operations: exec streams (batched events),
//! interactive exec, sandbox watches, forwards and raw streams.
//!
//! Each handle owns its core object; Python holds the handle. Dropping the
//! handle (garbage collection) drops the core object, which cancels its RPC
//! or closes its forward; `cancel()` / `close()` do it explicitly.
//!
//! Exec events cross in batches: `next_batch()` waits for one event, then
//! takes every event that is already there (up to 256 events or 1 MiB of
//! output) without waiting, so a chatty process costs one Python wake-up per
//! batch instead of one per chunk. An event is `(kind, data, exit_code)`
//! with kind 1 = stdout, 2 = stderr, 3 = exit; an empty batch means the
//! stream has ended.
//!
//! Collecting the rest of an exec (`collect()`, Python's `ExecStream.collect`
//! and `InteractiveExec.wait`) happens here, with the core's
//! [`OutputCollector`] under the stream's cap: past it the call fails with
//! `output_limit` and the core stream is dropped, which cancels the command,
//! exactly like buffered exec. Python hands back the events it fetched but
//! has not given out yet, so they count against the cap too.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use openshell_sdk::{
    CancellationToken, Error, ExecEvent, ExecInput, ExecOutput, ExecStream, ForwardHandle,
    Metadata, OutputCollector, RawReceiver, RawSender, SandboxWatch,
};
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::waker::run;

/// Most output bytes one batch carries (more waits for the next call).
const BATCH_BYTES: usize = 1024 * 1024;

/// `(kind, data, exit_code)`: 1 stdout, 2 stderr, 3 exit.
type WireEvent = (u8, Bytes, i32);

/// `(stdout, stderr, exit_code)`, as buffered exec answers.
pub type WireOutput = (Bytes, Bytes, i32);

pub fn wire_output(output: ExecOutput) -> WireOutput {
    (
        Bytes::from(output.stdout),
        Bytes::from(output.stderr),
        output.exit_code,
    )
}

fn event_of((kind, data, exit_code): WireEvent) -> Result<ExecEvent, Error> {
    match kind {
        1 => Ok(ExecEvent::Stdout(data)),
        2 => Ok(ExecEvent::Stderr(data)),
        3 => Ok(ExecEvent::Exit(exit_code)),
        other => Err(Error::invalid_config(format!(
            "exec event kind {other} is not 1, 2 or 3"
        ))),
    }
}

pub struct EventState {
    /// `None` once cancelled: dropping the core stream resets the HTTP/2
    /// stream, which is what makes the gateway kill the process group.
    stream: Option<ExecStream>,
    /// An error that followed events already returned; reported next.
    pending_error: Option<Error>,
    done: bool,
}

impl EventState {
    pub fn new(stream: ExecStream) -> Self {
        Self {
            stream: Some(stream),
            pending_error: None,
            done: false,
        }
    }

    fn cancel(&mut self) {
        self.stream = None;
        if !self.done && self.pending_error.is_none() {
            self.pending_error = Some(Error::Cancelled);
        }
    }

    /// The rest of the stream through the core's collector, under the
    /// stream's cap. `buffered`: events already fetched but not given out.
    /// On any error the core stream is dropped (the command is cancelled).
    async fn collect(&mut self, buffered: Vec<WireEvent>) -> Result<WireOutput, Error> {
        let result = self.collect_rest(buffered).await;
        self.done = true;
        if result.is_err() {
            self.stream = None;
        }
        result.map(wire_output)
    }

    async fn collect_rest(&mut self, buffered: Vec<WireEvent>) -> Result<ExecOutput, Error> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(self.pending_error.take().unwrap_or(Error::Cancelled));
        };
        let mut collector = OutputCollector::new(stream.output_limit());
        for event in buffered {
            if let Some(output) = collector.push(event_of(event)?)? {
                return Ok(output);
            }
        }
        if let Some(err) = self.pending_error.take() {
            return Err(err);
        }
        if self.done {
            return Err(Error::StreamClosed {
                message: "the exec stream has already ended".into(),
            });
        }
        stream.collect_into(collector).await
    }

    async fn next_batch(&mut self, max_events: usize) -> Result<Vec<WireEvent>, Error> {
        if let Some(err) = self.pending_error.take() {
            self.done = true;
            return Err(err);
        }
        if self.done {
            return Ok(Vec::new());
        }
        let Some(stream) = self.stream.as_mut() else {
            self.done = true;
            return Err(Error::Cancelled);
        };
        let mut batch: Vec<WireEvent> = Vec::new();
        let mut bytes = 0;
        // Adds an event; true at the exit event.
        fn push(event: ExecEvent, batch: &mut Vec<WireEvent>, bytes: &mut usize) -> bool {
            match event {
                ExecEvent::Stdout(data) => {
                    *bytes += data.len();
                    batch.push((1, data, 0));
                    false
                }
                ExecEvent::Stderr(data) => {
                    *bytes += data.len();
                    batch.push((2, data, 0));
                    false
                }
                ExecEvent::Exit(code) => {
                    batch.push((3, Bytes::new(), code));
                    true
                }
            }
        }
        let mut ended = match stream.next().await {
            None => true,
            Some(Err(err)) => {
                self.done = true;
                return Err(err);
            }
            Some(Ok(event)) => push(event, &mut batch, &mut bytes),
        };
        while !ended && batch.len() < max_events.max(1) && bytes < BATCH_BYTES {
            match stream.next().now_or_never() {
                Some(Some(Ok(event))) => ended = push(event, &mut batch, &mut bytes),
                Some(Some(Err(err))) => {
                    self.pending_error = Some(err);
                    break;
                }
                Some(None) => ended = true,
                None => break,
            }
        }
        if ended {
            self.done = true;
        }
        Ok(batch)
    }
}

/// Cancels an exec's call and drops its core stream: the token ends a
/// receive in flight, dropping the stream resets the call on the wire.
/// Cancelling the token alone leaves the response stream open (the core
/// keeps it until the receiver is dropped), so the process would keep running.
fn cancel_events(events: &Arc<tokio::sync::Mutex<EventState>>, token: &CancellationToken) {
    token.cancel();
    match events.try_lock() {
        Ok(mut state) => state.cancel(),
        Err(_) => {
            let events = Arc::clone(events);
            crate::runtime::handle().spawn(async move { events.lock().await.cancel() });
        }
    }
}

/// The events of a streaming exec.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct ExecStreamHandle {
    pub(crate) events: Arc<tokio::sync::Mutex<EventState>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) blocking: bool,
}

#[pymethods]
impl ExecStreamHandle {
    /// The next batch of events; empty once the stream has ended.
    #[pyo3(signature = (max_events = 256))]
    fn next_batch<'py>(&self, py: Python<'py>, max_events: usize) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        run(py, self.blocking, async move {
            events.lock().await.next_batch(max_events).await
        })
    }

    /// `(stdout, stderr, exit_code)` of the rest of the stream, collected by
    /// the core under the stream's cap (`output_limit` past it, and the
    /// command is cancelled). `buffered`: events fetched but not given out.
    #[pyo3(signature = (buffered = Vec::new()))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        buffered: Vec<WireEvent>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        run(py, self.blocking, async move {
            events.lock().await.collect(buffered).await
        })
    }

    /// Cancels the command's stream (the gateway kills the process group).
    fn cancel(&self) {
        cancel_events(&self.events, &self.cancel);
    }
}

/// A running interactive exec.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct InteractiveHandle {
    pub(crate) input: ExecInput,
    pub(crate) events: Arc<tokio::sync::Mutex<EventState>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) blocking: bool,
}

#[pymethods]
impl InteractiveHandle {
    /// Writes to stdin.
    fn write<'py>(&self, py: Python<'py>, data: Bytes) -> PyResult<Bound<'py, PyAny>> {
        let input = self.input.clone();
        run(py, self.blocking, async move { input.write(data).await })
    }

    /// Resizes the terminal.
    fn resize<'py>(&self, py: Python<'py>, cols: u32, rows: u32) -> PyResult<Bound<'py, PyAny>> {
        let input = self.input.clone();
        run(
            py,
            self.blocking,
            async move { input.resize(cols, rows).await },
        )
    }

    /// Closes stdin (EOF; Ctrl-D on a terminal). Idempotent.
    fn close_stdin(&self) {
        self.input.close();
    }

    /// The next batch of events; empty once the stream has ended.
    #[pyo3(signature = (max_events = 256))]
    fn next_batch<'py>(&self, py: Python<'py>, max_events: usize) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        run(py, self.blocking, async move {
            events.lock().await.next_batch(max_events).await
        })
    }

    /// Like `ExecStreamHandle.collect`: the rest of the output under the cap.
    #[pyo3(signature = (buffered = Vec::new()))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        buffered: Vec<WireEvent>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let events = Arc::clone(&self.events);
        run(py, self.blocking, async move {
            events.lock().await.collect(buffered).await
        })
    }

    /// Cancels the command's stream.
    fn cancel(&self) {
        cancel_events(&self.events, &self.cancel);
    }
}

/// Snapshots of one sandbox.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct WatchHandle {
    /// `None` once cancelled.
    pub(crate) watch: Arc<tokio::sync::Mutex<Option<SandboxWatch>>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) blocking: bool,
}

#[pymethods]
impl WatchHandle {
    /// The next encoded `Sandbox`, or `None` when the watch ended.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = Arc::clone(&self.watch);
        run(py, self.blocking, async move {
            let mut guard = watch.lock().await;
            let Some(watch) = guard.as_mut() else {
                return Ok(None);
            };
            match watch.next().await {
                None => Ok(None),
                Some(Ok(sandbox)) => Ok(Some(Bytes::from(sandbox.proto.encode_to_vec()))),
                Some(Err(err)) => Err(err),
            }
        })
    }

    /// Ends the watch.
    fn cancel(&self) {
        self.cancel.cancel();
        match self.watch.try_lock() {
            Ok(mut watch) => drop(watch.take()),
            Err(_) => {
                let watch = Arc::clone(&self.watch);
                crate::runtime::handle().spawn(async move { drop(watch.lock().await.take()) });
            }
        }
    }
}

/// A running forward: the listener and its connections live in Rust.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct NativeForward {
    pub(crate) handle: Arc<ForwardHandle>,
    pub(crate) blocking: bool,
}

#[pymethods]
impl NativeForward {
    /// `(host, port)` the local listener is bound to.
    #[getter]
    fn local_address(&self) -> (String, u16) {
        let addr = self.handle.local_addr();
        (addr.ip().to_string(), addr.port())
    }

    #[getter]
    fn sandbox(&self) -> String {
        self.handle.sandbox().to_owned()
    }

    #[getter]
    fn remote_port(&self) -> u16 {
        self.handle.remote_port()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Counters as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.handle.stats();
        let dict = PyDict::new(py);
        dict.set_item("connections_accepted", s.connections_accepted)?;
        dict.set_item("connections_active", s.connections_active)?;
        dict.set_item("connections_failed", s.connections_failed)?;
        dict.set_item("bytes_in", s.bytes_in)?;
        dict.set_item("bytes_out", s.bytes_out)?;
        Ok(dict)
    }

    /// Stops listening and ends every connection. Idempotent; returns at once.
    fn close(&self) {
        self.handle.close();
    }

    /// Waits until the listener is closed and every connection has ended
    /// (only returns after `close()`).
    fn wait_closed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let handle = Arc::clone(&self.handle);
        run(py, self.blocking, async move {
            handle.closed().await;
            Ok(())
        })
    }
}

/// A raw stream on any method.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct RawStreamHandle {
    pub(crate) sender: RawSender,
    /// `None` once cancelled (dropping the receiver resets the call).
    pub(crate) receiver: Arc<tokio::sync::Mutex<Option<RawReceiver>>>,
    pub(crate) trailers: Arc<Mutex<Option<Metadata>>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) blocking: bool,
}

fn pairs(metadata: &Metadata) -> Vec<(String, String)> {
    metadata
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[pymethods]
impl RawStreamHandle {
    /// Sends one encoded message (the first one starts the call).
    fn send<'py>(&self, py: Python<'py>, message: Bytes) -> PyResult<Bound<'py, PyAny>> {
        let sender = self.sender.clone();
        run(py, self.blocking, async move { sender.send(message).await })
    }

    /// Half-closes the call. Idempotent.
    fn close_send(&self) {
        self.sender.close();
    }

    /// The next encoded message, or `None` when the server ended the stream OK.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let receiver = Arc::clone(&self.receiver);
        let trailers = Arc::clone(&self.trailers);
        run(py, self.blocking, async move {
            let mut guard = receiver.lock().await;
            let receiver = guard.as_mut().ok_or(Error::Cancelled)?;
            let message = receiver.recv().await?;
            if message.is_none() {
                *trailers.lock().unwrap_or_else(|p| p.into_inner()) = receiver.trailers().cloned();
            }
            Ok(message)
        })
    }

    /// Response headers as `(key, value)` pairs; waits for them.
    fn response_metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let receiver = Arc::clone(&self.receiver);
        run(py, self.blocking, async move {
            let mut guard = receiver.lock().await;
            let metadata = guard
                .as_mut()
                .ok_or(Error::Cancelled)?
                .response_metadata()
                .await?;
            Ok(pairs(&metadata))
        })
    }

    /// Trailers once the stream ended OK, else `None`.
    fn trailers(&self) -> Option<Vec<(String, String)>> {
        self.trailers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(pairs)
    }

    /// Cancels the RPC; pending and later receives fail with `cancelled`.
    fn cancel(&self) {
        self.sender.cancel();
        self.cancel.cancel();
        match self.receiver.try_lock() {
            Ok(mut receiver) => drop(receiver.take()),
            Err(_) => {
                let receiver = Arc::clone(&self.receiver);
                crate::runtime::handle().spawn(async move { drop(receiver.lock().await.take()) });
            }
        }
    }
}

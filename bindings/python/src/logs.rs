//! Sandbox logs and the core's resuming watch ([`openshell_sdk::EventWatch`]).
//!
//! A log line crosses as a tuple, its time as integer microseconds since
//! the epoch (exact, so Python prints the same milliseconds as the core).
//! Watch events cross in batches, like exec events: `next_batch()` waits
//! for one event, then takes those already there without waiting. The
//! watch resumes by itself after a broken stream (in the core); Python
//! only sees its events and, at the end, its error (`out_of_range` when
//! the gateway no longer holds what followed the cursor).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use openshell_sdk::{
    CallOptions, CancellationToken, Client, Error, EventWatch, LogLine, LogQuery, WatchEvent,
    WatchOptions,
};
use prost::Message;
use pyo3::prelude::*;

use crate::waker::run;

/// `(time_us, level, source, target, message, fields)`.
pub type WireLogLine = (
    Option<i64>,
    String,
    String,
    String,
    String,
    BTreeMap<String, String>,
);

/// `(cursor, encoded Sandbox or None, log line or None)`.
pub type WireWatchEvent = (String, Option<Bytes>, Option<WireLogLine>);

fn wire_line(line: LogLine) -> WireLogLine {
    let time = line.time.map(|t| match t.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_micros() as i64,
        Err(before) => -(before.duration().as_micros() as i64),
    });
    (
        time,
        line.level,
        line.source,
        line.target,
        line.message,
        line.fields,
    )
}

fn wire_event(event: WatchEvent) -> WireWatchEvent {
    match event {
        WatchEvent::Sandbox { sandbox, cursor } => (
            cursor,
            Some(Bytes::from(sandbox.proto.encode_to_vec())),
            None,
        ),
        WatchEvent::Log { line, cursor } => (cursor, None, Some(wire_line(line))),
    }
}

/// The core's query from what Python passes (`since_us`: microseconds
/// since the epoch).
pub fn log_query(
    tail: Option<u32>,
    since_us: Option<i64>,
    sources: Vec<String>,
    min_level: Option<String>,
) -> LogQuery {
    let mut query = LogQuery::new();
    if let Some(lines) = tail {
        query = query.tail(lines);
    }
    if let Some(us) = since_us {
        query = query.since(UNIX_EPOCH + Duration::from_micros(us.max(0) as u64));
    }
    for source in sources {
        query = query.source(source);
    }
    if let Some(level) = min_level {
        query = query.min_level(level);
    }
    query
}

/// `Sandboxes::logs`: `(lines, buffer_total)`.
pub fn logs<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    name: String,
    query: LogQuery,
    options: CallOptions,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, blocking, async move {
        let logs = client.sandboxes().logs(&name, &query, options).await?;
        let lines: Vec<WireLogLine> = logs.lines.into_iter().map(wire_line).collect();
        Ok((lines, logs.buffer_total))
    })
}

/// What a watch follows, as Python passes it.
pub struct WatchArgs {
    pub status: bool,
    pub logs: Option<LogQuery>,
    pub resume_after: Option<String>,
    pub stop_on_terminal: bool,
}

/// `Sandboxes::events`: a handle; nothing is sent before its first
/// `next_batch()`.
pub fn events(
    client: &Client,
    name: &str,
    args: WatchArgs,
    options: CallOptions,
    cancel: CancellationToken,
    blocking: bool,
) -> EventWatchHandle {
    let mut watch = WatchOptions::new()
        .status(args.status)
        .stop_on_terminal(args.stop_on_terminal);
    if let Some(query) = args.logs {
        watch = watch.logs(query);
    }
    if let Some(cursor) = args.resume_after {
        watch = watch.resume_after(cursor);
    }
    let _entered = crate::runtime::handle().enter();
    let stream = client.sandboxes().events(name, watch, options);
    EventWatchHandle {
        state: Arc::new(tokio::sync::Mutex::new(WatchState {
            watch: Some(stream),
            pending_error: None,
        })),
        resumes: Arc::new(AtomicU32::new(0)),
        cancel,
        blocking,
    }
}

struct WatchState {
    /// `None` once ended or cancelled.
    watch: Option<EventWatch>,
    /// An error that followed events already returned; reported next.
    pending_error: Option<Error>,
}

impl WatchState {
    async fn next_batch(
        &mut self,
        max_events: usize,
        resumes: &AtomicU32,
    ) -> Result<Vec<WireWatchEvent>, Error> {
        if let Some(err) = self.pending_error.take() {
            return Err(err);
        }
        let Some(watch) = self.watch.as_mut() else {
            return Ok(Vec::new());
        };
        let first = watch.next().await;
        resumes.store(watch.resumes(), Ordering::Relaxed);
        let mut batch = match first {
            None => {
                self.watch = None;
                return Ok(Vec::new());
            }
            Some(Err(err)) => {
                self.watch = None;
                return Err(err);
            }
            Some(Ok(event)) => vec![wire_event(event)],
        };
        // A Stream keeps its state between polls: a `next()` that is not
        // ready yet can be dropped.
        while batch.len() < max_events.max(1) {
            match watch.next().now_or_never() {
                Some(Some(Ok(event))) => batch.push(wire_event(event)),
                Some(Some(Err(err))) => {
                    self.pending_error = Some(err);
                    self.watch = None;
                    break;
                }
                Some(None) => {
                    self.watch = None;
                    break;
                }
                None => break,
            }
        }
        if let Some(watch) = self.watch.as_ref() {
            resumes.store(watch.resumes(), Ordering::Relaxed);
        }
        Ok(batch)
    }
}

/// A running watch of one sandbox (status snapshots, log lines or both).
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct EventWatchHandle {
    state: Arc<tokio::sync::Mutex<WatchState>>,
    resumes: Arc<AtomicU32>,
    cancel: CancellationToken,
    blocking: bool,
}

#[pymethods]
impl EventWatchHandle {
    /// The next events (`WireWatchEvent`s); empty once the watch ended.
    #[pyo3(signature = (max_events = 256))]
    fn next_batch<'py>(&self, py: Python<'py>, max_events: usize) -> PyResult<Bound<'py, PyAny>> {
        let state = Arc::clone(&self.state);
        let resumes = Arc::clone(&self.resumes);
        run(py, self.blocking, async move {
            state.lock().await.next_batch(max_events, &resumes).await
        })
    }

    /// How many times the watch opened a new stream after a broken one (as
    /// of the last batch).
    #[getter]
    fn resumes(&self) -> u32 {
        self.resumes.load(Ordering::Relaxed)
    }

    /// Ends the watch: later batches are empty. Idempotent.
    fn cancel(&self) {
        self.cancel.cancel();
        match self.state.try_lock() {
            Ok(mut state) => {
                state.watch = None;
            }
            Err(_) => {
                let state = Arc::clone(&self.state);
                crate::runtime::handle().spawn(async move {
                    state.lock().await.watch = None;
                });
            }
        }
    }
}

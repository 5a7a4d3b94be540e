//! Sandbox logs and watches that resume: the core's `Sandboxes::logs` and
//! `Sandboxes::events` (its [`EventWatch`] reconnects by itself after the
//! last cursor; see `openshell_sdk::logs`).
//!
//! Times cross as milliseconds since the epoch, a line's fields as
//! `[key, value]` pairs in the core's (sorted) order, and each line also as
//! the core's printed form (`text`), so every language prints it alike.
//!
//! Watch events cross in batches like exec events: `nextBatch()` waits for
//! one event, then takes what is already there (up to [`BATCH_EVENTS`])
//! without waiting; an error that follows events of a batch is reported by
//! the next call; an empty batch means the watch ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use futures::{FutureExt, StreamExt};
use napi::bindgen_prelude::PromiseRaw;
use napi::{Env, Result};
use napi_derive::napi;
use openshell_sdk::{
    CancellationToken, Error, EventWatch, LogLine, LogQuery, WatchEvent, WatchOptions,
};

use crate::client::{CancelToken, NativeClient};
use crate::errors::{guard, invalid};
use crate::values::{NativeSandbox, native_sandbox};

const BATCH_EVENTS: usize = 256;

/// Which lines to read (every field optional: everything, the newest 2000).
#[napi(object)]
pub struct NativeLogQuery {
    pub tail: Option<u32>,
    pub since_ms: Option<f64>,
    pub sources: Option<Vec<String>>,
    pub min_level: Option<String>,
}

fn log_query(query: Option<NativeLogQuery>) -> Result<LogQuery> {
    let mut out = LogQuery::new();
    let Some(query) = query else {
        return Ok(out);
    };
    if let Some(tail) = query.tail {
        out = out.tail(tail);
    }
    if let Some(ms) = query.since_ms {
        if !ms.is_finite() || ms < 0.0 {
            return Err(invalid("since must be a valid time at or after 1970"));
        }
        out = out.since(SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64));
    }
    for source in query.sources.unwrap_or_default() {
        out = out.source(source);
    }
    if let Some(level) = query.min_level {
        out = out.min_level(level);
    }
    Ok(out)
}

#[napi(object)]
pub struct NativeLogLine {
    /// Milliseconds since the epoch (the writer's clock), when known.
    pub time_ms: Option<f64>,
    pub level: String,
    pub source: String,
    pub target: String,
    pub message: String,
    pub fields: Vec<Vec<String>>,
    /// The core's printed form of the line.
    pub text: String,
}

fn native_line(line: LogLine) -> NativeLogLine {
    let text = line.to_string();
    NativeLogLine {
        time_ms: line.time.map(|t| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as f64
        }),
        fields: line.fields.into_iter().map(|(k, v)| vec![k, v]).collect(),
        level: line.level,
        source: line.source,
        target: line.target,
        message: line.message,
        text,
    }
}

#[napi(object)]
pub struct NativeLogs {
    pub lines: Vec<NativeLogLine>,
    pub buffer_total: u32,
}

/// What a watch follows (the core's defaults when absent: status only).
#[napi(object)]
pub struct NativeWatchOptions {
    pub status: Option<bool>,
    pub logs: Option<bool>,
    pub query: Option<NativeLogQuery>,
    pub resume_after: Option<String>,
    pub stop_on_terminal: Option<bool>,
}

fn watch_options(options: NativeWatchOptions) -> Result<WatchOptions> {
    let mut out = WatchOptions::new();
    if let Some(status) = options.status {
        out = out.status(status);
    }
    if options.logs.unwrap_or(false) {
        out = out.logs(log_query(options.query)?);
    } else if options.query.is_some() {
        return Err(invalid("log filters need logs: true"));
    }
    if let Some(cursor) = options.resume_after {
        out = out.resume_after(cursor);
    }
    if let Some(stop) = options.stop_on_terminal {
        out = out.stop_on_terminal(stop);
    }
    Ok(out)
}

/// One watch event: `kind` is `sandbox` (with `sandbox`) or `log` (with
/// `line`).
#[napi(object)]
pub struct NativeWatchEvent {
    pub kind: String,
    pub sandbox: Option<NativeSandbox>,
    pub line: Option<NativeLogLine>,
    pub cursor: String,
}

fn native_event(event: WatchEvent) -> NativeWatchEvent {
    match event {
        WatchEvent::Sandbox { sandbox, cursor } => NativeWatchEvent {
            kind: "sandbox".to_owned(),
            sandbox: Some(native_sandbox(sandbox)),
            line: None,
            cursor,
        },
        WatchEvent::Log { line, cursor } => NativeWatchEvent {
            kind: "log".to_owned(),
            sandbox: None,
            line: Some(native_line(line)),
            cursor,
        },
    }
}

#[napi]
impl NativeClient {
    /// The sandbox's recorded log lines, oldest first.
    #[napi]
    pub fn sandbox_logs<'e>(
        &self,
        env: &'e Env,
        name: String,
        query: Option<NativeLogQuery>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeLogs>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let query = log_query(query)?;
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandboxes = client.sandboxes();
            let logs = call.run(sandboxes.logs(&name, &query, options)).await?;
            Ok(NativeLogs {
                lines: logs.lines.into_iter().map(native_line).collect(),
                buffer_total: logs.buffer_total,
            })
        }))
    }

    /// Follows a sandbox (status, logs or both), resuming after a break.
    /// Nothing is sent until the first `nextBatch()`.
    #[napi]
    pub fn sandbox_events<'e>(
        &self,
        env: &'e Env,
        name: String,
        options: NativeWatchOptions,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeEventWatch>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let watch = watch_options(options)?;
        env.spawn_future(guard(async move {
            let events = client
                .sandboxes()
                .events(&name, watch, call.options.clone());
            Ok::<_, Error>(NativeEventWatch {
                resumes: Arc::new(AtomicU32::new(0)),
                state: Arc::new(tokio::sync::Mutex::new(WatchState {
                    events: Some(events),
                    pending_error: None,
                    done: false,
                })),
                cancel: call.token.clone(),
            })
        }))
    }
}

struct WatchState {
    /// `None` once cancelled (dropping the core watch ends its stream).
    events: Option<EventWatch>,
    /// An error that followed events already handed out; reported next.
    pending_error: Option<Error>,
    done: bool,
}

impl WatchState {
    async fn next_batch(
        &mut self,
        cancel: &CancellationToken,
        resumes: &AtomicU32,
    ) -> std::result::Result<Vec<NativeWatchEvent>, Error> {
        if let Some(err) = self.pending_error.take() {
            self.done = true;
            return Err(err);
        }
        if self.done {
            return Ok(Vec::new());
        }
        let Some(events) = self.events.as_mut() else {
            self.done = true;
            return Err(Error::Cancelled);
        };
        let first = tokio::select! {
            biased;
            _ = cancel.cancelled() => Some(Err(Error::Cancelled)),
            next = events.next() => next,
        };
        let mut batch = Vec::new();
        match first {
            None => self.done = true,
            Some(Err(err)) => self.pending_error = Some(err),
            Some(Ok(event)) => {
                batch.push(native_event(event));
                while batch.len() < BATCH_EVENTS {
                    match events.next().now_or_never() {
                        Some(Some(Ok(event))) => batch.push(native_event(event)),
                        Some(Some(Err(err))) => {
                            self.pending_error = Some(err);
                            break;
                        }
                        Some(None) => {
                            self.done = true;
                            break;
                        }
                        None => break,
                    }
                }
            }
        }
        resumes.store(events.resumes(), Ordering::Relaxed);
        if batch.is_empty()
            && let Some(err) = self.pending_error.take()
        {
            self.done = true;
            self.events = None;
            return Err(err);
        }
        if self.done {
            self.events = None;
        }
        Ok(batch)
    }
}

/// A running watch of one sandbox.
#[napi]
pub struct NativeEventWatch {
    state: Arc<tokio::sync::Mutex<WatchState>>,
    /// The core watch's resume count as of its last event or error.
    resumes: Arc<AtomicU32>,
    cancel: CancellationToken,
}

#[napi]
impl NativeEventWatch {
    /// The next events; empty once the watch has ended.
    #[napi]
    pub fn next_batch<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Vec<NativeWatchEvent>>> {
        let state = Arc::clone(&self.state);
        let resumes = Arc::clone(&self.resumes);
        let cancel = self.cancel.clone();
        env.spawn_future(guard(async move {
            state.lock().await.next_batch(&cancel, &resumes).await
        }))
    }

    /// How many times the watch opened a new stream after a broken one.
    #[napi(getter)]
    pub fn resumes(&self) -> u32 {
        self.resumes.load(Ordering::Relaxed)
    }

    /// Ends the watch. Idempotent.
    #[napi]
    pub fn cancel(&self) {
        self.cancel.cancel();
        match self.state.try_lock() {
            Ok(mut state) => drop(state.events.take()),
            Err(_) => {
                let state = Arc::clone(&self.state);
                napi::bindgen_prelude::spawn(async move { drop(state.lock().await.events.take()) });
            }
        }
    }
}

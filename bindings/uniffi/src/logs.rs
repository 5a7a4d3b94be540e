//! Sandbox logs (`GetSandboxLogs`) and [`EventWatch`], a watch of a
//! sandbox's status and log lines (`WatchSandbox`) that the core resumes
//! after a broken stream from the last cursor it delivered.
//!
//! The JVM pulls events one at a time (`next()`), as with exec. `cancel()`
//! (or the last reference going away, or the client's `cancel_all()`) drops
//! the core watch, which resets the stream; a `next()` in flight then ends
//! with `cancelled`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use openshell_sdk::CancellationToken;
use tokio::sync::Mutex;

use crate::client::{OpenShellClient, SandboxInfo, sandbox_info};
use crate::errors::OpenShellError;

/// Which lines to read or follow; everything by default.
#[derive(Debug, Clone, Default, uniffi::Record)]
pub struct LogQuery {
    /// Only the newest lines (of those that match).
    #[uniffi(default = None)]
    pub tail: Option<u32>,
    /// Only lines written at or after this time (Unix milliseconds).
    #[uniffi(default = None)]
    pub since_ms: Option<i64>,
    /// Only lines of these sources (`gateway`, `sandbox`); all when empty.
    #[uniffi(default = [])]
    pub sources: Vec<String>,
    /// Only lines at this level or above (TRACE, DEBUG, INFO, WARN, ERROR).
    #[uniffi(default = None)]
    pub min_level: Option<String>,
}

/// One recorded log line.
#[derive(Debug, Clone, uniffi::Record)]
pub struct LogLine {
    /// When it was written (Unix milliseconds, the writer's clock).
    pub time_ms: Option<i64>,
    /// TRACE, DEBUG, INFO, WARN or ERROR.
    pub level: String,
    /// `gateway` or `sandbox` (its supervisor).
    pub source: String,
    /// What wrote it (a module path).
    pub target: String,
    pub message: String,
    /// Structured fields (for example `exit_code`, `argv0`).
    pub fields: HashMap<String, String>,
}

/// What `sandbox_logs` returns.
#[derive(Debug, Clone, uniffi::Record)]
pub struct SandboxLogs {
    /// Oldest first.
    pub lines: Vec<LogLine>,
    /// Lines the gateway holds for the sandbox (before the query's filters).
    pub buffer_total: u32,
}

/// What a watch follows.
#[derive(Debug, Clone, uniffi::Record)]
pub struct WatchOptions {
    /// Status snapshots (the current state first, without a cursor).
    pub status: bool,
    /// Follow log lines matching this query (its `tail` lines, 200 when
    /// unset, are replayed first when there is no cursor).
    pub logs: Option<LogQuery>,
    /// Start after this cursor of an earlier event: exactly what came later.
    pub resume_after: Option<String>,
    /// End once the sandbox is READY, COMPLETED, STOPPED or in ERROR.
    pub stop_on_terminal: bool,
}

/// One event of a watch.
#[derive(Debug, Clone, uniffi::Enum)]
pub enum WatchEvent {
    /// The sandbox as it is now, or as a change made it.
    Sandbox {
        sandbox: SandboxInfo,
        cursor: String,
    },
    /// A recorded log line.
    Log { line: LogLine, cursor: String },
}

fn log_line(line: openshell_sdk::LogLine) -> LogLine {
    LogLine {
        time_ms: line
            .time
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        level: line.level,
        source: line.source,
        target: line.target,
        message: line.message,
        fields: line.fields.into_iter().collect(),
    }
}

fn core_query(query: LogQuery) -> openshell_sdk::LogQuery {
    let mut out = openshell_sdk::LogQuery::new();
    if let Some(tail) = query.tail {
        out = out.tail(tail);
    }
    if let Some(ms) = query.since_ms {
        out = out.since(SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64));
    }
    for source in query.sources {
        out = out.source(source);
    }
    if let Some(level) = query.min_level {
        out = out.min_level(level);
    }
    out
}

/// A running watch of one sandbox.
#[derive(uniffi::Object)]
pub struct EventWatch {
    /// `None` once ended or cancelled.
    stream: Mutex<Option<openshell_sdk::EventWatch>>,
    /// The cursor of the last event returned.
    cursor: std::sync::Mutex<Option<String>>,
    resumes: std::sync::atomic::AtomicU32,
    cancel: CancellationToken,
}

#[uniffi::export(async_runtime = "tokio")]
impl EventWatch {
    /// The next event; `None` once the watch ended (`stop_on_terminal`).
    pub async fn next(&self) -> Result<Option<WatchEvent>, OpenShellError> {
        let cancelled = || Err(openshell_sdk::Error::Cancelled.into());
        let mut guard = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return cancelled(),
            guard = self.stream.lock() => guard,
        };
        let Some(stream) = guard.as_mut() else {
            return if self.cancel.is_cancelled() {
                cancelled()
            } else {
                Ok(None)
            };
        };
        let next = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => {
                *guard = None;
                return cancelled();
            }
            next = stream.next() => next,
        };
        self.resumes
            .store(stream.resumes(), std::sync::atomic::Ordering::Relaxed);
        let event = match next {
            None => {
                *guard = None;
                return Ok(None);
            }
            Some(Err(err)) => {
                *guard = None;
                return Err(err.into());
            }
            Some(Ok(event)) => event,
        };
        if let Ok(mut cursor) = self.cursor.lock() {
            *cursor = Some(event.cursor().to_owned());
        }
        Ok(Some(match event {
            openshell_sdk::WatchEvent::Sandbox { sandbox, cursor } => WatchEvent::Sandbox {
                sandbox: sandbox_info(sandbox),
                cursor,
            },
            openshell_sdk::WatchEvent::Log { line, cursor } => WatchEvent::Log {
                line: log_line(line),
                cursor,
            },
        }))
    }

    /// The cursor of the last event returned: resume after it.
    pub fn cursor(&self) -> Option<String> {
        self.cursor.lock().ok().and_then(|c| c.clone())
    }

    /// How many times the watch opened a new stream after a broken one.
    pub fn resumes(&self) -> u32 {
        self.resumes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Ends the watch. Idempotent.
    pub fn cancel(&self) {
        self.cancel.cancel();
        if let Ok(mut stream) = self.stream.try_lock() {
            *stream = None;
        }
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// The sandbox's recorded log lines, oldest first.
    pub async fn sandbox_logs(
        &self,
        name: String,
        query: LogQuery,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxLogs, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        let query = core_query(query);
        let logs = self.run(sandboxes.logs(&name, &query, options)).await?;
        Ok(SandboxLogs {
            lines: logs.lines.into_iter().map(log_line).collect(),
            buffer_total: logs.buffer_total,
        })
    }

    /// Follows a sandbox: status snapshots, log lines, or both. Errors
    /// (a missing sandbox, a cursor the gateway no longer holds:
    /// `out_of_range`) come from the first `next()`. `timeout_ms`, when set,
    /// bounds the whole watch.
    pub async fn watch_sandbox(
        &self,
        name: String,
        options: WatchOptions,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<EventWatch>, OpenShellError> {
        let mut watch = openshell_sdk::WatchOptions::new()
            .status(options.status)
            .stop_on_terminal(options.stop_on_terminal);
        if let Some(query) = options.logs {
            watch = watch.logs(core_query(query));
        }
        if let Some(cursor) = options.resume_after {
            watch = watch.resume_after(cursor);
        }
        let (call, cancel) = self.options(timeout_ms);
        let stream = self.client.sandboxes().events(&name, watch, call);
        Ok(Arc::new(EventWatch {
            stream: Mutex::new(Some(stream)),
            cursor: std::sync::Mutex::new(None),
            resumes: std::sync::atomic::AtomicU32::new(0),
            cancel,
        }))
    }
}

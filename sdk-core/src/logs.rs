//! Sandbox logs and watches that resume.
//!
//! [`Sandboxes::logs`] reads the lines a gateway recorded about a sandbox
//! (its own and its supervisor's: `GetSandboxLogs`). [`Sandboxes::events`]
//! follows a sandbox (`WatchSandbox`): status snapshots, log lines, or
//! both. Every event carries the gateway's cursor; when the stream breaks
//! (a replica died, a connection dropped) the watch opens a new one after
//! the last cursor it delivered, on whichever replica answers, so nothing
//! is lost and nothing repeats. It gives up after [`RECONNECTS`] attempts
//! in a row without an event between them. When the gateway no longer
//! holds what came after the cursor (it keeps a bounded number of lines)
//! the watch ends with an `out_of_range` error instead of skipping ahead
//! quietly: [`Error::code`] tells it apart, and a new watch without a
//! cursor starts again from the current state.
//!
//! A watch that follows logs is routed to the sandbox's owner (the replica
//! its supervisor pushes to, where lines arrive first), like exec.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use openshell_proto as pb;

use crate::client::{CallOptions, DeadlineKind, Resolved};
use crate::error::Error;
use crate::paths;
use crate::raw::decode;
use crate::sandboxes::{Sandbox, SandboxWatch, Sandboxes};

/// Reconnects in a row (without an event between them) before a watch
/// gives up and returns the last error.
pub const RECONNECTS: u32 = 8;
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// One recorded log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When it was written (the writer's clock).
    pub time: Option<SystemTime>,
    /// TRACE, DEBUG, INFO, WARN or ERROR.
    pub level: String,
    /// "gateway" or "sandbox" (its supervisor).
    pub source: String,
    /// What wrote it (a module path).
    pub target: String,
    /// The line itself.
    pub message: String,
    /// Structured fields (for example `exit_code`).
    pub fields: BTreeMap<String, String>,
}

impl LogLine {
    /// Lifts a wire line (an empty source is the gateway's).
    pub fn from_proto(line: pb::SandboxLogLine) -> Self {
        Self {
            time: line.event_time.and_then(|t| SystemTime::try_from(t).ok()),
            level: line.level,
            source: if line.source.is_empty() {
                "gateway".to_owned()
            } else {
                line.source
            },
            target: line.target,
            message: line.message,
            fields: line.fields.into_iter().collect(),
        }
    }
}

impl fmt::Display for LogLine {
    /// `2026-12-04T05:01:02.345Z INFO  sandbox exec finished exit_code=0`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let time = self
            .time
            .map(rfc3339_millis)
            .unwrap_or_else(|| "-".to_owned());
        write!(
            f,
            "{time} {:<5} {:<7} {}",
            self.level, self.source, self.message
        )?;
        for (key, value) in &self.fields {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

/// `time` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC; times before 1970 as 1970).
pub fn rfc3339_millis(time: SystemTime) -> String {
    let since = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (Gregorian, proleptic).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// Which lines to read; everything by default (the newest 2000).
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    tail: Option<u32>,
    since: Option<SystemTime>,
    sources: Vec<String>,
    min_level: Option<String>,
}

impl LogQuery {
    /// Every line (the newest 2000).
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the newest `lines` (of those that match).
    pub fn tail(mut self, lines: u32) -> Self {
        self.tail = Some(lines);
        self
    }

    /// Only lines written at or after `time`.
    pub fn since(mut self, time: SystemTime) -> Self {
        self.since = Some(time);
        self
    }

    /// Only lines of this source ("gateway" or "sandbox"); may be repeated.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.sources.push(source.into());
        self
    }

    /// Only lines at this level or above (TRACE, DEBUG, INFO, WARN, ERROR).
    pub fn min_level(mut self, level: impl Into<String>) -> Self {
        self.min_level = Some(level.into());
        self
    }

    fn since_ms(&self) -> i64 {
        self.since
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as i64)
    }
}

/// What [`Sandboxes::logs`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logs {
    /// Oldest first.
    pub lines: Vec<LogLine>,
    /// Lines the gateway holds for the sandbox (before the query's filters).
    pub buffer_total: u32,
}

/// What a watch follows; status snapshots by default.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    status: bool,
    logs: bool,
    query: LogQuery,
    resume_after: Option<String>,
    stop_on_terminal: bool,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            status: true,
            logs: false,
            query: LogQuery::default(),
            resume_after: None,
            stop_on_terminal: false,
        }
    }
}

impl WatchOptions {
    /// Status snapshots, from the current state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Follow status changes (on by default).
    pub fn status(mut self, on: bool) -> Self {
        self.status = on;
        self
    }

    /// Follow log lines; the query's filters apply, and without a cursor
    /// its `tail` lines (200 when unset) are replayed first.
    pub fn logs(mut self, query: LogQuery) -> Self {
        self.logs = true;
        self.query = query;
        self
    }

    /// Start after this cursor (of an earlier event): no snapshot first,
    /// exactly the events that came later.
    pub fn resume_after(mut self, cursor: impl Into<String>) -> Self {
        self.resume_after = Some(cursor.into());
        self
    }

    /// End once the sandbox is READY, COMPLETED, STOPPED or in ERROR.
    pub fn stop_on_terminal(mut self, on: bool) -> Self {
        self.stop_on_terminal = on;
        self
    }

    fn request(&self, name: &str, cursor: Option<&str>) -> pb::WatchSandboxRequest {
        pb::WatchSandboxRequest {
            sandbox: name.to_owned(),
            follow_status: self.status,
            follow_logs: self.logs,
            log_tail_lines: self.query.tail.unwrap_or(0),
            stop_on_terminal: self.stop_on_terminal,
            log_sources: self.query.sources.clone(),
            log_min_level: self.query.min_level.clone().unwrap_or_default(),
            resume_after_cursor: cursor.unwrap_or_default().to_owned(),
            since_time: self.query.since.map(prost_types::Timestamp::from),
            ..Default::default()
        }
    }
}

/// One event of a watch.
// Unboxed on purpose: most events are log lines, but every binding matches
// on the snapshot by value, and a watch holds one event at a time.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The sandbox as it is now (the first event without a cursor) or as a
    /// change made it.
    Sandbox {
        /// The sandbox.
        sandbox: Sandbox,
        /// Resume after this.
        cursor: String,
    },
    /// A recorded log line.
    Log {
        /// The line.
        line: LogLine,
        /// Resume after this.
        cursor: String,
    },
}

impl WatchEvent {
    /// Resume after this to get the events that followed.
    pub fn cursor(&self) -> &str {
        match self {
            WatchEvent::Sandbox { cursor, .. } | WatchEvent::Log { cursor, .. } => cursor,
        }
    }
}

impl Sandboxes {
    /// The sandbox's recorded log lines, oldest first.
    pub async fn logs(
        &self,
        name: &str,
        query: &LogQuery,
        options: CallOptions,
    ) -> Result<Logs, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let request = pb::GetSandboxLogsRequest {
            sandbox: name.to_owned(),
            lines: query.tail.unwrap_or(0),
            since_ms: query.since_ms(),
            sources: query.sources.clone(),
            min_level: query.min_level.clone().unwrap_or_default(),
            ..Default::default()
        };
        let (response, _): (pb::GetSandboxLogsResponse, _) = self
            .client
            .typed_unary(paths::GET_SANDBOX_LOGS, &request, &resolved)
            .await?;
        Ok(Logs {
            lines: response.logs.into_iter().map(LogLine::from_proto).collect(),
            buffer_total: response.buffer_total,
        })
    }

    /// Streams snapshots of a sandbox: the current state first, then every
    /// change, resuming after a broken stream like [`Sandboxes::events`]
    /// (whose status-only form it is). The stream has no deadline unless
    /// `options` sets one.
    pub async fn watch(&self, name: &str, options: CallOptions) -> Result<SandboxWatch, Error> {
        let events = self.events(name, WatchOptions::new(), options);
        let snapshots = events
            .filter_map(|event| async move {
                match event {
                    Ok(WatchEvent::Sandbox { sandbox, .. }) => Some(Ok(sandbox)),
                    Ok(WatchEvent::Log { .. }) => None,
                    Err(err) => Some(Err(err)),
                }
            })
            .boxed();
        Ok(SandboxWatch::from_stream(snapshots))
    }

    /// Follows a sandbox: see the module docs. The stream has no deadline
    /// unless `options` sets one (it then bounds the whole watch).
    pub fn events(&self, name: &str, watch: WatchOptions, options: CallOptions) -> EventWatch {
        let resumes = Arc::new(AtomicU32::new(0));
        let state = WatchState {
            sandboxes: self.clone(),
            name: name.to_owned(),
            cursor: watch.resume_after.clone(),
            watch,
            resolved: Resolved::new(&self.client, &options, DeadlineKind::Stream),
            failures: 0,
            ended: false,
            current: None,
            resumes: resumes.clone(),
        };
        EventWatch {
            inner: futures::stream::unfold(state, WatchState::next)
                .fuse()
                .boxed(),
            cursor: None,
            resumes,
        }
    }
}

struct WatchState {
    sandboxes: Sandboxes,
    name: String,
    watch: WatchOptions,
    /// The last cursor delivered (or the one to resume after).
    cursor: Option<String>,
    resolved: Resolved,
    /// Reconnects in a row without an event.
    failures: u32,
    ended: bool,
    current: Option<BoxStream<'static, Result<bytes::Bytes, Error>>>,
    resumes: Arc<AtomicU32>,
}

impl WatchState {
    fn open(&self) -> Result<BoxStream<'static, Result<bytes::Bytes, Error>>, Error> {
        let request = self.watch.request(&self.name, self.cursor.as_deref());
        let owner_of = self.watch.logs.then(|| self.name.clone());
        let stream = self.sandboxes.client.typed_stream_routed(
            paths::WATCH_SANDBOX,
            &request,
            &self.resolved,
            owner_of,
        )?;
        let (_sender, receiver) = stream.split();
        Ok(receiver.into_stream())
    }

    async fn next(mut self) -> Option<(Result<WatchEvent, Error>, Self)> {
        loop {
            if self.ended {
                return None;
            }
            let frame = match self.current.as_mut() {
                Some(stream) => stream.next().await,
                None => match self.open() {
                    Ok(stream) => {
                        self.current = Some(stream);
                        continue;
                    }
                    Err(err) => Some(Err(err)),
                },
            };
            let err = match frame {
                None => {
                    // The gateway ended the stream: stop_on_terminal, or
                    // nothing to follow.
                    self.ended = true;
                    return None;
                }
                Some(Ok(frame)) => {
                    match decode::<pb::SandboxStreamEvent>(paths::WATCH_SANDBOX, frame) {
                        Ok(event) => match self.deliver(event) {
                            Some(event) => return Some((Ok(event), self)),
                            None => continue,
                        },
                        Err(err) => err,
                    }
                }
                Some(Err(err)) => err,
            };
            self.current = None;
            if !reconnectable(&err) || self.failures >= RECONNECTS {
                self.ended = true;
                return Some((Err(err), self));
            }
            let backoff = BACKOFF_MIN
                .saturating_mul(1 << self.failures.min(5))
                .min(BACKOFF_MAX);
            self.failures += 1;
            self.resumes.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(sandbox = %self.name, code = err.code(), "watch broke; resuming");
            // The owner may have moved with the break.
            self.sandboxes.client.forget_owner(&self.name);
            tokio::time::sleep(backoff).await;
        }
    }

    fn deliver(&mut self, event: pb::SandboxStreamEvent) -> Option<WatchEvent> {
        let cursor = event.cursor;
        let delivered = match event.payload? {
            pb::sandbox_stream_event::Payload::Sandbox(sandbox) => WatchEvent::Sandbox {
                sandbox: Sandbox::from_proto(sandbox),
                cursor: cursor.clone(),
            },
            pb::sandbox_stream_event::Payload::Log(line) => WatchEvent::Log {
                line: LogLine::from_proto(line),
                cursor: cursor.clone(),
            },
            pb::sandbox_stream_event::Payload::Warning(warning) => {
                tracing::debug!(warning = %warning.message, "sandbox watch warning");
                return None;
            }
        };
        if !cursor.is_empty() {
            self.cursor = Some(cursor);
        }
        self.failures = 0;
        Some(delivered)
    }
}

/// A broken stream worth resuming: the connection or the replica went away.
/// A refusal (bad cursor, missing sandbox, trimmed events, no permission)
/// would only be repeated.
fn reconnectable(err: &Error) -> bool {
    matches!(
        err.code(),
        "unavailable" | "connect" | "io" | "internal" | "unknown"
    )
}

/// Events of one sandbox, from [`Sandboxes::events`]. Dropping it cancels
/// the watch.
pub struct EventWatch {
    inner: BoxStream<'static, Result<WatchEvent, Error>>,
    cursor: Option<String>,
    resumes: Arc<AtomicU32>,
}

impl EventWatch {
    /// How many times the watch opened a new stream after a broken one.
    pub fn resumes(&self) -> u32 {
        self.resumes.load(Ordering::Relaxed)
    }

    /// The cursor of the last event this watch returned.
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }
}

impl Stream for EventWatch {
    type Item = Result<WatchEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(Some(Ok(event))) = &polled {
            self.cursor = Some(event.cursor().to_owned());
        }
        polled
    }
}

impl fmt::Debug for EventWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventWatch")
            .field("cursor", &self.cursor)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_rfc3339() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_780_549_262_345);
        assert_eq!(rfc3339_millis(at), "2026-06-04T05:01:02.345Z");
        assert_eq!(
            rfc3339_millis(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn only_broken_streams_are_resumed() {
        let status = |code| Error::Rpc {
            code,
            message: String::new(),
            metadata: Default::default(),
        };
        assert!(reconnectable(&status(tonic::Code::Unavailable)));
        assert!(reconnectable(&Error::Connect {
            message: String::new()
        }));
        for code in [
            tonic::Code::OutOfRange,
            tonic::Code::NotFound,
            tonic::Code::InvalidArgument,
            tonic::Code::PermissionDenied,
        ] {
            assert!(!reconnectable(&status(code)), "{code:?}");
        }
    }
}

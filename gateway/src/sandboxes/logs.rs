//! Sandbox logs: lines the gateway writes about a sandbox (source
//! "gateway") and lines its supervisor pushes (`PushSandboxLogs`, source
//! "sandbox"), kept in the store's event log, the newest
//! `--sandbox-log-lines` per sandbox, for as long as the sandbox exists.
//! Served by `GetSandboxLogs` and followed through `WatchSandbox`.
//!
//! Pushed lines are the supervisor's word: the gateway caps their sizes,
//! sets their sandbox and source itself (a supervisor cannot write a
//! "gateway" line or one of another sandbox) and never logs their text.

use std::collections::HashMap;
use std::time::SystemTime;

use openshell_proto::{GetSandboxLogsRequest, GetSandboxLogsResponse, SandboxLogLine};
use prost::Message;
use tonic::Status;

use super::{Sandboxes, id_of, store_status};
use crate::validate;

/// Lines `GetSandboxLogs` answers when the request names no number.
pub const DEFAULT_LINES: usize = 2000;
/// Longest message kept (bytes; longer ones are cut at a character).
const MAX_MESSAGE: usize = 8 * 1024;
const MAX_TARGET: usize = 128;
const MAX_FIELDS: usize = 16;
const MAX_FIELD_KEY: usize = 64;
const MAX_FIELD_VALUE: usize = 1024;
/// Lines in one pushed message.
pub const MAX_PUSH_BATCH: usize = 1000;
/// Longest `pusher` name of a pushed message (bytes).
const MAX_PUSHER: usize = 64;
/// Most bytes of lines in one `GetSandboxLogs` answer: the newest lines
/// that fit (2000 lines at their largest would pass the 16 MiB a client
/// takes in one message).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

pub const SOURCE_GATEWAY: &str = "gateway";
pub const SOURCE_SANDBOX: &str = "sandbox";

const LEVELS: [&str; 5] = ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"];

/// A level's rank (TRACE 0 .. ERROR 4); WARNING is WARN.
fn level_rank(level: &str) -> Option<usize> {
    let upper = level.to_ascii_uppercase();
    let upper = if upper == "WARNING" {
        "WARN".to_owned()
    } else {
        upper
    };
    LEVELS.iter().position(|l| *l == upper)
}

pub fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

/// Which lines a reader asked for.
#[derive(Debug, Clone, Default)]
pub struct LogFilter {
    /// Empty: both sources.
    sources: Vec<&'static str>,
    min_rank: usize,
    since_ms: i64,
}

impl LogFilter {
    pub fn parse(sources: &[String], min_level: &str, since_ms: i64) -> Result<Self, Status> {
        let mut parsed = Vec::new();
        for source in sources {
            match source.to_ascii_lowercase().as_str() {
                SOURCE_GATEWAY => parsed.push(SOURCE_GATEWAY),
                SOURCE_SANDBOX => parsed.push(SOURCE_SANDBOX),
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "log source {} is not one of gateway, sandbox",
                        validate::quote(source)
                    )));
                }
            }
        }
        let min_rank = match min_level {
            "" => 0,
            level => level_rank(level).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "log level {} is not one of TRACE, DEBUG, INFO, WARN, ERROR",
                    validate::quote(level)
                ))
            })?,
        };
        if since_ms < 0 {
            return Err(Status::invalid_argument("since must not be before 1970"));
        }
        Ok(Self {
            sources: parsed,
            min_rank,
            since_ms,
        })
    }

    pub fn matches(&self, line: &SandboxLogLine) -> bool {
        let source = if line.source.is_empty() {
            SOURCE_GATEWAY
        } else {
            line.source.as_str()
        };
        (self.sources.is_empty() || self.sources.contains(&source))
            && level_rank(&line.level).unwrap_or(2) >= self.min_rank
            && line.event_time.as_ref().map_or(0, timestamp_ms) >= self.since_ms
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn capped(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A pushed line as it is kept: sizes capped, level one of [`LEVELS`]
/// (INFO when unknown), the sandbox and source ours, a time (now when the
/// supervisor gave none).
fn sanitized(mut line: SandboxLogLine, sandbox_id: &str) -> SandboxLogLine {
    line.sandbox_id = sandbox_id.to_owned();
    line.source = SOURCE_SANDBOX.to_owned();
    line.level = LEVELS[level_rank(&line.level).unwrap_or(2)].to_owned();
    line.message = capped(std::mem::take(&mut line.message), MAX_MESSAGE);
    line.target = capped(std::mem::take(&mut line.target), MAX_TARGET);
    let mut fields: Vec<(String, String)> = std::mem::take(&mut line.fields).into_iter().collect();
    fields.sort();
    line.fields = fields
        .into_iter()
        .take(MAX_FIELDS)
        .map(|(k, v)| (capped(k, MAX_FIELD_KEY), capped(v, MAX_FIELD_VALUE)))
        .collect();
    if line.event_time.is_none() {
        line.event_time = Some(prost_types::Timestamp::from(SystemTime::now()));
    }
    line
}

impl Sandboxes {
    pub async fn get_logs(
        &self,
        req: GetSandboxLogsRequest,
    ) -> Result<GetSandboxLogsResponse, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::sandbox_name(&req.sandbox)?;
        let filter = LogFilter::parse(&req.sources, &req.min_level, req.since_ms)?;
        let wanted = match req.lines {
            0 => DEFAULT_LINES,
            n => n as usize,
        };
        let sandbox = self.by_name(&req.sandbox).await?;
        let stored = self
            .store
            .log_lines(id_of(&sandbox))
            .await
            .map_err(store_status)?;
        let buffer_total = stored.len() as u32;
        let matching: Vec<SandboxLogLine> = stored
            .into_iter()
            .filter_map(|(_, record)| SandboxLogLine::decode(record.as_slice()).ok())
            .filter(|line| filter.matches(line))
            .collect();
        let mut logs: Vec<SandboxLogLine> = Vec::new();
        let mut bytes = 0;
        for line in matching.into_iter().rev().take(wanted) {
            bytes += line.encoded_len();
            if bytes > MAX_ANSWER {
                break;
            }
            logs.push(line);
        }
        logs.reverse();
        Ok(GetSandboxLogsResponse { logs, buffer_total })
    }

    /// Records lines a supervisor pushed for `sandbox_id` (already checked
    /// to be the caller's); with `mark` (pusher, message number) only once.
    pub async fn push_logs(
        &self,
        sandbox_id: &str,
        lines: Vec<SandboxLogLine>,
        mark: Option<(&str, i64)>,
    ) -> Result<(), Status> {
        if mark.is_some_and(|(pusher, _)| pusher.len() > MAX_PUSHER) {
            return Err(Status::invalid_argument(format!(
                "pusher is longer than {MAX_PUSHER} bytes"
            )));
        }
        if lines.len() > MAX_PUSH_BATCH {
            return Err(Status::invalid_argument(format!(
                "at most {MAX_PUSH_BATCH} log lines per message"
            )));
        }
        if lines.is_empty() {
            return Ok(());
        }
        let encoded = lines
            .into_iter()
            .map(|line| sanitized(line, sandbox_id).encode_to_vec())
            .collect();
        self.store
            .append_logs(sandbox_id, encoded, self.hub.log_keep, mark)
            .await
            .map_err(store_status)?;
        self.hub.wake(sandbox_id);
        Ok(())
    }

    /// Records a line of the gateway's own about a sandbox, in the
    /// background (a failure is only logged: no request waits for it).
    pub fn note(&self, sandbox_id: &str, level: &str, message: String) {
        let line = SandboxLogLine {
            sandbox_id: sandbox_id.to_owned(),
            level: level.to_owned(),
            target: "gateway".to_owned(),
            message,
            source: SOURCE_GATEWAY.to_owned(),
            fields: HashMap::from([("replica".to_owned(), self.replica_name())]),
            event_time: Some(prost_types::Timestamp::from(SystemTime::now())),
        };
        let store = self.store.clone();
        let keep = self.hub.log_keep;
        let id = sandbox_id.to_owned();
        let wake = self.hub.waker();
        tokio::spawn(async move {
            match store
                .append_logs(&id, vec![line.encode_to_vec()], keep, None)
                .await
            {
                Ok(_) => wake.wake(&id),
                Err(err) => tracing::debug!(sandbox_id = id, %err, "could not record a log line"),
            }
        });
    }

    fn replica_name(&self) -> String {
        match &self.cluster {
            Some(cluster) => cluster.replica_id().to_owned(),
            None => self.host.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(source: &str, level: &str, ms: i64) -> SandboxLogLine {
        SandboxLogLine {
            source: source.into(),
            level: level.into(),
            event_time: Some(prost_types::Timestamp {
                seconds: ms / 1000,
                nanos: ((ms % 1000) * 1_000_000) as i32,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn filters_by_source_level_and_time() {
        let all = LogFilter::parse(&[], "", 0).unwrap();
        assert!(all.matches(&line("", "DEBUG", 5)));
        let sandbox = LogFilter::parse(&["Sandbox".into()], "warning", 1000).unwrap();
        assert!(sandbox.matches(&line("sandbox", "ERROR", 1000)));
        assert!(!sandbox.matches(&line("sandbox", "INFO", 2000)));
        assert!(!sandbox.matches(&line("sandbox", "WARN", 999)));
        // An empty source is the gateway's.
        assert!(!sandbox.matches(&line("", "ERROR", 2000)));
    }

    #[test]
    fn bad_filters_are_invalid_argument() {
        for (sources, level, since) in [
            (vec!["kernel".to_owned()], "", 0),
            (vec![], "LOUD", 0),
            (vec![], "", -1),
        ] {
            let err = LogFilter::parse(&sources, level, since).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        }
    }

    #[test]
    fn pushed_lines_are_capped_and_owned_by_their_sandbox() {
        let pushed = SandboxLogLine {
            sandbox_id: "someone-else".into(),
            source: "gateway".into(),
            level: "shout".into(),
            message: "é".repeat(MAX_MESSAGE),
            fields: (0..40).map(|i| (format!("k{i:02}"), "v".into())).collect(),
            ..Default::default()
        };
        let kept = sanitized(pushed, "mine");
        assert_eq!(kept.sandbox_id, "mine");
        assert_eq!(kept.source, SOURCE_SANDBOX);
        assert_eq!(kept.level, "INFO");
        assert!(kept.message.len() <= MAX_MESSAGE);
        assert_eq!(kept.fields.len(), MAX_FIELDS);
        assert!(kept.event_time.is_some());
    }
}

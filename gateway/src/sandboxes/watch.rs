//! `WatchSandbox`: a watcher reads the store's event log (`store::events`)
//! from its cursor at its own pace, so a slow watcher falls behind without
//! losing anything, and a watcher on any replica sees changes written on
//! every replica. The hub only wakes watchers: local writes wake them at
//! once, writes of other replicas when `follow_events` sees them.
//!
//! Cursors name this store's sequence space and an event number
//! (`<space, 16 hex>.<seq, 20 digits>`), so they compare byte-wise in event
//! order. Every event carries one, the first snapshot too; a log line
//! replayed after the snapshot carries the snapshot's with the line's own
//! number after it (`<space>.<seq>.<line, 20 digits>`), which still sorts
//! after the snapshot and before anything later. Cursors never go back,
//! and resuming after the last one seen delivers exactly what came later,
//! the rest of an interrupted replay included. A cursor behind what was
//! trimmed, of another store, or ahead of the log ends the stream with
//! OUT_OF_RANGE (watch again without a cursor); an unparsable one is
//! INVALID_ARGUMENT.

use std::time::Duration;

use openshell_proto::{
    Sandbox, SandboxLogLine, SandboxStreamEvent, WatchSandboxRequest, sandbox_stream_event,
};
use prost::Message;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::logs::LogFilter;
use super::{Sandboxes, id_of, is_terminal, phase_of, store_status};
use crate::store::{EventKind, Store};
use crate::validate;

/// Events read from the store at once.
const BATCH: i64 = 256;
/// A watcher re-reads this often even when nothing woke it.
const IDLE_POLL: Duration = Duration::from_secs(1);
/// Log lines replayed without a cursor when the request names no number.
pub const DEFAULT_TAIL: usize = 200;

pub struct WatchHub {
    tx: broadcast::Sender<String>,
    /// The store's sequence space (`Store::event_space`).
    space: i64,
    /// Log lines kept per sandbox (`--sandbox-log-lines`).
    pub log_keep: i64,
}

impl WatchHub {
    pub fn new(space: i64, log_keep: i64) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Self {
            tx,
            space,
            log_keep,
        }
    }

    /// Wakes the watchers of one sandbox.
    pub fn wake(&self, sandbox_id: &str) {
        // No receivers is fine.
        let _ = self.tx.send(sandbox_id.to_owned());
    }

    /// A handle that wakes watchers from a task of its own.
    pub fn waker(&self) -> Waker {
        Waker(self.tx.clone())
    }

    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.tx.subscribe()
    }

    /// Where a cursor of this store resumes.
    pub fn decode_cursor(&self, cursor: &str) -> Result<Resume, Status> {
        let invalid = || Status::invalid_argument("resume_after_cursor is not a watch cursor");
        let number = |digits: &str| -> Result<i64, Status> {
            if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            digits.parse().map_err(|_| invalid())
        };
        let mut parts = cursor.split('.');
        let (Some(space), Some(seq)) = (parts.next(), parts.next()) else {
            return Err(invalid());
        };
        if space.len() != 16 || !space.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid());
        }
        let seq = number(seq)?;
        let replayed = parts.next().map(number).transpose()?;
        if parts.next().is_some() || replayed.is_some_and(|line| line > seq) {
            return Err(invalid());
        }
        let space = u64::from_str_radix(space, 16).map_err(|_| invalid())?;
        if space != self.space as u64 {
            return Err(Status::out_of_range(
                "resume_after_cursor belongs to another gateway's event log; watch again without a cursor",
            ));
        }
        Ok(Resume { seq, replayed })
    }
}

/// A decoded cursor: after event `seq`, and for a log line replayed after
/// a snapshot, after that line of the replay (`replayed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    pub seq: i64,
    pub replayed: Option<i64>,
}

#[derive(Clone)]
pub struct Waker(broadcast::Sender<String>);

impl Waker {
    pub fn wake(&self, sandbox_id: &str) {
        let _ = self.0.send(sandbox_id.to_owned());
    }
}

fn cursor_for(space: i64, seq: i64) -> String {
    format!("{:016x}.{seq:020}", space as u64)
}

fn replay_cursor(space: i64, head: i64, line: i64) -> String {
    format!("{}.{line:020}", cursor_for(space, head))
}

/// Resolves when `wake` names `id` (or may have: it lagged), the receiver
/// side of the stream is gone (`false`), or [`IDLE_POLL`] passed.
async fn woken(
    wake: &mut broadcast::Receiver<String>,
    id: &str,
    tx: &mpsc::Sender<Result<SandboxStreamEvent, Status>>,
) -> bool {
    let sleep = tokio::time::sleep(IDLE_POLL);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = tx.closed() => return false,
            _ = &mut sleep => return true,
            got = wake.recv() => match got {
                Ok(woke) if woke != id => continue,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => return true,
                Err(broadcast::error::RecvError::Closed) => return false,
            },
        }
    }
}

fn status_event(sandbox: Sandbox, cursor: String) -> SandboxStreamEvent {
    SandboxStreamEvent {
        payload: Some(sandbox_stream_event::Payload::Sandbox(sandbox)),
        cursor,
    }
}

fn log_event(line: SandboxLogLine, cursor: String) -> SandboxStreamEvent {
    SandboxStreamEvent {
        payload: Some(sandbox_stream_event::Payload::Log(line)),
        cursor,
    }
}

/// The log lines replayed after a snapshot at event `head`: the newest
/// `count` of those matching `filter` with numbers in `(after, head]`,
/// each with its replay cursor.
struct Replay<'a> {
    id: &'a str,
    head: i64,
    after: i64,
    count: usize,
    filter: &'a LogFilter,
    space: i64,
}

impl Replay<'_> {
    /// Sends the lines; `false` when the stream ended (the receiver left,
    /// or an error was sent: the store failed, or lines owed were trimmed).
    async fn send(
        &self,
        store: &Store,
        tx: &mpsc::Sender<Result<SandboxStreamEvent, Status>>,
    ) -> bool {
        let read = async {
            let lines = store.log_lines(self.id).await?;
            // Read after the lines: a trim between the two reads raises
            // the floor, so no line owed goes missing unnoticed.
            if self.after > 0 {
                let floors = store
                    .events_for(self.id, self.after, false, true, 0)
                    .await?;
                if floors.log_floor > self.after {
                    return Ok(None);
                }
            }
            Ok(Some(lines))
        };
        let lines = match read.await {
            Ok(Some(lines)) => lines,
            Ok(None) => {
                let _ = tx
                    .send(Err(Status::out_of_range(
                        "log lines after the cursor were trimmed before this watch replayed them; \
                         watch again without a cursor",
                    )))
                    .await;
                return false;
            }
            Err(err) => {
                let _ = tx.send(Err(store_status(err))).await;
                return false;
            }
        };
        let matching: Vec<(i64, SandboxLogLine)> = lines
            .into_iter()
            .filter(|(seq, _)| *seq > self.after && *seq <= self.head)
            .filter_map(|(seq, record)| {
                SandboxLogLine::decode(record.as_slice())
                    .ok()
                    .filter(|line| self.filter.matches(line))
                    .map(|line| (seq, line))
            })
            .collect();
        let skip = matching.len().saturating_sub(self.count);
        for (seq, line) in matching.into_iter().skip(skip) {
            let cursor = replay_cursor(self.space, self.head, seq);
            if tx.send(Ok(log_event(line, cursor))).await.is_err() {
                return false;
            }
        }
        true
    }
}

fn deleted(name: &str) -> Status {
    Status::not_found(format!("sandbox {} was deleted", validate::quote(name)))
}

impl Sandboxes {
    pub async fn watch(
        &self,
        req: WatchSandboxRequest,
    ) -> Result<ReceiverStream<Result<SandboxStreamEvent, Status>>, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::sandbox_name(&req.sandbox)?;
        let filter = LogFilter::parse(
            &req.log_sources,
            &req.log_min_level,
            req.since_time.as_ref().map_or(0, super::logs::timestamp_ms),
        )?;
        let resume = match req.resume_after_cursor.as_str() {
            "" => None,
            cursor => Some(self.hub.decode_cursor(cursor)?),
        };
        // Subscribed before the snapshot is read, so no wake falls between.
        let mut wake = self.hub.subscribe();
        let (stored, head) = self
            .store
            .snapshot_with_head(&req.sandbox)
            .await
            .map_err(store_status)?;
        if resume.is_some_and(|r| r.seq > head) {
            return Err(Status::out_of_range(
                "resume_after_cursor is ahead of this gateway's event log; watch again without a cursor",
            ));
        }
        if resume.is_some_and(|r| r.replayed.is_some()) && !req.follow_logs {
            return Err(Status::invalid_argument(
                "resume_after_cursor names a replayed log line: resume it with follow_logs",
            ));
        }
        let id = id_of(&stored.sandbox).to_owned();
        let store = self.store.clone();
        let space = self.hub.space;
        let cursor_of = move |seq: i64| cursor_for(space, seq);
        let (tx, rx) = mpsc::channel(64);
        let tail = match req.log_tail_lines {
            0 => DEFAULT_TAIL,
            n => n as usize,
        };
        tokio::spawn(async move {
            let name = req.sandbox;
            let follows = req.follow_status || req.follow_logs;
            // Where the log is read from, and the replay still owed (the
            // lines after this number up to the cursor's event, the newest
            // `usize` of them).
            let (mut cursor, replay, stop) = match resume {
                Some(Resume { seq, replayed }) => {
                    (seq, replayed.map(|line| (line, usize::MAX)), !follows)
                }
                None => {
                    let snapshot = stored.sandbox;
                    let terminal = req.stop_on_terminal && is_terminal(phase_of(&snapshot));
                    if tx
                        .send(Ok(status_event(snapshot, cursor_of(head))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    (
                        head,
                        req.follow_logs.then_some((0, tail)),
                        !follows || terminal,
                    )
                }
            };
            if let Some((after, count)) = replay {
                let replay = Replay {
                    id: &id,
                    head: cursor,
                    after,
                    count,
                    filter: &filter,
                    space,
                };
                if !replay.send(&store, &tx).await {
                    return;
                }
            }
            if stop {
                return;
            }
            loop {
                let batch = match store
                    .events_for(&id, cursor, req.follow_status, req.follow_logs, BATCH)
                    .await
                {
                    Ok(batch) => batch,
                    Err(err) => {
                        let _ = tx.send(Err(store_status(err))).await;
                        return;
                    }
                };
                let trimmed = (req.follow_status && batch.status_floor > cursor)
                    || (req.follow_logs && batch.log_floor > cursor);
                if trimmed {
                    let _ = tx
                        .send(Err(Status::out_of_range(
                            "events after the cursor were trimmed before this watch read them; \
                             watch again without a cursor",
                        )))
                        .await;
                    return;
                }
                let full = batch.events.len() as i64 == BATCH;
                for event in batch.events {
                    cursor = event.seq;
                    let sent = match event.kind {
                        EventKind::Deleted => {
                            let _ = tx.send(Err(deleted(&name))).await;
                            return;
                        }
                        EventKind::Status => {
                            // Written before records were kept: nothing to send.
                            if event.record.is_empty() {
                                continue;
                            }
                            let Ok(sandbox) = Sandbox::decode(event.record.as_slice()) else {
                                continue;
                            };
                            let terminal = req.stop_on_terminal && is_terminal(phase_of(&sandbox));
                            let sent = tx.send(Ok(status_event(sandbox, cursor_of(cursor)))).await;
                            if terminal {
                                return;
                            }
                            sent
                        }
                        EventKind::Log => match SandboxLogLine::decode(event.record.as_slice()) {
                            Ok(line) if filter.matches(&line) => {
                                tx.send(Ok(log_event(line, cursor_of(cursor)))).await
                            }
                            _ => Ok(()),
                        },
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                if !full && !woken(&mut wake, &id, &tx).await {
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}

//! The supervisor's log lines about its sandboxes, recorded by the gateway
//! (`PushSandboxLogs`, source "sandbox"): what `openshell logs` shows.
//!
//! A tracing layer ([`Capture`]) copies every INFO, WARN and ERROR event
//! into a bounded queue without ever blocking the code that logged it (a
//! full queue drops the line and counts it); [`run`] forms the queue into
//! numbered messages and sends each in one short `PushSandboxLogs` call,
//! oldest first. A message the gateway refuses for good (its sandbox was
//! deleted or moved to another host) is dropped; any other failure keeps it
//! and the rest, bounded the same way, for the next attempt. The number
//! and this process's pusher name let the gateway recognise a retry of a
//! message it already recorded, so no line is recorded twice.
//! An event's sandbox is its `sandbox_id` field, else the process's own
//! sandbox (a per-sandbox supervisor); a host's lines about no sandbox stay
//! in its own log only. The transport's own events (h2, hyper, tonic,
//! tower) are not copied, so pushing never feeds itself.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::{PushSandboxLogsRequest, SandboxLogLine};
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber, debug};
use tracing_subscriber::layer::Context;

use crate::transport::BearerToken;

/// Lines waiting to be sent, at most.
const QUEUE: usize = 4096;
/// Lines in one pushed message (the gateway takes up to 1000).
const BATCH: usize = 500;
/// How long lines gather before a push.
const GATHER: Duration = Duration::from_millis(200);
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(5);

static DROPPED: AtomicU64 = AtomicU64::new(0);
static RECEIVER: OnceLock<Mutex<Option<mpsc::Receiver<SandboxLogLine>>>> = OnceLock::new();

/// The layer that copies events into the queue [`run`] sends.
pub struct Capture {
    tx: mpsc::Sender<SandboxLogLine>,
}

impl Capture {
    /// The layer; its queue's receiving end is kept for [`run`].
    pub fn install() -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let _ = RECEIVER.set(Mutex::new(Some(rx)));
        Self { tx }
    }
}

fn copied(target: &str) -> bool {
    !["h2", "hyper", "tonic", "tower", "rustls", "russh"]
        .iter()
        .any(|skip| target == *skip || target.starts_with(&format!("{skip}::")))
}

#[derive(Default)]
struct Fields {
    message: String,
    sandbox_id: String,
    fields: HashMap<String, String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "sandbox_id" => self.sandbox_id = value.to_owned(),
            name => {
                self.fields.insert(name.to_owned(), value.to_owned());
            }
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        match field.name() {
            "message" => self.message = text,
            "sandbox_id" => self.sandbox_id = text.trim_matches('"').to_owned(),
            name => {
                self.fields.insert(name.to_owned(), text);
            }
        }
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        // More verbose levels compare greater.
        if *meta.level() > Level::INFO || !copied(meta.target()) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = SandboxLogLine {
            sandbox_id: fields.sandbox_id,
            level: meta.level().to_string(),
            target: meta.target().to_owned(),
            message: fields.message,
            source: String::new(),
            fields: fields.fields,
            event_time: Some(prost_types::Timestamp::from(SystemTime::now())),
        };
        if self.tx.try_send(line).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A line saying how many lines were lost since the last one said so.
fn dropped_line(sandbox_id: &str, count: u64) -> SandboxLogLine {
    SandboxLogLine {
        sandbox_id: sandbox_id.to_owned(),
        level: "WARN".into(),
        target: module_path!().into(),
        message: format!("{count} log lines were dropped (the supervisor's queue was full)"),
        event_time: Some(prost_types::Timestamp::from(SystemTime::now())),
        ..Default::default()
    }
}

/// Sends the captured lines to the gateway until the process ends.
/// `own_sandbox` is the sandbox of lines that name none (a per-sandbox
/// supervisor's); `None` on a host.
pub async fn run(channel: Channel, token: BearerToken, own_sandbox: Option<String>) {
    let Some(mut rx) = RECEIVER
        .get()
        .and_then(|slot| slot.lock().expect("log queue").take())
    else {
        return;
    };
    let mut client = OpenShellClient::new(channel);
    let mut outbox = Outbox::new();
    let mut retry = RETRY_MIN;
    loop {
        let mut fresh = Vec::new();
        if outbox.messages.is_empty() {
            match rx.recv().await {
                Some(line) => fresh.push(line),
                None => return,
            }
        }
        tokio::time::sleep(GATHER).await;
        while let Ok(line) = rx.try_recv() {
            fresh.push(line);
        }
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0
            && let Some(own) = &own_sandbox
        {
            fresh.push(dropped_line(own, dropped));
        }
        outbox.add(batches(&fresh, own_sandbox.as_deref()));
        while let Some(message) = outbox.messages.front() {
            let request = token.request(tokio_stream::iter([message.clone()]));
            match client.push_sandbox_logs(request).await {
                Ok(_) => {
                    outbox.sent();
                    retry = RETRY_MIN;
                }
                Err(status) if refused_for_good(status.code()) => {
                    debug!(code = ?status.code(), "the gateway refused log lines; dropped");
                    outbox.sent();
                }
                Err(status) => {
                    debug!(code = ?status.code(), "pushing log lines failed; retrying");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                    break;
                }
            }
        }
    }
}

/// Failures a retry cannot mend: the sandbox is gone or not this pusher's
/// any more, or the message itself is wrong.
fn refused_for_good(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::NotFound | Code::PermissionDenied | Code::InvalidArgument | Code::FailedPrecondition
    )
}

/// Numbered messages waiting to be sent, oldest first, at most [`QUEUE`]
/// lines in all (the oldest go first when there are more).
struct Outbox {
    pusher: String,
    next: u64,
    messages: VecDeque<PushSandboxLogsRequest>,
    lines: usize,
}

impl Outbox {
    fn new() -> Self {
        Self {
            pusher: uuid::Uuid::new_v4().simple().to_string(),
            next: 1,
            messages: VecDeque::new(),
            lines: 0,
        }
    }

    fn add(&mut self, messages: Vec<PushSandboxLogsRequest>) {
        for mut message in messages {
            message.pusher = self.pusher.clone();
            message.sequence = self.next;
            self.next += 1;
            self.lines += message.logs.len();
            self.messages.push_back(message);
        }
        while self.lines > QUEUE {
            let Some(oldest) = self.messages.pop_front() else {
                break;
            };
            self.lines -= oldest.logs.len();
            DROPPED.fetch_add(oldest.logs.len() as u64, Ordering::Relaxed);
        }
    }

    /// The oldest message is done with (recorded or refused for good).
    fn sent(&mut self) {
        if let Some(done) = self.messages.pop_front() {
            self.lines -= done.logs.len();
        }
    }
}

/// The pending lines as messages of at most [`BATCH`] lines, one sandbox
/// each, in order; lines of no sandbox are left out.
fn batches(pending: &[SandboxLogLine], own: Option<&str>) -> Vec<PushSandboxLogsRequest> {
    let mut out: Vec<PushSandboxLogsRequest> = Vec::new();
    for line in pending {
        let sandbox = match (line.sandbox_id.as_str(), own) {
            ("", Some(own)) => own,
            ("", None) => continue,
            (id, _) => id,
        };
        match out.last_mut() {
            Some(last) if last.sandbox_id == sandbox && last.logs.len() < BATCH => {
                last.logs.push(line.clone());
            }
            _ => out.push(PushSandboxLogsRequest {
                sandbox_id: sandbox.to_owned(),
                logs: vec![line.clone()],
                ..Default::default()
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(sandbox: &str) -> SandboxLogLine {
        SandboxLogLine {
            sandbox_id: sandbox.into(),
            ..Default::default()
        }
    }

    #[test]
    fn lines_group_by_sandbox_in_order() {
        let pending = [line(""), line("a"), line("a"), line(""), line("b")];
        let own = batches(&pending, Some("own"));
        let ids: Vec<(&str, usize)> = own
            .iter()
            .map(|m| (m.sandbox_id.as_str(), m.logs.len()))
            .collect();
        assert_eq!(ids, [("own", 1), ("a", 2), ("own", 1), ("b", 1)]);
        // A host drops lines of no sandbox.
        let host = batches(&pending, None);
        assert_eq!(host.iter().map(|m| m.logs.len()).sum::<usize>(), 3);
    }

    #[test]
    fn the_outbox_numbers_messages_and_drops_the_oldest_beyond_its_bound() {
        let mut outbox = Outbox::new();
        let message = |n: usize| PushSandboxLogsRequest {
            sandbox_id: "a".into(),
            logs: vec![line("a"); n],
            ..Default::default()
        };
        outbox.add(vec![message(1), message(2)]);
        let numbers: Vec<u64> = outbox.messages.iter().map(|m| m.sequence).collect();
        assert_eq!(numbers, [1, 2]);
        assert!(outbox.messages.iter().all(|m| m.pusher == outbox.pusher));
        outbox.sent();
        assert_eq!((outbox.messages.len(), outbox.lines), (1, 2));
        let before = DROPPED.load(Ordering::Relaxed);
        outbox.add(vec![message(QUEUE)]);
        // The message of 2 lines went to keep QUEUE lines at most.
        assert_eq!(outbox.lines, QUEUE);
        assert_eq!(outbox.messages.front().unwrap().sequence, 3);
        assert!(DROPPED.load(Ordering::Relaxed) >= before + 2);
    }

    #[test]
    fn transport_events_are_not_copied() {
        assert!(!copied("h2::proto"));
        assert!(!copied("tonic"));
        assert!(copied("openshell_supervisor::exec"));
        assert!(copied("h2o"));
    }
}

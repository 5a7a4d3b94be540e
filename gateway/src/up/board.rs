//! What `up` knows of its processes: each one's state, PID, exits and
//! restarts. Every change rewrites `<data>/up/status.json` (read by
//! `openshell-gateway status`) and shows in `up`'s own metrics
//! (`openshell_up_process_exits_total`, `openshell_up_process_restarts_total`,
//! `openshell_up_process_up`, labelled by process and kind), served with
//! the same JSON at `/status` on `up --metrics-listen`.

use std::path::PathBuf;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use super::process::Kind;

/// The status file's name under `<data>/up/`.
pub const STATUS_FILE: &str = "status.json";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    process: String,
    kind: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Running,
    /// Exited; `up` starts it again after the backoff.
    Restarting,
    /// Exited; left down (`--restart never`).
    Down,
    /// Stopped by `up` (Ctrl-C).
    Stopped,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Restarting => "restarting",
            State::Down => "down",
            State::Stopped => "stopped",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub kind: Kind,
    pub state: State,
    /// `None` while it is not running.
    pub pid: Option<u32>,
    /// Exits nobody asked for, failed restarts included.
    pub exits: u64,
    pub restarts: u64,
    /// How the last unexpected exit (or failed start) ended.
    pub last_exit: Option<String>,
    pub log: PathBuf,
}

/// The status file's content.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// `up`'s own PID.
    pub pid: u32,
    pub endpoint: String,
    /// `up`'s status and metrics listener.
    pub metrics: String,
    pub processes: Vec<Entry>,
}

pub struct Board {
    path: PathBuf,
    status: Mutex<Status>,
    /// Held while the status file is written: one writer of its temporary
    /// file at a time, so a rename never moves half a file into place.
    saving: Mutex<()>,
    registry: Registry,
    exits: Family<ProcessLabels, Counter>,
    restarts: Family<ProcessLabels, Counter>,
    up: Family<ProcessLabels, Gauge>,
}

impl Board {
    pub fn new(path: PathBuf, endpoint: String, metrics: String) -> Self {
        let mut registry = Registry::default();
        let exits = Family::<ProcessLabels, Counter>::default();
        let restarts = Family::<ProcessLabels, Counter>::default();
        let up = Family::<ProcessLabels, Gauge>::default();
        registry.register(
            "openshell_up_process_exits",
            "Exits of up's processes that nobody asked for (failed restarts included)",
            exits.clone(),
        );
        registry.register(
            "openshell_up_process_restarts",
            "Times up started one of its processes again after an exit",
            restarts.clone(),
        );
        registry.register(
            "openshell_up_process_up",
            "1 while the process runs, 0 while it is down or restarting",
            up.clone(),
        );
        Self {
            path,
            status: Mutex::new(Status {
                pid: std::process::id(),
                endpoint,
                metrics,
                processes: Vec::new(),
            }),
            saving: Mutex::new(()),
            registry,
            exits,
            restarts,
            up,
        }
    }

    fn labels(entry: &Entry) -> ProcessLabels {
        ProcessLabels {
            process: entry.name.clone(),
            kind: entry.kind.as_str(),
        }
    }

    /// Records a process at its first start.
    pub fn add(&self, name: &str, kind: Kind, pid: u32, log: PathBuf) {
        let entry = Entry {
            name: name.to_owned(),
            kind,
            state: State::Running,
            pid: Some(pid),
            exits: 0,
            restarts: 0,
            last_exit: None,
            log,
        };
        let labels = Self::labels(&entry);
        // Every series exists from the start, at 0.
        self.exits.get_or_create(&labels).inc_by(0);
        self.restarts.get_or_create(&labels).inc_by(0);
        self.up.get_or_create(&labels).set(1);
        self.status.lock().unwrap().processes.push(entry);
        self.save();
    }

    fn change(&self, name: &str, f: impl FnOnce(&mut Entry, &ProcessLabels, &Self)) {
        {
            let mut status = self.status.lock().unwrap();
            let Some(entry) = status.processes.iter_mut().find(|e| e.name == name) else {
                return;
            };
            let labels = Self::labels(entry);
            f(entry, &labels, self);
        }
        self.save();
    }

    pub fn running(&self, name: &str, pid: u32, restarted: bool) {
        self.change(name, |entry, labels, board| {
            entry.state = State::Running;
            entry.pid = Some(pid);
            board.up.get_or_create(labels).set(1);
            if restarted {
                entry.restarts += 1;
                board.restarts.get_or_create(labels).inc();
            }
        });
    }

    /// An exit nobody asked for (or a start that failed): the process is
    /// down until [`Board::restarting`] or [`Board::running`] says more.
    pub fn exited(&self, name: &str, how: &str) {
        self.change(name, |entry, labels, board| {
            entry.state = State::Down;
            entry.pid = None;
            entry.exits += 1;
            entry.last_exit = Some(how.to_owned());
            board.exits.get_or_create(labels).inc();
            board.up.get_or_create(labels).set(0);
        });
    }

    pub fn restarting(&self, name: &str) {
        self.change(name, |entry, _, _| entry.state = State::Restarting);
    }

    pub fn stopped(&self, name: &str) {
        self.change(name, |entry, labels, board| {
            entry.state = State::Stopped;
            entry.pid = None;
            board.up.get_or_create(labels).set(0);
        });
    }

    /// A process's PID while it runs.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        let status = self.status.lock().unwrap();
        status.processes.iter().find(|e| e.name == name)?.pid
    }

    pub fn snapshot(&self) -> Status {
        self.status.lock().unwrap().clone()
    }

    /// One line: how many processes run, and which do not.
    pub fn summary(&self) -> String {
        let status = self.snapshot();
        let total = status.processes.len();
        let down: Vec<String> = status
            .processes
            .iter()
            .filter(|e| e.state != State::Running)
            .map(|e| format!("{} ({})", e.name, e.state.as_str()))
            .collect();
        match down.is_empty() {
            true => format!("cluster: all {total} processes running"),
            false => format!(
                "cluster: {} of {total} processes running; not running: {}",
                total - down.len(),
                down.join(", ")
            ),
        }
    }

    pub fn render_metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    pub fn render_json(&self) -> String {
        serde_json::to_string_pretty(&self.snapshot()).expect("status serializes")
    }

    /// Rewrites the status file (a temporary file renamed over it, so a
    /// reader never sees half of one).
    fn save(&self) {
        let _one_writer = self.saving.lock().unwrap();
        let text = self.render_json();
        let tmp = self.path.with_extension("json.tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(err) = written {
            tracing::warn!(%err, path = %self.path.display(), "writing up's status file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_restarts_and_the_summary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATUS_FILE);
        let board = Board::new(path.clone(), "http://e".into(), "127.0.0.1:1".into());
        board.add("gw-0", Kind::Replica, 10, "gw-0.log".into());
        board.add("h-0", Kind::Host, 11, "h-0.log".into());
        assert_eq!(board.summary(), "cluster: all 2 processes running");
        board.exited("h-0", "signal: 9 (SIGKILL)");
        board.restarting("h-0");
        assert_eq!(
            board.summary(),
            "cluster: 1 of 2 processes running; not running: h-0 (restarting)"
        );
        board.running("h-0", 12, true);
        let saved: Status = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let host = saved.processes.iter().find(|e| e.name == "h-0").unwrap();
        assert_eq!((host.exits, host.restarts, host.pid), (1, 1, Some(12)));
        assert_eq!(host.last_exit.as_deref(), Some("signal: 9 (SIGKILL)"));
        let metrics = board.render_metrics();
        assert!(
            metrics.contains(r#"openshell_up_process_exits_total{process="h-0",kind="host"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"openshell_up_process_up{process="gw-0",kind="replica"} 1"#),
            "{metrics}"
        );
    }
}

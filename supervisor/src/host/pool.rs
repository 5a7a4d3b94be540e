//! The sandboxes a host serves, kept equal to its assignment.
//!
//! Each assigned sandbox runs as one task ([`runtime::run`]); no thread and
//! no buffer of its own beyond what its session and relays hold. An
//! assignment is the full list: sandboxes missing from it are stopped (their
//! processes killed, their directories removed), new ones started. A sandbox
//! that is stopping and assigned again starts once the stop is complete, so
//! two lives of one sandbox never share its directory. The first assignment
//! after a start also removes the directories of sandboxes deleted while the
//! host was down; every sandbox starts once that is done, so a sandbox
//! assigned meanwhile never loses its fresh directory to it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::runtime::{self, HostSettings, Stop};
use crate::limits::Limits;

struct Running {
    stop: watch::Sender<Option<Stop>>,
    task: JoinHandle<()>,
}

/// The running sandboxes of one host.
pub struct Pool {
    settings: Arc<HostSettings>,
    /// Whether the removal of directories left by a previous life of the
    /// host was started (on the first assignment).
    sweeping: bool,
    /// Cancelled once that removal is done: every sandbox starts after it,
    /// so it never removes the directory of a sandbox assigned meanwhile.
    swept: CancellationToken,
    running: HashMap<String, Running>,
    /// Stopped on unassignment, possibly still winding down.
    stopping: HashMap<String, JoinHandle<()>>,
}

impl Pool {
    pub fn new(settings: Arc<HostSettings>) -> Self {
        Self {
            settings,
            sweeping: false,
            swept: CancellationToken::new(),
            running: HashMap::new(),
            stopping: HashMap::new(),
        }
    }

    /// The sandboxes served now, sorted.
    pub fn serving(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.running.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Makes the running set equal to `assigned` (ids with their limits):
    /// stops what is missing, starts what is new. Ids that cannot name a
    /// directory are skipped. A sandbox's limits are those of its first
    /// assignment (the gateway fixes them at creation).
    pub fn assign<I, S>(&mut self, assigned: I)
    where
        I: IntoIterator<Item = (S, Limits)>,
        S: Into<String>,
    {
        let mut wanted = BTreeMap::new();
        for (id, limits) in assigned {
            let id = id.into();
            if runtime::sandbox_dir(&self.settings.root, &id).is_none() {
                warn!(
                    sandbox_id = id,
                    "assigned sandbox id is not a plain name; skipped"
                );
                continue;
            }
            wanted.insert(id, limits);
        }
        self.stopping.retain(|_, task| !task.is_finished());
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|id| !wanted.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let running = self.running.remove(&id).expect("listed above");
            info!(sandbox_id = id, "sandbox unassigned: stopping");
            running.stop.send_replace(Some(Stop::Unassigned));
            self.stopping.insert(id, running.task);
        }
        if !self.sweeping {
            self.sweeping = true;
            let keep: BTreeSet<String> = wanted.keys().cloned().collect();
            let root = self.settings.root.clone();
            // Done, even if the sweep panicked: sandboxes must start.
            let done = self.swept.clone().drop_guard();
            tokio::task::spawn_blocking(move || {
                let _done = done;
                sweep(&root, &keep);
            });
        }
        for (id, limits) in wanted {
            if self.running.contains_key(&id) {
                continue;
            }
            info!(sandbox_id = id, "sandbox assigned: starting");
            let (stop, stopped) = watch::channel(None);
            let previous = self.stopping.remove(&id);
            let settings = self.settings.clone();
            let sandbox_id = id.clone();
            let swept = self.swept.clone();
            // Boxed first, as relays are (`session::Relays::open`).
            let task = tokio::spawn(Box::pin(async move {
                // A sandbox assigned after the first assignment may not be
                // in the sweep's list: its directory comes after the sweep.
                swept.cancelled().await;
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                runtime::run(settings, sandbox_id, limits, stopped).await;
            }));
            self.running.insert(id, Running { stop, task });
        }
    }

    /// Stops every sandbox for host shutdown (files stay) and waits until
    /// all of them stopped, unassigned ones included.
    pub async fn shutdown(&mut self) {
        let mut tasks: Vec<JoinHandle<()>> = self.stopping.drain().map(|(_, task)| task).collect();
        for (_, running) in self.running.drain() {
            running.stop.send_replace(Some(Stop::Shutdown));
            tasks.push(running.task);
        }
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// Removes the directories of sandboxes that were deleted while the host
/// was down: under `root`, every directory with a sandbox's layout (a
/// `work/` or an SSH host key) whose name is not in `keep`. Anything else
/// under the root is left alone.
fn sweep(root: &Path, keep: &BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let path = entry.path();
        let is_sandbox = entry.file_type().is_ok_and(|t| t.is_dir())
            && runtime::sandbox_dir(root, &name).is_some()
            && (path.join(runtime::WORK_DIR).is_dir()
                || path.join(runtime::SSH_HOST_KEY_FILE).is_file());
        if is_sandbox && !keep.contains(&name) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => info!(
                    sandbox_id = name,
                    "removed the directory of a sandbox no longer assigned"
                ),
                Err(err) => {
                    warn!(sandbox_id = name, error = %err, "removing a stale sandbox directory failed")
                }
            }
        }
    }
}

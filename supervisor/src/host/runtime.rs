//! One sandbox served by a host: its files, its init, its session.
//!
//! Layout under the host's `--root`: `<root>/<sandbox_id>/` (mode 0700,
//! the host's) holds the SSH host key `ssh_host_ed25519_key` and the
//! working directory `work/` (the sandbox's `HOME`, with the configuration
//! in `work/.openshell/config.json`). Isolated, the init hides the whole
//! root from the sandbox and binds its own `work/` back, so a sandbox sees
//! neither its key nor its neighbours.
//!
//! A runtime lives from assignment to unassignment (or host shutdown). The
//! session inside the host's session may end and start again many times in
//! between (the host reconnects, or moves to another replica); relays and
//! processes go on through that ([`RelayScope::Runtime`]). If the sandbox's
//! init exits, everything of the sandbox is stopped and the init started
//! again after [`INIT_RESTART_DELAY`] (doubling while it keeps failing, up
//! to [`RESTART_DELAY_MAX`]): execs cannot enter a sandbox whose PID 1 is
//! gone.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use openshell_sdk::ConfigSessionBuilder;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

use crate::exec::ExecSettings;
use crate::isolation::{self, spawner::Spawner};
use crate::limits::{Cgroup, Limits};
use crate::sandbox_processes;
use crate::session::{self, RelayScope, SandboxServing};
use crate::ssh::HostKey;
use crate::transport::BearerToken;

/// The sandbox's working directory, under its directory.
pub const WORK_DIR: &str = "work";
/// The sandbox's SSH host key, under its directory.
pub const SSH_HOST_KEY_FILE: &str = "ssh_host_ed25519_key";
/// How long a stopping sandbox's relays get to wind down, and its processes
/// to be reaped.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// Pause before a sandbox whose init exited (or whose setup failed) is
/// started again; doubled on every failure in a row, up to
/// [`RESTART_DELAY_MAX`].
pub const INIT_RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest pause between restarts; a life that lasted this long resets
/// the pause.
pub const RESTART_DELAY_MAX: Duration = Duration::from_secs(30);

/// Builds the session of a sandbox (host mode: inside the host's session).
pub type SessionSource = Arc<dyn Fn(&str) -> ConfigSessionBuilder + Send + Sync>;

/// What every sandbox of a host shares.
pub struct HostSettings {
    /// `--root`, absolute.
    pub root: PathBuf,
    /// Starts inits under `--isolation namespaces`; `None`: no isolation.
    pub spawner: Option<Spawner>,
    /// `--hide`, plus the root itself.
    pub hide: Vec<PathBuf>,
    /// Networks no sandbox may reach (`--egress-deny` and the gateway's).
    pub egress_deny: Vec<crate::egress::Net>,
    /// The host token: relays are claimed with it.
    pub token: BearerToken,
    pub sessions: SessionSource,
}

/// Why a runtime stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Unassigned: the sandbox is gone, so are its files.
    Unassigned,
    /// The host stops; files stay for the next start.
    Shutdown,
}

/// The directory of `sandbox_id` under `root`, if the id is a plain name
/// (an id comes from the gateway, but a path is built from it).
pub fn sandbox_dir(root: &Path, sandbox_id: &str) -> Option<PathBuf> {
    let plain = !sandbox_id.is_empty()
        && sandbox_id.len() <= 128
        && sandbox_id != "."
        && sandbox_id != ".."
        && sandbox_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    plain.then(|| root.join(sandbox_id))
}

/// Serves `sandbox_id` until `stop` says why it must end, then stops it:
/// relays cancelled, processes killed, and on [`Stop::Unassigned`] its
/// directory removed. Returns once all of that is done.
pub async fn run(
    settings: Arc<HostSettings>,
    sandbox_id: String,
    limits: Limits,
    mut stop: watch::Receiver<Option<Stop>>,
) {
    let Some(dir) = sandbox_dir(&settings.root, &sandbox_id) else {
        error!(sandbox_id, "not a usable sandbox id; not served");
        return;
    };
    let mut delay = INIT_RESTART_DELAY;
    let reason = loop {
        let started = tokio::time::Instant::now();
        // Starting and stopping are boxed: their state exists only while
        // they run, not in every served sandbox's task.
        let life = tokio::select! {
            life = Box::pin(Life::start(&settings, &sandbox_id, &limits, &dir)) => life,
            reason = stopped(&mut stop) => break reason,
        };
        match life {
            Ok(life) => {
                let stop_now = tokio::select! {
                    outcome = life.serve(&settings) => {
                        if let Err(err) = outcome {
                            error!(sandbox_id, "{err:#}");
                        }
                        None
                    }
                    reason = stopped(&mut stop) => Some(reason),
                };
                Box::pin(life.stop()).await;
                if let Some(reason) = stop_now {
                    break reason;
                }
            }
            Err(err) => error!(sandbox_id, "{err:#}"),
        }
        // A sandbox that keeps failing is retried ever more slowly.
        if started.elapsed() >= RESTART_DELAY_MAX {
            delay = INIT_RESTART_DELAY;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            reason = stopped(&mut stop) => break reason,
        }
        delay = (delay * 2).min(RESTART_DELAY_MAX);
    };
    if reason == Stop::Unassigned
        && let Err(err) = tokio::fs::remove_dir_all(&dir).await
        && err.kind() != std::io::ErrorKind::NotFound
    {
        warn!(sandbox_id, error = %err, "removing the sandbox directory failed");
    }
    info!(sandbox_id, ?reason, "sandbox stopped");
}

async fn stopped(stop: &mut watch::Receiver<Option<Stop>>) -> Stop {
    match stop.wait_for(Option::is_some).await {
        Ok(reason) => reason.unwrap_or(Stop::Shutdown),
        // The pool is gone: the host is going.
        Err(_) => Stop::Shutdown,
    }
}

/// One life of the sandbox: from its files and init to the last process.
struct Life {
    serving: SandboxServing,
    isolated: Option<isolation::Sandbox>,
    /// The sandbox's control group (with limits), removed at stop.
    cgroup: Option<Arc<Cgroup>>,
    /// Handed to every relay; dropped at stop, so that `relays_done`
    /// resolves once the last relay let go.
    alive: Option<mpsc::Sender<()>>,
    relays_done: mpsc::Receiver<()>,
}

impl Life {
    /// Files, SSH host key, and (isolated) the init.
    async fn start(
        settings: &HostSettings,
        sandbox_id: &str,
        limits: &Limits,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let workdir = dir.join(WORK_DIR);
        let key_path = dir.join(SSH_HOST_KEY_FILE);
        let cgroup = {
            let (sandbox_id, limits) = (sandbox_id.to_owned(), *limits);
            tokio::task::spawn_blocking(move || {
                let (limits, missing) = limits.enforceable();
                if !missing.is_empty() {
                    let names: Vec<&str> = missing.iter().map(|c| c.name()).collect();
                    warn!(
                        sandbox_id,
                        missing = names.join(","),
                        "this host cannot enforce these limits of the sandbox (no writable \
                         cgroup controller); it runs without them"
                    );
                }
                Cgroup::create(&sandbox_id, &limits)
            })
            .await
            .context("sandbox setup")?
            .context("limiting the sandbox's resources")?
            .map(Arc::new)
        };
        let created = {
            let (dir, workdir) = (dir.to_path_buf(), workdir.clone());
            tokio::task::spawn_blocking(move || -> anyhow::Result<anyhow::Result<HostKey>> {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                std::fs::create_dir_all(&workdir)
                    .with_context(|| format!("creating {}", workdir.display()))?;
                Ok(HostKey::load_or_create(&key_path))
            })
            .await
            .context("sandbox setup")??
        };
        let ssh_host_key = match created {
            Ok(key) => Some(key),
            Err(err) => {
                error!(sandbox_id, "{err:#}; ssh relays will be refused");
                None
            }
        };
        let isolated = match &settings.spawner {
            Some(spawner) => Some(
                spawner
                    .start_sandbox(
                        sandbox_id,
                        workdir.clone(),
                        settings.hide.clone(),
                        cgroup.clone(),
                    )
                    .await
                    .context("isolating the sandbox")?,
            ),
            None => None,
        };
        let serving = SandboxServing {
            exec: Arc::new(ExecSettings {
                sandbox_init: isolated.as_ref().map(isolation::Sandbox::init_pidfd),
                cgroup: cgroup.clone(),
                egress: isolated.as_ref().map(|sandbox| {
                    Arc::new(crate::egress::Egress::new(
                        sandbox.init_pidfd(),
                        &settings.egress_deny,
                    ))
                }),
                ..ExecSettings::new(sandbox_id.to_owned(), workdir)
            }),
            ssh_host_key,
            token: settings.token.clone(),
            relay_scope: RelayScope::Runtime,
        };
        info!(
            sandbox_id,
            init_pid = isolated.as_ref().map(isolation::Sandbox::init_pid),
            "sandbox started"
        );
        let (alive, relays_done) = mpsc::channel(1);
        Ok(Self {
            serving,
            isolated,
            cgroup,
            alive: Some(alive),
            relays_done,
        })
    }

    /// Runs the sandbox's session and relays; ends (with the reason) only
    /// if the init exits or the session cannot run. Dropping it cancels the
    /// relays.
    async fn serve(&self, settings: &HostSettings) -> anyhow::Result<()> {
        let sandbox_id = &self.serving.exec.sandbox_id;
        let alive = self.alive.clone().context("sandbox stopped")?;
        let (connected, _) = watch::channel(false);
        let session = (settings.sessions)(sandbox_id);
        let init_exited = async {
            match &self.isolated {
                Some(sandbox) => sandbox.exited().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = session::run(&self.serving, session, alive, connected) => {
                result?;
                anyhow::bail!("the sandbox session ended");
            }
            () = init_exited => anyhow::bail!("the sandbox init exited"),
        }
    }

    /// After `serve` is gone (its relays cancelled): waits for the relays
    /// to let go, then kills whatever the sandbox left running.
    async fn stop(mut self) {
        self.alive = None;
        if tokio::time::timeout(STOP_GRACE, self.relays_done.recv())
            .await
            .is_err()
        {
            warn!(
                sandbox_id = self.serving.exec.sandbox_id,
                "relays still running after the sandbox stopped"
            );
        }
        match self.isolated.take() {
            Some(mut sandbox) => {
                let _ = tokio::task::spawn_blocking(move || sandbox.kill()).await;
            }
            None => {
                sandbox_processes::kill_sandbox(&self.serving.exec.sandbox_id, STOP_GRACE).await
            }
        }
        if let Some(cgroup) = self.cgroup.take() {
            let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
        }
    }
}

//! One process of the developer cluster, kept running: how it is started
//! ([`Spec`]), how `up` waits until it serves, and the task that watches it
//! ([`supervise`]). A process that exits without being asked to is logged
//! (exit status, log path) and counted on the [`Board`]; then, by
//! [`Restart`], it is started again after a backoff (1 s, doubling to 30 s,
//! back to 1 s once it stayed up for a minute) or left down. Stopping is
//! by PID: SIGTERM, SIGKILL after 15 s. Each process gets SIGTERM from the
//! kernel when `up` dies (`PR_SET_PDEATHSIG`): every spawn happens on the
//! main thread or a runtime worker, which live as long as `up`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::board::Board;
use super::say;

/// The first wait before a restart; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A process that ran this long before it exited restarts after
/// [`FIRST_BACKOFF`] again.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// How long a process gets to serve (its ready file) after a start.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a process gets to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// What `up` does with a process that exited without being asked to
/// (`up --restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Restart {
    /// Start it again after a backoff.
    Always,
    /// Leave it down until `up` stops (for failover tests).
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Replica,
    Edge,
    Host,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Replica => "replica",
            Kind::Edge => "edge",
            Kind::Host => "host",
        }
    }
}

/// How to start one process, again and again.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub kind: Kind,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Variables added to `up`'s environment.
    pub env: Vec<(String, String)>,
    pub log: PathBuf,
    /// The file the process writes once it serves (replicas and the edge);
    /// a host has none and counts as running once started.
    pub ready_file: Option<PathBuf>,
}

impl Spec {
    pub fn new(name: &str, kind: Kind, program: &Path, log: PathBuf) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            program: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            log,
            ready_file: None,
        }
    }

    pub fn arg(&mut self, arg: impl Into<OsString>) -> &mut Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(&mut self, args: I) -> &mut Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Replaces the value after `flag` (a replica restarts on the ports it
    /// was given first, so the edge's routes and the banner stay right).
    pub fn set_value(&mut self, flag: &str, value: &str) {
        if let Some(i) = self.args.iter().position(|a| a == flag)
            && let Some(slot) = self.args.get_mut(i + 1)
        {
            *slot = value.into();
        }
    }

    /// Starts the process; `fresh_log` truncates its log (the first start),
    /// else the log is appended to, so a crash's last lines stay.
    pub fn spawn(&self, fresh_log: bool) -> anyhow::Result<Child> {
        if let Some(ready) = &self.ready_file {
            let _ = std::fs::remove_file(ready);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(!fresh_log)
            .truncate(fresh_log)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let up = std::process::id() as libc::pid_t;
        let mut command = Command::new(&self.program);
        // SAFETY: between fork and exec the child only calls prctl(2),
        // getppid(2) and _exit(2), which are async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                // `up` dying (even by SIGKILL) stops this process: SIGTERM,
                // its ordinary shutdown. Checked after, in case `up` died
                // before the request took effect.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() != up {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(false)
            // Its own process group: a Ctrl-C at the terminal reaches `up`
            // alone, which stops its processes in order (they would
            // otherwise exit at once, and look like crashes to restart).
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {} {}", self.kind.as_str(), self.name))
    }

    /// Waits until the process serves: its ready file's JSON, or `Null` for
    /// a process without one.
    pub async fn wait_ready(&self, child: &mut Child) -> anyhow::Result<serde_json::Value> {
        let Some(path) = &self.ready_file else {
            return Ok(serde_json::Value::Null);
        };
        let name = &self.name;
        let log = self.log.display();
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(path)
                && let Ok(value) = serde_json::from_str(&text)
            {
                return Ok(value);
            }
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited during start-up ({status}); see {log}");
            }
            if started.elapsed() > READY_WITHIN {
                bail!("{name} not ready after 30 s; see {log}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// SIGTERM to `child`, then SIGKILL if it has not exited after 15 s.
pub async fn terminate(name: &str, child: &mut Child) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) has no memory-safety preconditions; the child is
        // not reaped yet (`id` is `None` once it is), so the PID is its own.
        unsafe {
            libc::kill(pid as i32, libc::SIGTERM);
        }
    }
    if tokio::time::timeout(STOP_GRACE, child.wait())
        .await
        .is_err()
    {
        tracing::warn!(process = name, "did not stop in time; killing it");
        let _ = child.kill().await;
    }
}

/// An order for one process from `up --control stdin`; the answer goes
/// back once it is carried out (the process exited, or serves again).
#[derive(Debug)]
pub struct Order {
    pub action: Action,
    pub done: tokio::sync::oneshot::Sender<Result<String, String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// SIGTERM (SIGKILL after 15 s); it stays down until `Start`.
    Stop,
    /// SIGKILL; it stays down until `Start`.
    Kill,
    /// Starts a process that is down (stopped, killed, or left down).
    Start,
}

/// Watches `child` (started from `spec`) until `stop` fires, then stops it;
/// carries out the `orders` meanwhile.
pub fn supervise(
    spec: Spec,
    child: Child,
    board: Arc<Board>,
    restart: Restart,
    stop: CancellationToken,
    mut orders: tokio::sync::mpsc::Receiver<Order>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let name = spec.name.clone();
        let mut child = Some(child);
        let mut backoff = FIRST_BACKOFF;
        loop {
            // Down: asked to (an order) or left down (`--restart never`);
            // only a `Start` order (or the end) moves it.
            let Some(running) = child.as_mut() else {
                let order = tokio::select! {
                    _ = stop.cancelled() => None,
                    order = orders.recv() => order,
                };
                let Some(order) = order else {
                    stop.cancelled().await;
                    board.stopped(&name);
                    return;
                };
                if order.action != Action::Start {
                    let _ = order.done.send(Ok(format!("{name} is not running")));
                    continue;
                }
                let started = tokio::select! {
                    _ = stop.cancelled() => {
                        let _ = order.done.send(Err("up is stopping".into()));
                        board.stopped(&name);
                        return;
                    }
                    started = start_ready(&spec, &stop) => started,
                };
                match started {
                    Ok(next) => {
                        let pid = next.id().unwrap_or_default();
                        board.running(&name, pid, false);
                        say(&format!("{name} started (pid {pid})"));
                        let _ = order.done.send(Ok(format!("{name} started (pid {pid})")));
                        child = Some(next);
                        backoff = FIRST_BACKOFF;
                    }
                    Err(err) => {
                        board.exited(&name, &err);
                        let _ = order.done.send(Err(format!("{name} did not start: {err}")));
                    }
                }
                continue;
            };
            let started = Instant::now();
            let status = tokio::select! {
                status = running.wait() => status,
                _ = stop.cancelled() => {
                    terminate(&name, running).await;
                    board.stopped(&name);
                    return;
                }
                Some(order) = orders.recv() => {
                    if order.action == Action::Start {
                        let _ = order.done.send(Ok(format!("{name} is running")));
                        continue;
                    }
                    let how = match order.action {
                        Action::Kill => {
                            let _ = running.kill().await;
                            "killed"
                        }
                        _ => {
                            terminate(&name, running).await;
                            "stopped"
                        }
                    };
                    child = None;
                    board.stopped(&name);
                    say(&format!("{name} {how} (control order); down until started"));
                    say(&board.summary());
                    let _ = order.done.send(Ok(format!("{name} {how}")));
                    continue;
                }
            };
            let status = match status {
                Ok(status) => status.to_string(),
                Err(err) => format!("wait failed: {err}"),
            };
            let log = spec.log.display().to_string();
            tracing::error!(process = name, status, log, "exited unexpectedly");
            board.exited(&name, &status);
            if restart == Restart::Never {
                say(&format!(
                    "{name} exited unexpectedly ({status}); left down (--restart never); log: {log}"
                ));
                say(&board.summary());
                child = None;
                continue;
            }
            if started.elapsed() >= STABLE_AFTER {
                backoff = FIRST_BACKOFF;
            }
            board.restarting(&name);
            say(&format!(
                "{name} exited unexpectedly ({status}); restarting it in {} s; log: {log}",
                backoff.as_secs()
            ));
            say(&board.summary());
            match restart_until_ready(&spec, &board, &stop, &mut backoff, &mut orders).await {
                Restarted::Running(next) => child = Some(next),
                Restarted::Held => child = None,
                Restarted::Stopping => {
                    board.stopped(&name);
                    return;
                }
            }
        }
    })
}

/// Starts the process once and waits until it serves; a start that fails
/// is stopped again. `Err` says why.
async fn start_ready(spec: &Spec, stop: &CancellationToken) -> Result<Child, String> {
    let mut child = spec.spawn(false).map_err(|err| format!("{err:#}"))?;
    let ready = tokio::select! {
        ready = spec.wait_ready(&mut child) => ready,
        _ = stop.cancelled() => Err(anyhow::anyhow!("up is stopping")),
    };
    match ready {
        Ok(_) => Ok(child),
        Err(err) => {
            terminate(&spec.name, &mut child).await;
            Err(format!("{err:#}"))
        }
    }
}

/// How a restart ended.
enum Restarted {
    Running(Child),
    /// A `stop` or `kill` order came during the backoff: held down.
    Held,
    /// `up` is stopping.
    Stopping,
}

/// Starts the process again after `backoff` (growing it) until one start
/// serves. Orders are taken during the backoff: `stop` or `kill` holds the
/// process down, `start` starts it at once.
async fn restart_until_ready(
    spec: &Spec,
    board: &Board,
    stop: &CancellationToken,
    backoff: &mut Duration,
    orders: &mut tokio::sync::mpsc::Receiver<Order>,
) -> Restarted {
    let name = &spec.name;
    // A `start` order taken during the backoff, answered by the start.
    let mut waiting: Option<tokio::sync::oneshot::Sender<Result<String, String>>> = None;
    loop {
        board.restarting(name);
        tokio::select! {
            _ = tokio::time::sleep(*backoff) => {}
            _ = stop.cancelled() => return Restarted::Stopping,
            Some(order) = orders.recv() => {
                if order.action == Action::Start {
                    waiting = Some(order.done);
                } else {
                    board.stopped(name);
                    say(&format!("{name} held down (control order during its restart backoff)"));
                    let _ = order.done.send(Ok(format!("{name} stopped")));
                    return Restarted::Held;
                }
            }
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        match start_ready(spec, stop).await {
            Ok(child) => {
                let pid = child.id().unwrap_or_default();
                board.running(name, pid, true);
                say(&format!("{name} is back (pid {pid})"));
                say(&board.summary());
                if let Some(done) = waiting.take() {
                    let _ = done.send(Ok(format!("{name} started (pid {pid})")));
                }
                return Restarted::Running(child);
            }
            Err(_) if stop.is_cancelled() => return Restarted::Stopping,
            Err(err) => {
                if let Some(done) = waiting.take() {
                    let _ = done.send(Err(format!("{name} did not start: {err}")));
                }
                board.exited(name, &err);
                say(&format!(
                    "{name} failed to come back: {err}; next try in {} s",
                    backoff.as_secs()
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_value_replaces_the_flag_value_only() {
        let mut spec = Spec::new("gw-0", Kind::Replica, Path::new("gw"), "log".into());
        spec.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ]);
        spec.set_value("--listen", "127.0.0.1:4000");
        spec.set_value("--absent", "x");
        let args: Vec<_> = spec.args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "serve",
                "--listen",
                "127.0.0.1:4000",
                "--metrics-listen",
                "127.0.0.1:0"
            ]
        );
    }
}

//! The process sandbox driver: a sandbox is a directory on this host plus one
//! `openshell-supervisor` process that keeps a session to the gateway and
//! runs the sandbox's processes.
//!
//! Supervisors run in their own process group, so a Ctrl-C aimed at the
//! gateway's terminal does not reach them, and they outlive a gateway restart:
//! the new gateway adopts a live supervisor (matched by PID and command line)
//! or starts a fresh one with a fresh token. `supervisor.pid` in the sandbox
//! directory names the process for operators and test harnesses, and is the
//! fallback when the store has no (or a stale) pid: stopping a sandbox signals
//! whichever of the two is still a supervisor of that sandbox.
//!
//! Starting and stopping one sandbox's supervisor never interleave: callers
//! hold [`ProcessDriver::lock`] across start-and-record and stop-and-remove.
//!
//! Supervisors start clean: an empty environment plus a short allow-list
//! ([`SUPERVISOR_ENV`]), so no user token, peer token or database URL of the
//! gateway reaches them, and the sandbox token arrives on an inherited pipe
//! (`--token-fd 3`), never in the command line or the environment. With
//! [`Isolation::Namespaces`] each supervisor runs its sandbox's processes in
//! namespaces of their own, with the data directory and the gateway's other
//! secret files hidden (see the supervisor's `isolation` module).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, mpsc};

use crate::sandboxes::limits::Limits;

/// A supervisor that exited while the driver was watching it.
#[derive(Debug)]
pub struct SupervisorExit {
    pub sandbox_id: String,
    pub pid: i32,
    pub status: String,
}

/// The only variables of the gateway's environment a supervisor inherits.
/// Nothing secret: the sandbox token goes through a pipe.
pub const SUPERVISOR_ENV: [&str; 6] =
    ["PATH", "LANG", "LC_ALL", "TZ", "RUST_LOG", "RUST_BACKTRACE"];
/// In a sandbox's directory: why its supervisor cannot reach the gateway,
/// written by the supervisor while it has no session.
pub const STATUS_FILE: &str = "supervisor.status";
/// The descriptor the sandbox token arrives on.
const TOKEN_FD: i32 = 3;
/// The file in the sandbox directory naming the supervisor's pid.
const PID_FILE: &str = "supervisor.pid";
/// The sandbox's SSH host key (ed25519, OpenSSH format, mode 0600): made
/// by its supervisor on first start, kept across restarts, outside the
/// working directory, so sandbox processes never see it.
pub const SSH_HOST_KEY_FILE: &str = "ssh_host_ed25519_key";
/// How long a supervisor gets to exit after SIGTERM before its group is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// How sandbox processes are isolated (`--isolation`, resolved at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Sandbox processes run beside the supervisor, as its user.
    None,
    /// Their own user, PID and mount namespaces, an unprivileged uid, the
    /// data directory and the gateway's secret files hidden.
    Namespaces,
}

impl Isolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Namespaces => "namespaces",
        }
    }
}

/// Which driver runs sandboxes (hidden `--driver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DriverKind {
    /// A directory and one supervisor process per sandbox.
    Process,
    /// Tests and benchmarks only: the directory and a token file, no
    /// process. The sandbox stays PROVISIONING until something opens its
    /// session with the token from `<dir>/token` (mode 0600).
    None,
    /// Shared supervisor hosts: a new sandbox is assigned to the connected
    /// host serving the fewest sandboxes, which runs it; no process here.
    Hosts,
}

pub struct ProcessDriver {
    data_dir: PathBuf,
    /// False for `--driver none`: no supervisor is started.
    spawn: bool,
    supervisor_bin: PathBuf,
    /// The gateway URL supervisors dial.
    gateway_url: String,
    ca_file: Option<PathBuf>,
    isolation: Isolation,
    /// Paths sandbox processes must not see (namespaces only).
    hide: Vec<PathBuf>,
    /// Networks sandboxes may never reach (namespaces only).
    egress_deny: Vec<String>,
    /// Benchmarks only: sandboxes keep the host's network.
    host_network: bool,
    /// Tests only (`--expose-sandbox-tokens`): also write each token to
    /// `<sandbox dir>/token` (mode 0600; hidden from the sandbox).
    expose_tokens: bool,
    exits: mpsc::UnboundedSender<SupervisorExit>,
    /// One lock per sandbox with a start or stop in progress.
    locks: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl ProcessDriver {
    pub fn new(
        data_dir: PathBuf,
        supervisor_bin: PathBuf,
        gateway_url: String,
        ca_file: Option<PathBuf>,
    ) -> (Self, mpsc::UnboundedReceiver<SupervisorExit>) {
        let (exits, rx) = mpsc::unbounded_channel();
        (
            Self {
                data_dir,
                spawn: true,
                supervisor_bin,
                gateway_url,
                ca_file,
                isolation: Isolation::None,
                hide: Vec::new(),
                egress_deny: Vec::new(),
                host_network: false,
                expose_tokens: false,
                exits,
                locks: Mutex::default(),
            },
            rx,
        )
    }

    /// Runs sandbox processes with `isolation`, hiding `hide` (besides the
    /// data directory) from them.
    pub fn with_isolation(mut self, isolation: Isolation, hide: Vec<PathBuf>) -> Self {
        self.isolation = isolation;
        self.hide = hide;
        self
    }

    /// `--sandbox-host-network` (benchmarks only).
    pub fn with_host_network(mut self, host_network: bool) -> Self {
        self.host_network = host_network;
        self
    }

    /// `--sandbox-egress-deny`.
    pub fn with_egress_deny(mut self, deny: Vec<String>) -> Self {
        self.egress_deny = deny;
        self
    }

    /// Tests only: keep a copy of each sandbox token in its directory.
    pub fn exposing_tokens(mut self) -> Self {
        self.expose_tokens = true;
        self
    }

    /// `--driver none`: sandboxes get their directory and a token file but
    /// no supervisor.
    pub fn without_processes(mut self) -> Self {
        self.spawn = false;
        self
    }

    /// Where the sandbox directories are.
    pub fn sandboxes_root(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }

    pub fn sandbox_dir(&self, sandbox_id: &str) -> PathBuf {
        self.data_dir.join("sandboxes").join(sandbox_id)
    }

    /// Serializes the lifecycle of one sandbox in this process: a create's
    /// start-and-record and a delete's stop-and-remove never interleave, so
    /// a delete never misses a supervisor that is being started.
    pub async fn lock(&self, sandbox_id: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap();
            locks.retain(|_, lock| lock.strong_count() > 0);
            match locks.get(sandbox_id).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    locks.insert(sandbox_id.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// The pid `supervisor.pid` names, if it is a running supervisor of
    /// this sandbox.
    pub fn pid_file_supervisor(&self, sandbox_id: &str) -> Option<i32> {
        let text = std::fs::read_to_string(self.sandbox_dir(sandbox_id).join(PID_FILE)).ok()?;
        text.trim()
            .parse()
            .ok()
            .filter(|pid| is_our_supervisor(*pid, sandbox_id))
    }

    /// Tests only (`--expose-sandbox-tokens`): keeps a copy of a pooled
    /// sandbox's token in its directory, which holds nothing else.
    pub async fn keep_token_copy(&self, sandbox_id: &str, token: &str) -> std::io::Result<()> {
        if !self.expose_tokens {
            return Ok(());
        }
        let dir = self.sandbox_dir(sandbox_id);
        tokio::fs::create_dir_all(&dir).await?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        write_token_file(&dir.join("token"), token).await
    }

    /// Creates the sandbox's directory and starts its supervisor.
    pub async fn start(
        &self,
        sandbox_id: &str,
        token: &str,
        limits: &Limits,
    ) -> std::io::Result<i32> {
        let dir = self.sandbox_dir(sandbox_id);
        let workdir = dir.join("work");
        tokio::fs::create_dir_all(&workdir).await?;
        // The sandbox's own files (log, pid, token copy) are the gateway's.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        if !self.spawn || self.expose_tokens {
            write_token_file(&dir.join("token"), token).await?;
        }
        if !self.spawn {
            return Ok(0);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("supervisor.log"))?;
        let token_pipe = token_pipe(token)?;
        let token_fd = token_pipe.as_raw_fd();
        let mut command = tokio::process::Command::new(&self.supervisor_bin);
        command
            .arg("--gateway")
            .arg(&self.gateway_url)
            .arg("--sandbox-id")
            .arg(sandbox_id)
            .arg("--workdir")
            .arg(&workdir)
            .arg("--token-fd")
            .arg(TOKEN_FD.to_string())
            .arg("--status-file")
            .arg(dir.join(STATUS_FILE))
            .arg("--ssh-host-key")
            .arg(dir.join(SSH_HOST_KEY_FILE))
            .env_clear()
            .envs(
                SUPERVISOR_ENV
                    .iter()
                    .filter_map(|k| Some((k, std::env::var_os(k)?))),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(ca) = &self.ca_file {
            command.arg("--ca-file").arg(ca);
        }
        command.args(limits.supervisor_args());
        if self.isolation == Isolation::Namespaces {
            command.arg("--isolation").arg("namespaces");
            command.arg("--hide").arg(&self.data_dir);
            for path in &self.hide {
                command.arg("--hide").arg(path);
            }
            for net in &self.egress_deny {
                command.arg("--egress-deny").arg(net);
            }
            if self.host_network {
                command.arg("--host-network");
            }
        }
        // SAFETY: the hook only calls dup2 and fcntl, which are
        // async-signal-safe.
        unsafe {
            command.pre_exec(move || inherit_as(token_fd, TOKEN_FD));
        }
        let mut child = command.spawn()?;
        drop(token_pipe);
        // From here on the supervisor runs: nothing may fail without
        // handing its pid back, or nobody would know to stop it.
        let pid = child.id().map(|p| p as i32).unwrap_or_default();
        let exits = self.exits.clone();
        let owner = sandbox_id.to_owned();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(err) => err.to_string(),
            };
            let _ = exits.send(SupervisorExit {
                sandbox_id: owner,
                pid,
                status,
            });
        });
        if let Err(err) = tokio::fs::write(dir.join(PID_FILE), format!("{pid}\n")).await {
            tracing::warn!(sandbox_id, pid, %err, "could not write supervisor.pid");
        }
        Ok(pid)
    }

    /// Whether the live supervisor `pid` was started the way this driver
    /// starts them now: same isolation, token on a descriptor.
    pub fn runs_as_configured(&self, pid: i32) -> bool {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            return false;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let isolated = args
            .windows(2)
            .any(|pair| pair == [b"--isolation".as_slice(), b"namespaces".as_slice()]);
        let token_fd = args.contains(&b"--token-fd".as_slice());
        token_fd && isolated == (self.isolation == Isolation::Namespaces)
    }

    /// Stops the supervisor (SIGTERM, then SIGKILL of its group after 5 s)
    /// and removes the sandbox directory. `recorded` is the pid the store
    /// holds; `supervisor.pid` is checked too, so a supervisor whose pid
    /// never reached the store (or a stale store pid) is still stopped.
    pub async fn stop(&self, sandbox_id: &str, recorded: Option<i32>) {
        let mut pids: Vec<i32> = recorded
            .filter(|pid| is_our_supervisor(*pid, sandbox_id))
            .into_iter()
            .collect();
        if let Some(pid) = self.pid_file_supervisor(sandbox_id)
            && !pids.contains(&pid)
        {
            tracing::info!(
                sandbox_id,
                pid,
                recorded,
                "stopping the supervisor supervisor.pid names"
            );
            pids.push(pid);
        }
        terminate(sandbox_id, &pids).await;
        let dir = self.sandbox_dir(sandbox_id);
        if let Err(err) = tokio::fs::remove_dir_all(&dir).await
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(sandbox_id, %err, "could not remove sandbox directory");
        }
    }

    /// Stops the supervisor but keeps the sandbox directory (gateway exit
    /// with `--stop-sandboxes-on-exit`).
    pub async fn stop_process(&self, sandbox_id: &str, pid: i32) {
        if is_our_supervisor(pid, sandbox_id) {
            terminate(sandbox_id, &[pid]).await;
        }
    }
}

/// SIGTERM to each supervisor, then SIGKILL to the group of any still
/// running after [`STOP_GRACE`].
pub async fn terminate(sandbox_id: &str, pids: &[i32]) {
    for pid in pids {
        signal(*pid, libc::SIGTERM);
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while pids.iter().any(|pid| is_running(*pid)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for pid in pids.iter().filter(|pid| is_running(**pid)) {
        tracing::warn!(
            sandbox_id,
            pid,
            "supervisor ignored SIGTERM; killing its group"
        );
        signal(-pid, libc::SIGKILL);
    }
}

/// Writes a sandbox token for `--driver none` (owner read/write only,
/// replaced atomically).
async fn write_token_file(path: &Path, token: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    drop(file);
    tokio::fs::rename(&tmp, path).await
}

/// A pipe holding `token`, its write end closed: the read end, for the
/// supervisor to inherit.
fn token_pipe(token: &str) -> std::io::Result<OwnedFd> {
    use std::io::Write as _;
    use std::os::fd::FromRawFd as _;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into a valid array; each is
    // owned at once.
    let (read, write) = unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    // A token is far below the pipe's capacity, so this never blocks.
    std::fs::File::from(write).write_all(token.as_bytes())?;
    Ok(read)
}

/// Child side, between fork and exec: `fd` becomes `target`, inherited
/// across exec.
fn inherit_as(fd: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: dup2 and fcntl on descriptors of this process.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Nothing else this process inherited goes on to the supervisor:
        // marked close-on-exec rather than closed, so the pipe std uses to
        // report a failed exec keeps working until the exec.
        libc::syscall(
            libc::SYS_close_range,
            target + 1,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    Ok(())
}

/// Resolves `--isolation`: `auto` takes namespaces when the supervisor can
/// have them, else none (with the reason); an explicit `namespaces` that
/// cannot be had is an error.
pub fn resolve_isolation(
    requested: IsolationArg,
    supervisor_bin: &Path,
) -> Result<(Isolation, Option<String>), String> {
    let check = || -> Result<(), String> {
        let output = std::process::Command::new(supervisor_bin)
            .arg("__isolation-check")
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|err| format!("cannot run {}: {err}", supervisor_bin.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
        }
    };
    match requested {
        IsolationArg::None => Ok((Isolation::None, None)),
        IsolationArg::Namespaces => check()
            .map(|()| (Isolation::Namespaces, None))
            .map_err(|reason| format!("--isolation namespaces is not available here: {reason}")),
        IsolationArg::Auto => Ok(match check() {
            Ok(()) => (Isolation::Namespaces, None),
            Err(reason) => (Isolation::None, Some(reason)),
        }),
    }
}

/// `--isolation` as given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IsolationArg {
    /// `namespaces` where this host allows it, else `none` with a warning.
    Auto,
    /// Each sandbox in its own user, PID and mount namespaces; refuse to
    /// start without them.
    Namespaces,
    /// No isolation: sandbox processes run as the supervisor's user and see
    /// the whole host.
    None,
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Alive and not a zombie.
/// Whether `pid` is a running process (not a zombie).
pub fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The process `pid` is a running supervisor of this sandbox (guards against
/// PID reuse before we signal or adopt it).
pub fn is_our_supervisor(pid: i32, sandbox_id: &str) -> bool {
    if pid <= 0 || !is_running(pid) {
        return false;
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let is_supervisor = args.first().is_some_and(|a| {
        Path::new(std::ffi::OsStr::from_bytes(a))
            .file_name()
            .is_some_and(|n| n == "openshell-supervisor")
    });
    is_supervisor && args.contains(&sandbox_id.as_bytes())
}

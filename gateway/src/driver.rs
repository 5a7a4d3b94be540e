//! The process sandbox driver: a sandbox is a directory on this host plus one
//! `openshell-supervisor` process that keeps a session to the gateway and
//! runs the sandbox's processes.
//!
//! Supervisors run in their own process group, so a Ctrl-C aimed at the
//! gateway's terminal does not reach them, and they outlive a gateway restart:
//! the new gateway adopts a live supervisor (matched by PID and command line)
//! or starts a fresh one with a fresh token. `supervisor.pid` in the sandbox
//! directory names the process for operators and test harnesses.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::sync::mpsc;

/// A supervisor that exited while the driver was watching it.
#[derive(Debug)]
pub struct SupervisorExit {
    pub sandbox_id: String,
    pub pid: i32,
    pub status: String,
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
}

pub struct ProcessDriver {
    data_dir: PathBuf,
    /// False for `--driver none`: no supervisor is started.
    spawn: bool,
    supervisor_bin: PathBuf,
    /// The gateway URL supervisors dial.
    gateway_url: String,
    ca_file: Option<PathBuf>,
    exits: mpsc::UnboundedSender<SupervisorExit>,
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
                exits,
            },
            rx,
        )
    }

    /// `--driver none`: sandboxes get their directory and a token file but
    /// no supervisor.
    pub fn without_processes(mut self) -> Self {
        self.spawn = false;
        self
    }

    pub fn sandbox_dir(&self, sandbox_id: &str) -> PathBuf {
        self.data_dir.join("sandboxes").join(sandbox_id)
    }

    /// Creates the sandbox's directory and starts its supervisor.
    pub async fn start(&self, sandbox_id: &str, token: &str) -> std::io::Result<i32> {
        let dir = self.sandbox_dir(sandbox_id);
        let workdir = dir.join("work");
        tokio::fs::create_dir_all(&workdir).await?;
        if !self.spawn {
            write_token_file(&dir.join("token"), token).await?;
            return Ok(0);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("supervisor.log"))?;
        let mut command = tokio::process::Command::new(&self.supervisor_bin);
        command
            .arg("--gateway")
            .arg(&self.gateway_url)
            .arg("--sandbox-id")
            .arg(sandbox_id)
            .arg("--workdir")
            .arg(&workdir)
            .env("OPENSHELL_SANDBOX_TOKEN", token)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(false);
        if let Some(ca) = &self.ca_file {
            command.arg("--ca-file").arg(ca);
        }
        let mut child = command.spawn()?;
        let pid = child.id().map(|p| p as i32).unwrap_or_default();
        tokio::fs::write(dir.join("supervisor.pid"), format!("{pid}\n")).await?;
        let exits = self.exits.clone();
        let sandbox_id = sandbox_id.to_owned();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(err) => err.to_string(),
            };
            let _ = exits.send(SupervisorExit {
                sandbox_id,
                pid,
                status,
            });
        });
        Ok(pid)
    }

    /// Stops the supervisor (SIGTERM, then SIGKILL of its group after 5 s)
    /// and removes the sandbox directory.
    pub async fn stop(&self, sandbox_id: &str, pid: Option<i32>) {
        if let Some(pid) = pid.filter(|p| is_our_supervisor(*p, sandbox_id)) {
            signal(pid, libc::SIGTERM);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while is_running(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            if is_running(pid) {
                tracing::warn!(
                    sandbox_id,
                    pid,
                    "supervisor ignored SIGTERM; killing its group"
                );
                signal(-pid, libc::SIGKILL);
            }
        }
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
            signal(pid, libc::SIGTERM);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while is_running(pid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            if is_running(pid) {
                signal(-pid, libc::SIGKILL);
            }
        }
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

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Alive and not a zombie.
fn is_running(pid: i32) -> bool {
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

//! A real `openshell-supervisor host` process (a shared supervisor host)
//! for tests: started with a host token in a file only its owner may read,
//! stopped by its PID (SIGTERM, then SIGKILL) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin, is_running, signal};

/// How to start a host.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// The gateway URL it dials (the shared address: an edge or a replica).
    pub gateway: String,
    pub host_id: String,
    /// Its host token (from [`crate::issue_host_token`]).
    pub token: String,
    /// `--isolation none|namespaces`.
    pub isolation: String,
    /// Further arguments.
    pub extra_args: Vec<String>,
    /// A command the host is started through (a lab host's
    /// [`launcher`](crate::lab::Lab::launcher)); empty: none.
    pub launcher: Vec<String>,
}

/// A running host with its own `--root` directory, kept across
/// [`restart`](Self::restart)s.
pub struct SupervisorHost {
    child: Option<Child>,
    options: HostOptions,
    dir: tempfile::TempDir,
}

impl SupervisorHost {
    pub fn start(options: HostOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("openshell-host-")
            .tempdir()
            .expect("temp dir");
        let mut host = Self {
            child: None,
            options,
            dir,
        };
        host.spawn();
        host
    }

    fn spawn(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let token_file = self.dir.path().join("host.token");
        std::fs::write(&token_file, &self.options.token).expect("write host token");
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod host token");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("host.log"))
            .expect("host log");
        let mut command = match self.options.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(bin("openshell-supervisor"));
                command
            }
            None => Command::new(bin("openshell-supervisor")),
        };
        let child = command
            .args(["host", "--gateway", &self.options.gateway])
            .args(["--host-id", &self.options.host_id])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--root")
            .arg(self.root())
            .args(["--isolation", &self.options.isolation])
            .args(&self.options.extra_args)
            .env(
                "RUST_LOG",
                std::env::var("OPENSHELL_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start openshell-supervisor host");
        self.child = Some(child);
    }

    /// The host's `--root`: `<root>/<sandbox_id>/work` is a sandbox's
    /// working directory.
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A sandbox's working directory on this host.
    pub fn workdir(&self, sandbox_id: &str) -> PathBuf {
        self.root().join(sandbox_id).join("work")
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Whether the process is still running (`false` once it exited).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The host's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("host.log")).unwrap_or_default()
    }

    /// SIGTERM (the host stops every sandbox and exits), SIGKILL after 10 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the host again with the same id, token and root (after a
    /// [`kill`](Self::kill) or [`stop`](Self::stop)).
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SupervisorHost {
    fn drop(&mut self) {
        if let Some(pid) = self.pid() {
            self.stop();
            if is_running(pid) {
                signal(pid, libc::SIGKILL);
            }
        }
    }
}

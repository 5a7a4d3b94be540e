//! Starting an exec's process: directly, or inside the sandbox through the
//! isolation helper; its process group, killed on cancel; start failures
//! reported like a shell reports them.

use super::*;

/// Why a process could not be started, reported as stderr plus exit code.
#[derive(Debug)]
pub(super) struct SpawnFailure {
    pub(super) message: String,
    pub(super) exit_code: i32,
}

impl SpawnFailure {
    pub(super) fn new(argv0: &str, reason: impl std::fmt::Display, exit_code: i32) -> Self {
        Self {
            message: crate::os_error::cannot_run_message(argv0, reason),
            exit_code,
        }
    }

    pub(super) fn from_io(argv0: &str, context: Option<String>, err: &io::Error) -> Self {
        let exit_code = crate::os_error::cannot_run_code(err);
        let reason = crate::os_error::describe(err);
        match context {
            Some(context) => Self::new(argv0, format!("{context}: {reason}"), exit_code),
            None => Self::new(argv0, reason, exit_code),
        }
    }
}

/// The process group of a started exec; SIGKILLed on drop unless finished.
pub(super) struct ProcessGroup {
    pub(super) pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    pub(super) fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH: the group is already gone.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// The process ended on its own; leave whatever it left behind alone.
    pub(super) fn release(&mut self) {
        self.pgid = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(super) enum ProcessIo {
    Pipes {
        stdin: ChildStdin,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    },
    Pty(pty::Master),
}

/// A started child and its group.
pub(super) struct Running {
    // Declared before `child` so the group is killed before the child is
    // dropped (and handed to tokio's orphan reaper).
    pub(super) group: ProcessGroup,
    pub(super) child: Child,
    /// Kept because `child.id()` is gone once tokio reaped the child.
    pub(super) pid: Option<i32>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            sandbox_processes::untrack(pid);
        }
    }
}

impl Running {
    pub(super) async fn kill_and_reap(&mut self) {
        self.group.kill();
        if tokio::time::timeout(REAP_WAIT, self.child.wait())
            .await
            .is_err()
        {
            warn!("killed exec process was not reaped in time");
        }
        self.group.release();
    }
}

pub(super) fn start(
    program: Program,
    request: &ExecSandboxRequest,
    settings: &ExecSettings,
) -> Result<(Running, ProcessIo), SpawnFailure> {
    let Some(argv0) = request.command.first() else {
        return Err(SpawnFailure::new("", "empty command", 127));
    };
    let cwd = resolve_workdir(&settings.workdir, &request.workdir);
    let mut command = match &settings.sandbox_init {
        // Inside the sandbox the helper checks the directory, as the sandbox
        // sees it: the host's view is none of the sandbox's business.
        Some(init) => {
            let built = match program {
                Program::Command => {
                    crate::isolation::enter_command(init, &request.command, &cwd, request.tty)
                }
                Program::Sftp => crate::isolation::enter_sftp_command(init, &cwd),
            };
            built.map_err(|err| SpawnFailure::from_io(argv0, None, &err))?
        }
        None if program == Program::Sftp => {
            let exe =
                std::env::current_exe().map_err(|err| SpawnFailure::from_io(argv0, None, &err))?;
            let mut command = Command::new(exe);
            command
                .arg(crate::isolation::SFTP_COMMAND)
                .current_dir(&cwd);
            command
        }
        None => {
            let cwd_error = match std::fs::metadata(&cwd) {
                Ok(meta) if meta.is_dir() => None,
                Ok(_) => Some(io::Error::from_raw_os_error(libc::ENOTDIR)),
                Err(err) => Some(err),
            };
            if let Some(err) = cwd_error {
                let context = format!("working directory {}", cwd.display());
                return Err(SpawnFailure::from_io(argv0, Some(context), &err));
            }
            let mut command = Command::new(argv0);
            command.args(&request.command[1..]).current_dir(&cwd);
            command
        }
    };
    command
        .env_clear()
        .envs(settings.environment(request.tty, &request.environment))
        .kill_on_drop(true);

    let supervisor = std::process::id();
    // The process joins the sandbox's control group before it runs
    // anything (the exec helper, under isolation, before it forks the
    // program), so everything it starts is limited with the sandbox.
    let cgroup_fds: Vec<i32> = settings
        .cgroup
        .as_ref()
        .map(|cgroup| cgroup.procs_fds())
        .unwrap_or_default();
    let pty = if request.tty {
        let pty = pty::Pty::open(request.cols, request.rows)
            .map_err(|err| SpawnFailure::from_io(argv0, Some("open pty".into()), &err))?;
        let slave = |pty: &pty::Pty| {
            pty.slave_stdio()
                .map_err(|err| SpawnFailure::from_io(argv0, Some("open pty".into()), &err))
        };
        command
            .stdin(slave(&pty)?)
            .stdout(slave(&pty)?)
            .stderr(slave(&pty)?);
        let isolated = settings.sandbox_init.is_some();
        let cgroup = cgroup_fds.clone();
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            command.pre_exec(move || {
                crate::limits::join_self(&cgroup)?;
                if isolated {
                    // The program itself becomes the pty's session leader
                    // inside the sandbox (`--tty`): were the helper the
                    // leader, its exit would hang the terminal up and
                    // discard output the supervisor has not read yet. The
                    // helper leads a process group, which cancel kills.
                    if libc::setpgid(0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                } else {
                    pty::become_session_leader()?;
                }
                die_with_parent(supervisor)
            });
        }
        Some(pty)
    } else {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let cgroup = cgroup_fds.clone();
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            command.pre_exec(move || {
                crate::limits::join_self(&cgroup)?;
                die_with_parent(supervisor)
            });
        }
        None
    };

    let mut child = sandbox_processes::spawn_tracked(&mut command)
        .map_err(|err| SpawnFailure::from_io(argv0, None, &err))?;
    // The parent's copies of the pty slave must be closed, or reading the
    // master never ends: EIO comes only once every slave fd is closed.
    drop(command);
    let pgid = child.id().map(|pid| nix::unistd::Pid::from_raw(pid as i32));
    let group = ProcessGroup { pgid };
    let io = match pty {
        Some(pty) => ProcessIo::Pty(pty.into_master()),
        None => ProcessIo::Pipes {
            stdin: child.stdin.take().expect("stdin is piped"),
            stdout: child.stdout.take().expect("stdout is piped"),
            stderr: child.stderr.take().expect("stderr is piped"),
        },
    };
    let pid = child.id().map(|pid| pid as i32);
    Ok((Running { group, child, pid }, io))
}

/// Child side, between fork and exec: die with the supervisor (Linux), so a
/// supervisor killed with SIGKILL leaves no running exec behind. The signal
/// follows the forking thread, which is a tokio worker that lives as long as
/// the runtime.
pub(super) fn die_with_parent(supervisor: u32) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl and getppid are async-signal-safe.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The supervisor died before the prctl took effect.
            if libc::getppid() as u32 != supervisor {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = supervisor;
    Ok(())
}

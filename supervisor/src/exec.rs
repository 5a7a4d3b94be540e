//! Exec relays: run one process for the gateway and stream it over a relay.
//!
//! The process runs directly (no shell) with a clean environment built here,
//! so nothing of the supervisor's own environment (the sandbox token above
//! all) reaches it by accident. Without a tty it gets three pipes and its own
//! process group; with a tty it gets a fresh session on a pty (see [`pty`]),
//! which again makes it a process-group leader. Either way the group id is
//! the child's pid, and that group is what cancellation kills.
//!
//! The exit event goes out only once the process exited *and* its output was
//! read to the end, so the gateway never sees an exit followed by output.
//! Cancellation (relay close, relay stream gone, session lost, shutdown)
//! kills the group with SIGKILL and reaps the child; dropping the exec future
//! does the same through [`ProcessGroup`]'s `Drop` and tokio's orphan reaping.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::{Pin, pin};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::{Stream, StreamExt};
use openshell_proto::{
    ExecSandboxEvent, ExecSandboxExit, ExecSandboxInput, ExecSandboxRequest, ExecSandboxStderr,
    ExecSandboxStdout, RelayFrame, exec_sandbox_event, exec_sandbox_input, relay_frame,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::relay;
use crate::sandbox_processes;
use crate::transport;

mod pty;
mod spawn;
mod streams;

use spawn::*;
use streams::*;

/// Largest output chunk per event.
const CHUNK: usize = 64 * 1024;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const TOKEN_VAR: &str = "OPENSHELL_SANDBOX_TOKEN";
/// After a timeout kill, how long output may still trickle in.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);
/// Waiting for a SIGKILLed child to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);
const TIMEOUT_EXIT_CODE: i32 = 124;
/// What a process killed by SIGKILL (the OOM killer's signal) exits with.
const SIGKILL_EXIT_CODE: i32 = 128 + libc::SIGKILL;

/// What every exec of this sandbox shares.
#[derive(Debug, Clone)]
pub struct ExecSettings {
    pub sandbox_id: String,
    /// The sandbox's working directory (`--workdir`), also `HOME`.
    pub workdir: PathBuf,
    pub path: OsString,
    pub lang: Option<OsString>,
    /// The applied provider environment (see `config_apply`).
    pub provider_env: ProviderEnv,
    /// A pidfd of the sandbox's PID 1 under `--isolation namespaces`:
    /// processes start inside its namespaces. `None`: they start here.
    pub sandbox_init: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// The sandbox's control group: every process starts in it.
    pub cgroup: Option<std::sync::Arc<crate::limits::Cgroup>>,
    /// Outbound access of the sandbox's network namespace (isolated only).
    pub egress: Option<std::sync::Arc<crate::egress::Egress>>,
}

/// The provider environment in force: secrets, so `Debug` shows keys only.
#[derive(Clone, Default)]
pub struct ProviderEnv(std::sync::Arc<std::sync::RwLock<HashMap<String, String>>>);

impl ProviderEnv {
    /// Sets the environment of later execs; returns the one it replaces.
    pub fn replace(&self, env: HashMap<String, String>) -> HashMap<String, String> {
        std::mem::replace(&mut *self.0.write().unwrap_or_else(|p| p.into_inner()), env)
    }

    pub fn get(&self) -> HashMap<String, String> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl std::fmt::Debug for ProviderEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env = self.get();
        let mut keys: Vec<&String> = env.keys().collect();
        keys.sort();
        f.debug_struct("ProviderEnv").field("keys", &keys).finish()
    }
}

impl ExecSettings {
    /// Takes `PATH` and `LANG` from the supervisor's own environment.
    pub fn new(sandbox_id: String, workdir: PathBuf) -> Self {
        let path = std::env::var_os("PATH")
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| DEFAULT_PATH.into());
        Self {
            sandbox_id,
            workdir,
            path,
            lang: std::env::var_os("LANG"),
            provider_env: ProviderEnv::default(),
            sandbox_init: None,
            cgroup: None,
            egress: None,
        }
    }

    fn environment(
        &self,
        tty: bool,
        requested: &HashMap<String, String>,
    ) -> BTreeMap<OsString, OsString> {
        let mut env = BTreeMap::new();
        env.insert("PATH".into(), self.path.clone());
        env.insert("HOME".into(), self.workdir.clone().into_os_string());
        env.insert(
            "OPENSHELL_SANDBOX_ID".into(),
            self.sandbox_id.clone().into(),
        );
        if let Some(lang) = &self.lang {
            env.insert("LANG".into(), lang.clone());
        }
        if tty {
            env.insert("TERM".into(), "xterm-256color".into());
        }
        // The provider environment, then what the request asked for.
        for (key, value) in self.provider_env.get() {
            if key.is_empty() || key.contains('=') || key == TOKEN_VAR {
                continue;
            }
            env.insert(key.into(), value.into());
        }
        for (key, value) in requested {
            if key.is_empty() || key.contains('=') || key == TOKEN_VAR {
                continue;
            }
            env.insert(key.into(), value.into());
        }
        env
    }
}

/// Relative (or empty) request workdirs are taken from the sandbox workdir.
fn resolve_workdir(base: &Path, requested: &str) -> PathBuf {
    if requested.is_empty() {
        base.to_path_buf()
    } else {
        base.join(requested)
    }
}

/// Exit code as the protocol reports it: signals as 128+n.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

enum Ending {
    Exited(i32),
    Cancelled(&'static str),
}

/// What an exec runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// The request's `command`.
    Command,
    /// The supervisor's built-in SFTP server (`ssh::sftp`) on stdin and
    /// stdout, started like any program: inside the sandbox, as its uid.
    Sftp,
}

/// Runs one exec relay to its end: spawn, pump, exit event.
///
/// `out` is the relay's outbound side; `inbound` its inbound frames (after
/// `init`). `cancel` resolving kills the process.
pub async fn run<S>(
    request: ExecSandboxRequest,
    settings: &ExecSettings,
    out: mpsc::Sender<RelayFrame>,
    inbound: S,
    cancel: impl Future<Output = ()>,
) where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    run_program(Program::Command, request, settings, out, inbound, cancel).await
}

/// [`run`] for any [`Program`]; the SSH server drives its channels with it
/// over in-process channels instead of a relay stream.
pub async fn run_program<S>(
    program: Program,
    request: ExecSandboxRequest,
    settings: &ExecSettings,
    out: mpsc::Sender<RelayFrame>,
    mut inbound: S,
    cancel: impl Future<Output = ()>,
) where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    let mut cancel = pin!(cancel);
    let argv0 = request.command.first().cloned().unwrap_or_default();
    // The sandbox's OOM kills before the start: one more by the exit, and a
    // SIGKILL, means the memory limit ended the process.
    let oom_before = settings.cgroup.as_ref().map(|cgroup| cgroup.oom_kills());
    let ending = match start(program, &request, settings) {
        Ok((running, io)) => {
            info!(
                sandbox_id = settings.sandbox_id,
                argv0,
                tty = request.tty,
                "exec started"
            );
            let oom = settings.cgroup.as_deref().zip(oom_before);
            supervise(
                running,
                io,
                &request,
                oom,
                &out,
                &mut inbound,
                cancel.as_mut(),
            )
            .await
        }
        Err(failure) => {
            info!(
                sandbox_id = settings.sandbox_id,
                argv0, "exec could not start"
            );
            let frames = [
                event_frame(stderr_event(failure.message.into_bytes())),
                exit_frame(failure.exit_code),
            ];
            let send = async {
                for frame in frames {
                    out.send(frame).await.map_err(|_| RelayClosed)?;
                }
                Ok::<_, RelayClosed>(failure.exit_code)
            };
            tokio::select! {
                _ = &mut cancel => Ending::Cancelled("relay cancelled"),
                sent = send => match sent {
                    Ok(code) => Ending::Exited(code),
                    Err(RelayClosed) => Ending::Cancelled("relay closed"),
                },
            }
        }
    };
    match ending {
        Ending::Exited(code) => {
            info!(
                sandbox_id = settings.sandbox_id,
                argv0,
                exit_code = code,
                "exec finished"
            );
            drop(out);
            relay::drain(inbound, cancel).await;
        }
        Ending::Cancelled(why) => debug!(argv0, why, "exec cancelled"),
    }
}

/// Pumps the started process until it exited and its output is drained, or
/// until cancelled. On a normal exit the exit event has been sent.
async fn supervise<S>(
    mut process: Running,
    io: ProcessIo,
    request: &ExecSandboxRequest,
    oom: Option<(&crate::limits::Cgroup, u64)>,
    out: &mpsc::Sender<RelayFrame>,
    inbound: &mut S,
    mut cancel: Pin<&mut impl Future<Output = ()>>,
) -> Ending
where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    let (stdin, output, pty): (Stdin, OutputPump, Option<pty::Master>) = match io {
        ProcessIo::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            let out_stdout = out.clone();
            let out_stderr = out.clone();
            let output = async move {
                let (a, b) = tokio::join!(
                    pump_output(stdout, out_stdout, stdout_event),
                    pump_output(stderr, out_stderr, stderr_event),
                );
                a.and(b)
            };
            (Stdin::Pipe(stdin), Box::pin(output), None)
        }
        ProcessIo::Pty(master) => {
            let output = pump_output(master.clone(), out.clone(), stdout_event);
            (Stdin::Pty(master.clone()), Box::pin(output), Some(master))
        }
    };
    let mut output = output;
    let mut input = pin!(pump_input(inbound, Some(stdin), request.stdin.clone(), pty));

    let far_future = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    // A limit too far out to represent is no limit.
    let mut deadline =
        execution_timeout(request).and_then(|limit| Instant::now().checked_add(limit));
    let mut drain_until: Option<Instant> = None;
    let mut status: Option<i32> = None;
    let mut drained = false;
    let mut timed_out = false;

    while status.is_none() || !drained {
        tokio::select! {
            _ = &mut cancel => {
                process.kill_and_reap().await;
                return Ending::Cancelled("relay cancelled");
            }
            _ = &mut input => {
                process.kill_and_reap().await;
                return Ending::Cancelled("relay stream ended");
            }
            result = &mut output, if !drained => match result {
                Ok(()) => drained = true,
                Err(RelayClosed) => {
                    process.kill_and_reap().await;
                    return Ending::Cancelled("relay closed");
                }
            },
            exited = process.child.wait(), if status.is_none() => {
                status = Some(match exited {
                    Ok(exited) => exit_code(exited),
                    Err(err) => {
                        warn!(error = %err, "waiting for exec process failed");
                        1
                    }
                });
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or(far_future)), if deadline.is_some() => {
                debug!("exec timed out");
                deadline = None;
                timed_out = true;
                process.group.kill();
                drain_until = Some(Instant::now() + DRAIN_AFTER_KILL);
            }
            // After a timeout kill, output held open by an escaped descendant
            // must not keep the relay alive.
            _ = tokio::time::sleep_until(drain_until.unwrap_or(far_future)),
                if drain_until.is_some() && status.is_some() => {
                drained = true;
            }
        }
    }
    process.group.release();
    let code = if timed_out {
        TIMEOUT_EXIT_CODE
    } else {
        status.unwrap_or(1)
    };
    let oom_killed = code == SIGKILL_EXIT_CODE
        && oom.is_some_and(|(cgroup, before)| cgroup.oom_kills() > before);
    if oom_killed {
        debug!("exec killed by the sandbox's memory limit");
    }
    // The pumps' senders are gone; once the caller drops `out` the request
    // stream ends.
    drop(output);
    if out.send(exit_frame_with(code, oom_killed)).await.is_err() {
        return Ending::Cancelled("relay closed");
    }
    Ending::Exited(code)
}

/// The request's execution timeout; absent or non-positive means no limit.
fn execution_timeout(request: &ExecSandboxRequest) -> Option<Duration> {
    let limit = request.execution_timeout?;
    let limit = Duration::from_secs(u64::try_from(limit.seconds).ok()?)
        .saturating_add(Duration::from_nanos(u64::try_from(limit.nanos).ok()?));
    (!limit.is_zero()).then_some(limit)
}

#[cfg(test)]
mod tests;

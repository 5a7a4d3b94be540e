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
use tracing::{debug, warn};

use crate::relay;
use crate::sandbox_processes;
use crate::transport;

mod pty;

/// Largest output chunk per event.
const CHUNK: usize = 64 * 1024;
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const TOKEN_VAR: &str = "OPENSHELL_SANDBOX_TOKEN";
/// After a timeout kill, how long output may still trickle in.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(2);
/// Waiting for a SIGKILLed child to be reaped.
const REAP_WAIT: Duration = Duration::from_secs(5);
const TIMEOUT_EXIT_CODE: i32 = 124;

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
    /// Host pid of the sandbox's init under `--isolation namespaces`:
    /// processes start inside its namespaces. `None`: they start here.
    pub sandbox_init: Option<i32>,
}

/// The provider environment in force: secrets, so `Debug` shows keys only.
#[derive(Clone, Default)]
pub struct ProviderEnv(std::sync::Arc<std::sync::RwLock<HashMap<String, String>>>);

impl ProviderEnv {
    pub fn replace(&self, env: HashMap<String, String>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = env;
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

/// Why a process could not be started, reported as stderr plus exit code.
#[derive(Debug)]
struct SpawnFailure {
    message: String,
    exit_code: i32,
}

impl SpawnFailure {
    fn new(argv0: &str, reason: impl std::fmt::Display, exit_code: i32) -> Self {
        Self {
            message: format!("openshell-supervisor: cannot run `{argv0}`: {reason}\n"),
            exit_code,
        }
    }

    fn from_io(argv0: &str, context: Option<String>, err: &io::Error) -> Self {
        // Like a shell: 126 when the file is there but cannot be executed.
        let exit_code = match err.raw_os_error() {
            Some(libc::EACCES | libc::EPERM | libc::ENOEXEC | libc::EISDIR) => 126,
            _ if err.kind() == io::ErrorKind::PermissionDenied => 126,
            _ => 127,
        };
        let reason = crate::os_error::describe(err);
        match context {
            Some(context) => Self::new(argv0, format!("{context}: {reason}"), exit_code),
            None => Self::new(argv0, reason, exit_code),
        }
    }
}

/// The process group of a started exec; SIGKILLed on drop unless finished.
struct ProcessGroup {
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    fn kill(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH: the group is already gone.
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// The process ended on its own; leave whatever it left behind alone.
    fn release(&mut self) {
        self.pgid = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

enum ProcessIo {
    Pipes {
        stdin: ChildStdin,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    },
    Pty(pty::Master),
}

/// A started child and its group.
struct Running {
    // Declared before `child` so the group is killed before the child is
    // dropped (and handed to tokio's orphan reaper).
    group: ProcessGroup,
    child: Child,
    /// Kept because `child.id()` is gone once tokio reaped the child.
    pid: Option<i32>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            sandbox_processes::untrack(pid);
        }
    }
}

impl Running {
    async fn kill_and_reap(&mut self) {
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

fn start(
    request: &ExecSandboxRequest,
    settings: &ExecSettings,
) -> Result<(Running, ProcessIo), SpawnFailure> {
    let Some(argv0) = request.command.first() else {
        return Err(SpawnFailure::new("", "empty command", 127));
    };
    let cwd = resolve_workdir(&settings.workdir, &request.workdir);
    let mut command = match settings.sandbox_init {
        // Inside the sandbox the helper checks the directory, as the sandbox
        // sees it: the host's view is none of the sandbox's business.
        Some(init_pid) => crate::isolation::enter_command(init_pid, &request.command, &cwd)
            .map_err(|err| SpawnFailure::from_io(argv0, None, &err))?,
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
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            command.pre_exec(move || {
                pty::become_session_leader()?;
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
        // SAFETY: the hook only makes async-signal-safe calls.
        unsafe {
            command.pre_exec(move || die_with_parent(supervisor));
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
fn die_with_parent(supervisor: u32) -> io::Result<()> {
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

/// The output pump failed because the relay's outbound side is gone.
struct RelayClosed;

type OutputPump = Pin<Box<dyn Future<Output = Result<(), RelayClosed>> + Send>>;

async fn pump_output<R>(
    mut reader: R,
    out: mpsc::Sender<RelayFrame>,
    event: fn(Vec<u8>) -> exec_sandbox_event::Payload,
) -> Result<(), RelayClosed>
where
    R: AsyncRead + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                debug!(error = %err, "exec output read failed");
                return Ok(());
            }
        };
        out.send(event_frame(event(buf[..n].to_vec())))
            .await
            .map_err(|_| RelayClosed)?;
    }
}

fn stdout_event(data: Vec<u8>) -> exec_sandbox_event::Payload {
    exec_sandbox_event::Payload::Stdout(ExecSandboxStdout { data })
}

fn stderr_event(data: Vec<u8>) -> exec_sandbox_event::Payload {
    exec_sandbox_event::Payload::Stderr(ExecSandboxStderr { data })
}

fn event_frame(payload: exec_sandbox_event::Payload) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
            payload: Some(payload),
        })),
    }
}

fn exit_frame(exit_code: i32) -> RelayFrame {
    event_frame(exec_sandbox_event::Payload::Exit(ExecSandboxExit {
        exit_code,
    }))
}

/// Where stdin bytes go.
enum Stdin {
    Pipe(ChildStdin),
    Pty(pty::Master),
}

impl Stdin {
    async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Stdin::Pipe(pipe) => pipe.write_all(data).await,
            Stdin::Pty(master) => master.write_all(data).await,
        }
    }

    /// A pipe is closed; a pty cannot close its input alone, so it gets the
    /// terminal's end-of-file character instead.
    async fn close(self) {
        match self {
            Stdin::Pipe(pipe) => drop(pipe),
            Stdin::Pty(mut master) => {
                let eof = master.eof_char();
                let _ = master.write_all(&[eof]).await;
            }
        }
    }
}

async fn write_stdin(stdin: &mut Option<Stdin>, data: &[u8]) {
    if let Some(sink) = stdin
        && let Err(err) = sink.write(data).await
    {
        // The process closed its stdin or exited; later input is dropped.
        debug!(error = %err, "exec stdin write failed");
        *stdin = None;
    }
}

/// Feeds stdin and resizes until the inbound relay stream ends.
async fn pump_input<S>(
    inbound: &mut S,
    mut stdin: Option<Stdin>,
    initial: Vec<u8>,
    pty: Option<pty::Master>,
) where
    S: Stream<Item = Result<RelayFrame, tonic::Status>> + Unpin,
{
    if !initial.is_empty() {
        write_stdin(&mut stdin, &initial).await;
    }
    while let Some(frame) = inbound.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(status) => {
                debug!(error = %transport::describe_status(&status), "exec relay stream failed");
                return;
            }
        };
        match frame.payload {
            Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                payload: Some(input),
            })) => match input {
                exec_sandbox_input::Payload::Stdin(data) => write_stdin(&mut stdin, &data).await,
                exec_sandbox_input::Payload::Resize(size) => {
                    if let Some(pty) = &pty
                        && let Err(err) = pty.resize(size.cols, size.rows)
                    {
                        debug!(error = %err, "pty resize failed");
                    }
                }
                exec_sandbox_input::Payload::Start(_) => debug!("ignoring a second exec start"),
            },
            Some(relay_frame::Payload::Eof(_)) => {
                if let Some(stdin) = stdin.take() {
                    stdin.close().await;
                }
            }
            _ => debug!("ignoring an unexpected frame on an exec relay"),
        }
    }
}

enum Ending {
    Exited(i32),
    Cancelled(&'static str),
}

/// Runs one exec relay to its end: spawn, pump, exit event.
///
/// `out` is the relay's outbound side; `inbound` its inbound frames (after
/// `init`). `cancel` resolving kills the process.
pub async fn run<S>(
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
    let ending = match start(&request, settings) {
        Ok((running, io)) => {
            debug!(argv0, tty = request.tty, "exec started");
            supervise(running, io, &request, &out, &mut inbound, cancel.as_mut()).await
        }
        Err(failure) => {
            debug!(argv0, "exec could not start");
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
            debug!(argv0, exit_code = code, "exec finished");
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
    // The pumps' senders are gone; once the caller drops `out` the request
    // stream ends.
    drop(output);
    if out.send(exit_frame(code)).await.is_err() {
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
mod tests {
    use super::*;
    use openshell_proto::ExecSandboxWindowResize;
    use std::os::unix::fs::PermissionsExt;
    use tokio::sync::oneshot;
    use tokio_stream::wrappers::ReceiverStream;

    fn settings(workdir: &Path) -> ExecSettings {
        ExecSettings {
            sandbox_id: "sb-1".into(),
            workdir: workdir.to_path_buf(),
            path: DEFAULT_PATH.into(),
            lang: None,
            provider_env: ProviderEnv::default(),
            sandbox_init: None,
        }
    }

    fn request(argv: &[&str]) -> ExecSandboxRequest {
        ExecSandboxRequest {
            command: argv.iter().map(|arg| arg.to_string()).collect(),
            ..Default::default()
        }
    }

    fn stdin_frame(data: &[u8]) -> RelayFrame {
        RelayFrame {
            payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                payload: Some(exec_sandbox_input::Payload::Stdin(data.to_vec())),
            })),
        }
    }

    fn resize_frame(cols: u32, rows: u32) -> RelayFrame {
        RelayFrame {
            payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
                payload: Some(exec_sandbox_input::Payload::Resize(
                    ExecSandboxWindowResize { cols, rows },
                )),
            })),
        }
    }

    fn eof() -> RelayFrame {
        RelayFrame {
            payload: Some(relay_frame::Payload::Eof(openshell_proto::RelayEof {})),
        }
    }

    #[derive(Debug, Default)]
    struct Output {
        stdout: Vec<u8>,
        stderr: Vec<u8>,
        exit: Option<i32>,
    }

    impl Output {
        fn stdout(&self) -> String {
            String::from_utf8_lossy(&self.stdout).into_owned()
        }
        fn stderr(&self) -> String {
            String::from_utf8_lossy(&self.stderr).into_owned()
        }
    }

    /// Runs one exec over in-memory relay channels, feeding `input` first.
    async fn exec(request: ExecSandboxRequest, workdir: &Path, input: Vec<RelayFrame>) -> Output {
        let settings = settings(workdir);
        let (out_tx, mut out_rx) = mpsc::channel(16);
        let (in_tx, in_rx) = mpsc::channel(16);
        let task = tokio::spawn(async move {
            run(
                request,
                &settings,
                out_tx,
                ReceiverStream::new(in_rx),
                std::future::pending(),
            )
            .await
        });
        for frame in input {
            in_tx.send(Ok(frame)).await.unwrap();
        }
        let mut output = Output::default();
        while let Some(frame) = out_rx.recv().await {
            assert!(output.exit.is_none(), "frame after the exit event");
            let Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
                payload: Some(event),
            })) = frame.payload
            else {
                panic!("unexpected frame {frame:?}");
            };
            match event {
                exec_sandbox_event::Payload::Stdout(chunk) => {
                    assert!(chunk.data.len() <= CHUNK);
                    output.stdout.extend(chunk.data);
                }
                exec_sandbox_event::Payload::Stderr(chunk) => {
                    assert!(chunk.data.len() <= CHUNK);
                    output.stderr.extend(chunk.data);
                }
                exec_sandbox_event::Payload::Exit(exit) => {
                    output.exit = Some(exit.exit_code);
                }
            }
        }
        // The gateway ends its side once it has the exit event.
        drop(in_tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("exec ends once the gateway ends the stream")
            .unwrap();
        output
    }

    #[test]
    fn environment_is_built_from_scratch() {
        let settings = ExecSettings {
            lang: Some("C.UTF-8".into()),
            ..settings(Path::new("/sandbox"))
        };
        let requested = HashMap::from([
            ("FOO".to_owned(), "bar".to_owned()),
            ("HOME".to_owned(), "/elsewhere".to_owned()),
            (TOKEN_VAR.to_owned(), "leak".to_owned()),
            ("A=B".to_owned(), "x".to_owned()),
        ]);
        let env = settings.environment(false, &requested);
        let get = |key: &str| env.get(&OsString::from(key)).cloned();
        assert_eq!(get("PATH"), Some(DEFAULT_PATH.into()));
        assert_eq!(get("HOME"), Some("/elsewhere".into()));
        assert_eq!(get("OPENSHELL_SANDBOX_ID"), Some("sb-1".into()));
        assert_eq!(get("LANG"), Some("C.UTF-8".into()));
        assert_eq!(get("FOO"), Some("bar".into()));
        assert_eq!(get("TERM"), None);
        assert_eq!(get(TOKEN_VAR), None);
        assert_eq!(env.len(), 5);

        let env = settings.environment(true, &HashMap::new());
        assert_eq!(
            env.get(&OsString::from("TERM")),
            Some(&"xterm-256color".into())
        );
        assert_eq!(env.get(&OsString::from("HOME")), Some(&"/sandbox".into()));
    }

    #[test]
    fn provider_environment_sits_under_the_request() {
        let settings = settings(Path::new("/sandbox"));
        settings.provider_env.replace(HashMap::from([
            ("API_KEY".to_owned(), "provider-secret".to_owned()),
            ("SHARED".to_owned(), "provider".to_owned()),
            (TOKEN_VAR.to_owned(), "leak".to_owned()),
        ]));
        assert!(!format!("{settings:?}").contains("provider-secret"));
        let requested = HashMap::from([("SHARED".to_owned(), "request".to_owned())]);
        let env = settings.environment(false, &requested);
        let get = |key: &str| env.get(&OsString::from(key)).cloned();
        assert_eq!(get("API_KEY"), Some("provider-secret".into()));
        assert_eq!(get("SHARED"), Some("request".into()));
        assert_eq!(get(TOKEN_VAR), None);
    }

    #[test]
    fn workdir_is_relative_to_the_sandbox() {
        let base = Path::new("/sandbox");
        assert_eq!(resolve_workdir(base, ""), PathBuf::from("/sandbox"));
        assert_eq!(resolve_workdir(base, "src"), PathBuf::from("/sandbox/src"));
        assert_eq!(resolve_workdir(base, "/tmp"), PathBuf::from("/tmp"));
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
    }

    #[test]
    fn timeouts_are_optional() {
        let mut req = request(&["true"]);
        assert_eq!(execution_timeout(&req), None);
        req.execution_timeout = Some(prost_types::Duration {
            seconds: 2,
            nanos: 500,
        });
        assert_eq!(execution_timeout(&req), Some(Duration::new(2, 500)));
        req.execution_timeout = Some(prost_types::Duration {
            seconds: 0,
            nanos: 0,
        });
        assert_eq!(execution_timeout(&req), None);
        req.execution_timeout = Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        });
        assert_eq!(execution_timeout(&req), None);
        req.execution_timeout = Some(prost_types::Duration {
            seconds: i64::MAX,
            nanos: 999_999_999,
        });
        assert!(execution_timeout(&req).is_some());
    }

    #[tokio::test]
    async fn pipes_carry_megabytes_on_both_streams() {
        let dir = tempfile::tempdir().unwrap();
        let script = "yes out | head -c 3000000 & yes err | head -c 3000000 >&2; wait";
        let output = exec(request(&["sh", "-c", script]), dir.path(), vec![eof()]).await;
        assert_eq!(output.exit, Some(0));
        assert_eq!(output.stdout.len(), 3_000_000);
        assert_eq!(output.stderr.len(), 3_000_000);
        assert!(output.stdout.chunks(4).all(|c| c == &b"out\n"[..c.len()]));
        assert!(output.stderr.chunks(4).all(|c| c == &b"err\n"[..c.len()]));
    }

    #[tokio::test]
    async fn stdin_comes_from_the_request_then_the_relay() {
        let dir = tempfile::tempdir().unwrap();
        let mut req = request(&["cat"]);
        req.stdin = b"hello ".to_vec();
        let output = exec(req, dir.path(), vec![stdin_frame(b"world"), eof()]).await;
        assert_eq!(output.stdout(), "hello world");
        assert_eq!(output.exit, Some(0));
    }

    #[tokio::test]
    async fn child_sees_only_its_environment_and_workdir() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut req = request(&["sh", "-c", "pwd; env | sort"]);
        req.workdir = "sub".into();
        req.environment = HashMap::from([
            ("GREETING".into(), "hi".into()),
            (TOKEN_VAR.into(), "leak".into()),
        ]);
        let output = exec(req, dir.path(), vec![eof()]).await;
        let text = output.stdout();
        let mut lines = text.lines();
        assert_eq!(
            Path::new(lines.next().unwrap()).canonicalize().unwrap(),
            dir.path().join("sub").canonicalize().unwrap()
        );
        let env: Vec<&str> = lines.collect();
        assert!(env.contains(&"GREETING=hi"), "{env:?}");
        assert!(env.contains(&"OPENSHELL_SANDBOX_ID=sb-1"), "{env:?}");
        assert!(
            env.iter().all(|line| !line.starts_with(TOKEN_VAR)),
            "{env:?}"
        );
        assert!(env.iter().all(|line| !line.starts_with("TERM=")), "{env:?}");
    }

    #[tokio::test]
    async fn pty_reports_its_size_and_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let mut req = request(&["sh", "-c", "stty size; exit 3"]);
        req.tty = true;
        req.cols = 100;
        req.rows = 30;
        let output = exec(req, dir.path(), vec![]).await;
        assert_eq!(output.stdout().trim(), "30 100");
        assert!(output.stderr.is_empty());
        assert_eq!(output.exit, Some(3));

        let mut req = request(&["sh", "-c", "stty size; tty; echo $TERM"]);
        req.tty = true;
        let output = exec(req, dir.path(), vec![]).await;
        let text = output.stdout();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        assert_eq!(lines[0], "24 80");
        assert!(lines[1].starts_with("/dev/pts/"), "{lines:?}");
        assert_eq!(lines[2], "xterm-256color");
        assert_eq!(output.exit, Some(0));
    }

    #[tokio::test]
    async fn pty_resize_and_eof() {
        let dir = tempfile::tempdir().unwrap();
        let mut req = request(&["sh", "-c", "read line; stty size; cat; echo done"]);
        req.tty = true;
        let input = vec![resize_frame(50, 10), stdin_frame(b"go\n"), eof()];
        let output = exec(req, dir.path(), input).await;
        let text = output.stdout();
        assert!(text.contains("10 50"), "{text:?}");
        assert!(text.contains("done"), "{text:?}");
        assert_eq!(output.exit, Some(0));
    }

    #[tokio::test]
    async fn spawn_failures_become_stderr_and_an_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let output = exec(request(&["no-such-command-4711"]), dir.path(), vec![]).await;
        assert_eq!(
            output.stderr(),
            "openshell-supervisor: cannot run `no-such-command-4711`: No such file or directory\n"
        );
        assert_eq!(output.exit, Some(127));

        let script = dir.path().join("not-executable");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let output = exec(request(&[script.to_str().unwrap()]), dir.path(), vec![]).await;
        assert!(output.stderr().contains("Permission denied"), "{output:?}");
        assert_eq!(output.exit, Some(126));

        let mut req = request(&["true"]);
        req.workdir = "missing".into();
        let output = exec(req, dir.path(), vec![]).await;
        assert!(output.stderr().contains("working directory"), "{output:?}");
        assert_eq!(output.exit, Some(127));

        let mut req = request(&["no-such-command-4711"]);
        req.tty = true;
        let output = exec(req, dir.path(), vec![]).await;
        assert_eq!(output.exit, Some(127));
    }

    #[tokio::test]
    async fn signals_and_timeouts_map_to_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let output = exec(request(&["sh", "-c", "kill -TERM $$"]), dir.path(), vec![]).await;
        assert_eq!(output.exit, Some(143));

        let mut req = request(&["sh", "-c", "echo started; sleep 30"]);
        req.execution_timeout = Some(prost_types::Duration {
            seconds: 0,
            nanos: 300_000_000,
        });
        let began = std::time::Instant::now();
        let output = exec(req, dir.path(), vec![]).await;
        assert!(began.elapsed() < Duration::from_secs(10));
        assert_eq!(output.stdout(), "started\n");
        assert_eq!(output.exit, Some(124));
    }

    fn process_gone(pid: i32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            // A reparented zombie is dead; reaping it is init's job.
            Ok(stat) => stat
                .rsplit(')')
                .next()
                .unwrap()
                .trim_start()
                .starts_with('Z'),
        }
    }

    /// Starts `sh` with a background `sleep`, reads both pids, then ends the
    /// relay the way `end` says; the whole group must be gone.
    async fn cancelled_exec_leaves_nothing(
        end: impl FnOnce(oneshot::Sender<()>, mpsc::Sender<Result<RelayFrame, tonic::Status>>),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let settings = settings(dir.path());
        let (out_tx, mut out_rx) = mpsc::channel(16);
        let (in_tx, in_rx) = mpsc::channel(16);
        let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
        let req = request(&["sh", "-c", "sleep 30 & echo $$ $!; wait"]);
        let task = tokio::spawn(async move {
            let cancel = async {
                let _ = cancel_rx.await;
            };
            run(req, &settings, out_tx, ReceiverStream::new(in_rx), cancel).await
        });
        let frame = out_rx.recv().await.unwrap();
        let Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
            payload: Some(exec_sandbox_event::Payload::Stdout(chunk)),
        })) = frame.payload
        else {
            panic!("expected the pids first, got {frame:?}");
        };
        let text = String::from_utf8(chunk.data).unwrap();
        let pids: Vec<i32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        end(cancel_tx, in_tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("cancelled exec ends")
            .unwrap();
        // No exit event for a cancelled exec.
        assert!(out_rx.recv().await.is_none());
        assert!(process_gone(pids[0]), "shell still there");
        for _ in 0..50 {
            if process_gone(pids[1]) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("background sleep survived");
    }

    #[tokio::test]
    async fn cancel_kills_the_process_group() {
        cancelled_exec_leaves_nothing(|cancel, _inbound| {
            cancel.send(()).unwrap();
        })
        .await;
    }

    #[tokio::test]
    async fn relay_stream_error_kills_the_process_group() {
        cancelled_exec_leaves_nothing(|_cancel, inbound| {
            inbound
                .try_send(Err(tonic::Status::cancelled("client went away")))
                .unwrap();
            // Keep the cancel sender alive: only the stream error ends it.
            std::mem::forget(_cancel);
        })
        .await;
    }

    #[tokio::test]
    async fn relay_stream_end_kills_the_process_group() {
        cancelled_exec_leaves_nothing(|cancel, inbound| {
            drop(inbound);
            std::mem::forget(cancel);
        })
        .await;
    }
}

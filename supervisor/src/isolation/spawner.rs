//! Starting sandbox inits for a host, from one long-lived thread through one
//! fork server.
//!
//! An init dies with its parent (`PR_SET_PDEATHSIG`), and for Linux the
//! parent is the *thread* that forked it: an init forked from a tokio
//! blocking-pool thread would be killed when that thread retires after ten
//! idle seconds. A per-sandbox supervisor starts its one init from the main
//! thread before the runtime exists. A host starts inits all the time, so
//! one dedicated thread that never exits does it.
//!
//! That thread does not exec an init per sandbox either: it starts one fork
//! server (`openshell-sandbox-init --zygote`, see `init::zygote_main`)
//! and asks it for each init, so every init is a copy-on-write child of one
//! loaded image and costs only the pages it writes (an exec'd init costs
//! its own relocated image). The chain of parent-death signals holds: the
//! server dies with this thread, every init with the server, every sandbox
//! with its init. A server that died is started again on the next request.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;

use anyhow::Context;
use tokio::sync::oneshot;
use tracing::warn;

use super::Sandbox;
use crate::limits::Cgroup;

/// Stack of the spawner thread: it only forks and reads a few lines.
const STACK_SIZE: usize = 256 * 1024;

struct Request {
    sandbox_id: String,
    workdir: PathBuf,
    hide: Vec<PathBuf>,
    cgroup: Option<Arc<Cgroup>>,
    reply: oneshot::Sender<anyhow::Result<Sandbox>>,
}

/// What runs as the fork server.
#[derive(Debug, Clone)]
pub struct ServerProgram {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl ServerProgram {
    /// The standalone init next to this executable, else this executable.
    pub fn find() -> anyhow::Result<(Self, bool)> {
        Ok(match super::standalone_init() {
            Some(program) => (
                Self {
                    program,
                    args: vec![super::init::ZYGOTE_FLAG.into()],
                },
                true,
            ),
            None => (
                Self {
                    program: std::env::current_exe().context("locate own executable")?,
                    args: vec![super::ZYGOTE_COMMAND.into()],
                },
                false,
            ),
        })
    }
}

/// Handle to the spawner thread; cheap to clone.
#[derive(Clone)]
pub struct Spawner {
    requests: std_mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the thread; the fork server starts with the first request.
    pub fn start(server: ServerProgram) -> anyhow::Result<Self> {
        let (requests, incoming) = std_mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("sandbox-inits".into())
            .stack_size(STACK_SIZE)
            .spawn(move || {
                let mut running: Option<ForkServer> = None;
                for request in incoming.iter() {
                    let started = start_one(&server, &mut running, &request);
                    if let Err(Ok(mut sandbox)) = request.reply.send(started) {
                        // Nobody waits for it any more.
                        sandbox.kill();
                    }
                }
                // Every handle is gone, but inits started here may live on:
                // this thread must outlive them.
                loop {
                    std::thread::park();
                }
            })
            .context("starting the sandbox init thread")?;
        Ok(Self { requests })
    }

    /// Starts the init of `sandbox_id` for `workdir` (see
    /// [`Sandbox::start_forked`]) on the spawner thread.
    pub async fn start_sandbox(
        &self,
        sandbox_id: &str,
        workdir: PathBuf,
        hide: Vec<PathBuf>,
        cgroup: Option<Arc<Cgroup>>,
    ) -> anyhow::Result<Sandbox> {
        let (reply, started) = oneshot::channel();
        self.requests
            .send(Request {
                sandbox_id: sandbox_id.to_owned(),
                workdir,
                hide,
                cgroup,
                reply,
            })
            .map_err(|_| anyhow::anyhow!("the sandbox init thread is gone"))?;
        started
            .await
            .map_err(|_| anyhow::anyhow!("the sandbox init thread is gone"))?
    }
}

/// One init through the fork server, starting (or restarting) the server
/// when needed.
fn start_one(
    server: &ServerProgram,
    running: &mut Option<ForkServer>,
    request: &Request,
) -> anyhow::Result<Sandbox> {
    if let Some(current) = running.as_mut()
        && !current.alive()
    {
        warn!("the sandbox init fork server exited; starting it again");
        *running = None;
    }
    if running.is_none() {
        *running = Some(ForkServer::start(server)?);
    }
    let current = running.as_ref().expect("started above");
    Sandbox::start_forked(
        &request.sandbox_id,
        &request.workdir,
        &request.hide,
        request.cgroup.as_deref(),
        |args, fd| current.send(args, fd),
    )
}

/// The running fork server: our child, and our end of its socket.
struct ForkServer {
    child: Child,
    control: OwnedFd,
}

impl ForkServer {
    fn start(server: &ServerProgram) -> anyhow::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into `fds`.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("socketpair");
        }
        // SAFETY: both descriptors are fresh and ours.
        let (control, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let child = Command::new(&server.program)
            .args(&server.args)
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .spawn()
            .context("start the sandbox init fork server")?;
        crate::sandbox_processes::track(child.id() as i32);
        Ok(Self { child, control })
    }

    fn alive(&mut self) -> bool {
        match self.child.try_wait() {
            Ok(None) => true,
            _ => {
                crate::sandbox_processes::untrack(self.child.id() as i32);
                false
            }
        }
    }

    /// One request: the arguments, NUL-separated, with `fd` attached.
    fn send(&self, args: &[OsString], fd: BorrowedFd<'_>) -> std::io::Result<()> {
        let mut payload = Vec::new();
        for arg in args {
            payload.extend_from_slice(OsStr::as_bytes(arg));
            payload.push(0);
        }
        if payload.len() > super::init::REQUEST_MAX {
            // The server would refuse it cut short; say why here.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the sandbox init's arguments take {} bytes, more than the {} a fork server takes (too many or too long --hide paths?)",
                    payload.len(),
                    super::init::REQUEST_MAX
                ),
            ));
        }
        super::init::send_request(self.control.as_raw_fd(), &payload, fd.as_raw_fd())
    }
}

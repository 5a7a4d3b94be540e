//! Starting sandbox inits from one long-lived thread (host mode).
//!
//! An init dies with its parent (`PR_SET_PDEATHSIG`), and for Linux the
//! parent is the *thread* that forked it: an init forked from a tokio
//! blocking-pool thread would be killed when that thread retires after ten
//! idle seconds. A per-sandbox supervisor starts its one init from the main
//! thread before the runtime exists. A host starts inits all the time, so it
//! forks them from this dedicated thread, which never exits: the inits die
//! only when the host process does.

use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;

use anyhow::Context;
use tokio::sync::oneshot;

use super::Sandbox;

/// Stack of the spawner thread: it only forks and reads a few lines.
const STACK_SIZE: usize = 256 * 1024;

struct Request {
    sandbox_id: String,
    workdir: PathBuf,
    hide: Vec<PathBuf>,
    reply: oneshot::Sender<anyhow::Result<Sandbox>>,
}

/// Handle to the spawner thread; cheap to clone.
#[derive(Clone)]
pub struct Spawner {
    requests: std_mpsc::Sender<Request>,
}

impl Spawner {
    /// Starts the thread. Inits run `program` (see
    /// [`super::standalone_init`]), or this executable when `None`.
    pub fn start(program: Option<PathBuf>) -> anyhow::Result<Self> {
        let (requests, incoming) = std_mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("sandbox-inits".into())
            .stack_size(STACK_SIZE)
            .spawn(move || {
                for request in incoming.iter() {
                    let started = Sandbox::start_with(
                        program.as_deref(),
                        &request.sandbox_id,
                        &request.workdir,
                        &request.hide,
                    );
                    if let Err(Ok(mut sandbox)) = request.reply.send(started) {
                        // Nobody waits for it any more.
                        sandbox.kill();
                    }
                }
                // Every handle is gone, but inits forked here may live on:
                // this thread must outlive them.
                loop {
                    std::thread::park();
                }
            })
            .context("starting the sandbox init thread")?;
        Ok(Self { requests })
    }

    /// Starts the init of `sandbox_id` for `workdir` (see
    /// [`Sandbox::start`]) on the spawner thread.
    pub async fn start_sandbox(
        &self,
        sandbox_id: &str,
        workdir: PathBuf,
        hide: Vec<PathBuf>,
    ) -> anyhow::Result<Sandbox> {
        let (reply, started) = oneshot::channel();
        self.requests
            .send(Request {
                sandbox_id: sandbox_id.to_owned(),
                workdir,
                hide,
                reply,
            })
            .map_err(|_| anyhow::anyhow!("the sandbox init thread is gone"))?;
        started
            .await
            .map_err(|_| anyhow::anyhow!("the sandbox init thread is gone"))?
    }
}

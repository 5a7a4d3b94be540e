//! Host mode (`openshell-supervisor host ...`): one process serving a pool
//! of sandboxes, for deployments with many small sandboxes.
//!
//! The host holds one `ConnectHost` session with the gateway (sdk-core's
//! `HostSession`: placement redirects, sticky redials, heartbeats) under its
//! host id and host token. The gateway sends the host's assignment, the full
//! list of its sandboxes, and again whenever it changes; [`pool::Pool`] keeps
//! one runtime ([`runtime`]) per assigned sandbox. Each runtime serves its
//! sandbox exactly as a per-sandbox supervisor does (exec, forward and SSH
//! relays, configuration applied to `.openshell/config.json`, namespace
//! isolation), on a sandbox session that rides inside the host's session.
//!
//! What happens when:
//! - **assigned**: `<root>/<sandbox_id>/` is created (or reused after a host
//!   restart, keeping the SSH host key), the init is started when isolated,
//!   and the sandbox's session opens inside the host's.
//! - **unassigned** (the sandbox was deleted): its relays end, every process
//!   of the sandbox is killed, and `<root>/<sandbox_id>/` is removed.
//! - **the host's session moves** (a replica stops, a connection drops):
//!   nothing stops. Sandbox sessions end and open again on the new session;
//!   relays and processes started before go on, each until its own stream
//!   ends.
//! - **SIGTERM or SIGINT**: every sandbox is stopped (processes killed,
//!   directories kept), the session closed, and the process exits 0.
//!
//! Memory: a sandbox costs tasks, not threads: its session, its relay loop
//! and a pidfd watch of its PID 1. Inits are forked by one fork server that
//! one thread started ([`crate::isolation::spawner`]); once a sandbox is set
//! up its PID 1 execs the tiny reaper program (`reaper/reaper.rs`), a few
//! KiB each; an SSH server configuration is built per connection from the
//! sandbox's key; one malloc arena serves every thread, and freed heap
//! pages go back to the kernel once enough are free ([`heap`]); the whole
//! host runs on one runtime thread by default (`--worker-threads`), however
//! many cores.

mod heap;
pub mod pool;
pub mod runtime;

#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use openshell_sdk::{HostEvent, HostSession};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::isolation::{self, spawner::ServerProgram, spawner::Spawner};
use crate::sandbox_processes;
use crate::transport::{self, BearerToken};

use self::pool::Pool;
use self::runtime::{HostSettings, STOP_GRACE};

/// The first argument that selects host mode.
pub const COMMAND: &str = "host";
/// Host events buffered between the host session and the pool.
const HOST_EVENTS: usize = 16;

/// Serves every sandbox the gateway assigns to this host, over one session.
///
/// The host token is read from an inherited descriptor (--token-fd) or a
/// file only its owner may read (--token-file); one of them is required.
#[derive(Debug, Parser)]
#[command(name = "openshell-supervisor host", version)]
struct HostCli {
    /// Gateway URL (http:// or https://): the shared address of the
    /// cluster; the gateway redirects the host to its replica.
    #[arg(long, value_name = "URL")]
    gateway: String,
    /// The host's id (the id its host token was issued for).
    #[arg(long, value_name = "ID")]
    host_id: String,
    /// Read the host token from this inherited descriptor (then closed).
    #[arg(long, value_name = "FD", conflicts_with = "token_file")]
    token_fd: Option<i32>,
    /// Read the host token from this file (kept for the next start; it must
    /// not be readable by group or others).
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Directory of the sandboxes' directories: `<root>/<sandbox_id>/`
    /// holds a sandbox's SSH host key and its working directory `work/`.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Most sandboxes this host serves at once (told to the gateway, which
    /// places no more here); 0: no limit.
    #[arg(long, value_name = "N", default_value_t = 0)]
    capacity: u32,
    /// How sandbox processes run: `namespaces` (each sandbox in user, PID
    /// and mount namespaces of its own, as an unprivileged uid; needs root)
    /// or `none`.
    #[arg(long, value_enum, default_value = "none")]
    isolation: isolation::Mode,
    /// With `--isolation namespaces`: a path sandbox processes must not see
    /// (repeatable). The root is always hidden, except a sandbox's own
    /// working directory.
    #[arg(long, value_name = "PATH")]
    hide: Vec<PathBuf>,
    /// With `--isolation namespaces`: an IPv4 network (`a.b.c.d/n`) no
    /// sandbox may reach, whatever its policy allows (repeatable); the
    /// host's own addresses, link-local ones and the gateway's are always
    /// denied.
    #[arg(long, value_name = "CIDR", value_parser = crate::parse_net)]
    egress_deny: Vec<crate::egress::Net>,
    /// PEM file with the CA that signs the gateway's certificate (https
    /// only; default: system roots).
    #[arg(long, value_name = "PEM")]
    ca_file: Option<PathBuf>,
    /// Threads that run the host's relays and sessions. 1 (the default):
    /// everything on one thread; a host waits on sockets and timers far
    /// more than it computes, and every thread holds stack and allocator
    /// caches of its own. Raise it for a host whose sandboxes move much
    /// data through forwards at once on a machine with cores to spare.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: u16,
    /// One budget for the whole host: all its sandboxes together.
    #[command(flatten)]
    ssh: crate::ssh::input_budget::BudgetArgs,
}

/// Runs host mode; `args` are the arguments after the program name, the
/// first being [`COMMAND`].
pub fn main(args: &[OsString]) -> ExitCode {
    let cli = HostCli::parse_from(args);
    crate::init_logging();
    cli.ssh.install();
    let started = prepare(&cli).and_then(|(secret, spawner)| {
        let runtime = runtime_builder(cli.worker_threads)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        runtime.block_on(run(cli, secret, spawner))
    });
    match started {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// One thread (the default) runs everything on the main thread; more run
/// that many worker threads beside it.
fn runtime_builder(threads: u16) -> tokio::runtime::Builder {
    if threads <= 1 {
        return tokio::runtime::Builder::new_current_thread();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(usize::from(threads));
    builder
}

/// Reads the token and, isolated, checks namespaces and starts the init
/// thread, before the runtime starts threads.
fn prepare(cli: &HostCli) -> anyhow::Result<(String, Option<Spawner>)> {
    // One malloc arena for every thread: per-thread arenas hold freed
    // memory of their own (a few hundred KiB each, idle), and a host's
    // threads are few and allocate little.
    // SAFETY: mallopt only sets a tunable; no allocation is in flight on
    // another thread (none exists yet).
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let secret = transport::read_token(
        cli.token_fd,
        cli.token_file.as_deref(),
        "host",
        transport::TokenFile::KeepPrivate,
    )?;
    isolation::init::close_from(3);
    if cli.host_id.is_empty() {
        anyhow::bail!("--host-id is empty");
    }
    let spawner = match cli.isolation {
        isolation::Mode::None => None,
        isolation::Mode::Namespaces => {
            isolation::check_namespaces()
                .map_err(|reason| anyhow::anyhow!("--isolation namespaces: {reason}"))?;
            let (server, standalone) = ServerProgram::find()?;
            if !standalone {
                warn!(
                    "{} is not next to this executable: sandbox inits are forked from this (larger) binary",
                    isolation::STANDALONE_INIT
                );
            }
            Some(Spawner::start(server)?)
        }
    };
    Ok((secret, spawner))
}

async fn run(cli: HostCli, secret: String, spawner: Option<Spawner>) -> anyhow::Result<()> {
    let token = BearerToken::new(&secret).context("the host token is invalid")?;
    let root =
        std::path::absolute(&cli.root).with_context(|| format!("--root {}", cli.root.display()))?;
    std::fs::create_dir_all(&root).with_context(|| format!("--root {}", root.display()))?;
    let client = transport::client_config(&cli.gateway, &secret, cli.ca_file.as_deref())?;
    drop(secret);
    let log_channel = openshell_sdk::Client::connect_lazy(client.clone())
        .await
        .map_err(|err| anyhow::anyhow!("gateway: {err}"))?
        .channel();
    tokio::spawn(crate::log_push::run(log_channel, token.clone(), None));
    let instance_id = uuid::Uuid::new_v4().to_string();
    info!(
        host_id = cli.host_id,
        instance_id,
        gateway = cli.gateway,
        root = %root.display(),
        capacity = cli.capacity,
        isolation = ?cli.isolation,
        "supervisor host starting"
    );
    let (events_tx, mut events) = mpsc::channel(HOST_EVENTS);
    let host = HostSession::builder(client, cli.host_id.clone())
        .instance_id(instance_id)
        .capacity(cli.capacity)
        .events(events_tx)
        .build()
        .map_err(|err| anyhow::anyhow!("host session: {err}"))?;
    let mut hide = cli.hide.clone();
    hide.push(root.clone());
    let sessions = {
        let host = host.clone();
        Arc::new(move |sandbox_id: &str| host.sandbox_session(sandbox_id))
    };
    let mut pool = Pool::new(Arc::new(HostSettings {
        root,
        spawner,
        hide,
        egress_deny: crate::egress::deny_list(&cli.egress_deny, &cli.gateway),
        token,
        sessions,
    }));

    // Orphans of sandbox processes come back to us, so they can be ended.
    if let Err(err) = sandbox_processes::become_subreaper() {
        warn!(error = %err, "cannot become a child subreaper; orphaned sandbox processes may outlive their sandbox");
    }
    tokio::spawn(sandbox_processes::reap_loop());
    tokio::spawn(heap::release_loop());
    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;

    let cancel = CancellationToken::new();
    let mut protocol = tokio::spawn({
        let (host, cancel) = (host.clone(), cancel.clone());
        async move { host.run(cancel).await }
    });
    let mut failed = None;
    let mut events_open = true;
    loop {
        tokio::select! {
            event = events.recv(), if events_open => match event {
                Some(HostEvent::Assignment(sandboxes)) => {
                    pool.assign(sandboxes.into_iter().map(|sandbox| {
                        let limits = crate::limits::Limits {
                            memory: sandbox.limits.memory_bytes,
                            cpu_millis: sandbox.limits.cpu_millis,
                            pids: sandbox.limits.pids,
                        };
                        (sandbox.sandbox_id, limits)
                    }));
                    info!(serving = pool.serving().len(), "assignment applied");
                }
                Some(HostEvent::Accepted { session_id, served_by }) => {
                    info!(session_id, served_by, "host session accepted");
                }
                Some(HostEvent::Ended) => {
                    info!("host session ended; sandboxes go on while it reconnects");
                }
                // The session's sender is gone: run() is returning.
                None => events_open = false,
            },
            result = &mut protocol => {
                failed = Some(match result {
                    Ok(Ok(())) => anyhow::anyhow!("the host session ended"),
                    Ok(Err(err)) => anyhow::anyhow!("host session: {err}"),
                    Err(err) => anyhow::anyhow!("host session task: {err}"),
                });
                break;
            }
            _ = sigterm.recv() => { info!("SIGTERM: shutting down"); break; }
            _ = sigint.recv() => { info!("SIGINT: shutting down"); break; }
        }
    }
    pool.shutdown().await;
    cancel.cancel();
    if !protocol.is_finished() {
        let _ = tokio::time::timeout(STOP_GRACE, protocol).await;
    }
    sandbox_processes::kill_all(STOP_GRACE).await;
    info!("supervisor host stopped");
    match failed {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

//! `openshell-supervisor`: the reference supervisor, in two modes.
//!
//! **Per sandbox** (the default, `openshell-supervisor --sandbox-id ...`):
//! the gateway's process sandbox driver starts one per sandbox. It holds the
//! sandbox's session with the gateway ([`session`]) and serves the relays
//! the gateway announces on it: processes ([`exec`]) and loopback TCP
//! connections ([`forward`]). Configuration, pushed or polled, is applied
//! by [`config_apply`] to `.openshell/config.json` in the sandbox directory.
//!
//! **Host** (`openshell-supervisor host ...`, [`host`]): one process serves
//! a pool of sandboxes, the ones the gateway assigns to it, over one host
//! session; each sandbox is served by the same code as in per-sandbox mode
//! (a [`session`] loop per sandbox, with relays that outlive a session
//! move).
//!
//! The sandbox (or host) token arrives on an inherited descriptor
//! (`--token-fd`, how the gateway passes it) or in a file that is deleted
//! once read (`--token-file`), never in the command line or the
//! environment; it is sent as bearer metadata and kept out of logs, errors
//! and child environments. The process is non-dumpable, so other processes
//! of the same user cannot read its memory, environment or descriptors. With
//! `--isolation namespaces` sandbox processes run in namespaces of their own
//! ([`isolation`]). SIGTERM or SIGINT kill every running exec (and, isolated,
//! every process of the sandbox) before the process exits 0. A per-sandbox
//! supervisor whose sandbox the gateway no longer knows for 30 s shuts down
//! the same way and exits 1 ([`give_up`]).

mod config_apply;
mod egress;
mod exec;
mod forward;
mod give_up;
mod host;
mod isolation;
mod limits;
mod log_push;
mod os_error;
mod relay;
mod sandbox_processes;
mod session;
mod sftp;
mod sftp_relay;
mod ssh;
mod transport;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use openshell_sdk::ConfigSession;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::exec::ExecSettings;
use crate::session::{RelayScope, SandboxServing};
use crate::transport::BearerToken;

/// How long shutdown waits for killed execs to be reaped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Reference OpenShell supervisor: keeps one sandbox's session with the
/// gateway and runs the exec and TCP relays it announces.
///
/// The sandbox token is read from an inherited descriptor (--token-fd) or a
/// file deleted once read (--token-file); one of them is required.
#[derive(Debug, Parser)]
#[command(
    name = "openshell-supervisor",
    version,
    after_help = "Host mode (one process serving many sandboxes): openshell-supervisor host --help"
)]
struct Cli {
    /// Gateway URL (http:// or https://).
    #[arg(long, value_name = "URL")]
    gateway: String,
    /// Id of the sandbox this supervisor serves.
    #[arg(long, value_name = "UUID")]
    sandbox_id: String,
    /// The sandbox's working directory: HOME and the base of relative exec
    /// workdirs.
    #[arg(long, value_name = "DIR")]
    workdir: PathBuf,
    /// PEM file with the CA that signs the gateway's certificate (https
    /// only; default: system roots).
    #[arg(long, value_name = "PEM")]
    ca_file: Option<PathBuf>,
    /// Read the sandbox token from this inherited descriptor (then closed).
    #[arg(long, value_name = "FD", conflicts_with = "token_file")]
    token_fd: Option<i32>,
    /// Read the sandbox token from this file, then delete it.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// How sandbox processes run: `namespaces` (their own user, PID and
    /// mount namespaces, as an unprivileged uid; needs root) or `none`.
    #[arg(long, value_enum, default_value = "none")]
    isolation: isolation::Mode,
    /// With `--isolation namespaces`: a path sandbox processes must not see
    /// (repeatable). The working directory stays visible.
    #[arg(long, value_name = "PATH")]
    hide: Vec<PathBuf>,
    /// Tests only: exit after this long of the gateway answering
    /// UNAUTHENTICATED or NOT_FOUND for the sandbox (default 30 s).
    #[arg(
        long,
        hide = true,
        value_name = "MS",
        default_value_t = give_up::DEFAULT_AFTER.as_millis() as u64,
        value_parser = clap::value_parser!(u64).range(100..),
    )]
    give_up_after_ms: u64,
    /// The sandbox's SSH host key (ed25519, OpenSSH format): read, or made
    /// (mode 0600) when missing. Keep it where sandbox processes cannot read
    /// it. Without it, SSH relays get a key that lives as long as the
    /// process.
    #[arg(long, value_name = "PATH")]
    ssh_host_key: Option<PathBuf>,
    /// While no session is accepted, why the gateway cannot be reached is
    /// written here (one line, no secrets), and the file is removed once a
    /// session is accepted; the process driver shows it in the sandbox's
    /// status.
    #[arg(long, value_name = "PATH")]
    status_file: Option<PathBuf>,
    #[command(flatten)]
    limits: limits::LimitArgs,
    /// With `--isolation namespaces`: an IPv4 network (`a.b.c.d/n`) the
    /// sandbox may never reach, whatever its policy allows (repeatable);
    /// the host's own addresses, link-local ones and the gateway's are
    /// always denied.
    #[arg(long, value_name = "CIDR", value_parser = parse_net)]
    egress_deny: Vec<egress::Net>,
    /// Benchmarks only: with `--isolation namespaces`, every namespace but
    /// the network one (the sandbox keeps the host's network), to measure
    /// what the network namespace alone costs.
    #[arg(long, hide = true)]
    host_network: bool,
    #[command(flatten)]
    ssh: ssh::input_budget::BudgetArgs,
}

fn parse_net(text: &str) -> Result<egress::Net, String> {
    egress::Net::parse(text).ok_or_else(|| format!("{text:?} is not an IPv4 network (a.b.c.d/n)"))
}

fn main() -> ExitCode {
    // The init and exec helper modes run before anything else: single
    // threaded, no runtime, no logging of their own.
    let args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1).and_then(|arg| arg.to_str()) {
        Some(isolation::INIT_COMMAND) => {
            return isolation::init::main(&args[2..], isolation::init::Shape::Parent);
        }
        Some(isolation::ZYGOTE_COMMAND) => return isolation::init::zygote_main(),
        Some(isolation::ENTER_COMMAND) => return isolation::enter::main(&args[2..]),
        Some(isolation::SFTP_COMMAND) => {
            isolation::init::non_dumpable();
            return ExitCode::from(sftp::serve_stdio());
        }
        Some(limits::CHECK_COMMAND) => {
            let names: Vec<&str> = limits::available().iter().map(|c| c.name()).collect();
            println!("{}", names.join(" "));
            return ExitCode::SUCCESS;
        }
        Some(isolation::CHECK_COMMAND) => {
            return match isolation::check_namespaces() {
                Ok(()) => ExitCode::SUCCESS,
                Err(reason) => {
                    eprintln!("{reason}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    isolation::init::non_dumpable();
    if args.get(1).and_then(|arg| arg.to_str()) == Some(host::COMMAND) {
        return host::main(&args[1..]);
    }
    let cli = Cli::parse();
    init_logging();
    cli.ssh.install();
    match prepare(&cli).and_then(|(secret, sandbox)| run(cli, secret, sandbox)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr (`RUST_LOG` filters, default `info`) and copies INFO
/// and above to the gateway's record of the sandbox (`log_push`).
fn init_logging() {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::prelude::*;
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    tracing_subscriber::registry()
        .with(stderr)
        .with(log_push::Capture::install().with_filter(LevelFilter::INFO))
        .init();
}

/// Reads the token and starts the sandbox's init: both before the runtime
/// starts threads (the init is spawned from the main thread, which lives as
/// long as the process, so the init's parent-death signal fires only when
/// the supervisor goes).
fn prepare(cli: &Cli) -> anyhow::Result<(String, Prepared)> {
    let secret = transport::read_token(
        cli.token_fd,
        cli.token_file.as_deref(),
        "sandbox",
        transport::TokenFile::Delete,
    )?;
    // Descriptors inherited by accident (the gateway's parents may leak
    // some) must not reach sandbox processes.
    isolation::init::close_from(3);
    if cli.sandbox_id.is_empty() {
        bail!("--sandbox-id is empty");
    }
    let cgroup = limits::Cgroup::create(&cli.sandbox_id, &cli.limits.limits())
        .context("limiting the sandbox's resources")?
        .map(Arc::new);
    let sandbox = match cli.isolation {
        isolation::Mode::None => None,
        isolation::Mode::Namespaces => {
            let workdir = std::path::absolute(&cli.workdir)
                .with_context(|| format!("--workdir {}", cli.workdir.display()))?;
            std::fs::create_dir_all(&workdir)
                .with_context(|| format!("--workdir {}", workdir.display()))?;
            let sandbox = isolation::Sandbox::start(
                &cli.sandbox_id,
                &workdir,
                &cli.hide,
                cgroup.as_deref(),
                cli.host_network,
            )
            .context("isolating the sandbox")?;
            info!(
                init_pid = sandbox.init_pid(),
                uid = isolation::host_id(&cli.sandbox_id),
                "sandbox namespaces ready"
            );
            Some(sandbox)
        }
    };
    Ok((secret, Prepared { sandbox, cgroup }))
}

/// What [`prepare`] set up for the sandbox before the runtime started.
struct Prepared {
    sandbox: Option<isolation::Sandbox>,
    cgroup: Option<Arc<limits::Cgroup>>,
}

#[tokio::main]
async fn run(cli: Cli, secret: String, prepared: Prepared) -> anyhow::Result<()> {
    let Prepared {
        mut sandbox,
        cgroup,
    } = prepared;
    let token = BearerToken::new(&secret).context("the sandbox token is invalid")?;
    let workdir = std::path::absolute(&cli.workdir)
        .with_context(|| format!("--workdir {}", cli.workdir.display()))?;
    if !workdir.is_dir() {
        warn!(workdir = %workdir.display(), "workdir is not a directory (yet)");
    }
    let client = transport::client_config(&cli.gateway, &secret, cli.ca_file.as_deref())?;
    drop(secret);
    let probe_channel = openshell_sdk::Client::connect_lazy(client.clone())
        .await
        .map_err(|err| anyhow::anyhow!("gateway settings: {err}"))?
        .channel();
    let instance_id = uuid::Uuid::new_v4().to_string();
    info!(
        sandbox_id = cli.sandbox_id,
        instance_id,
        gateway = cli.gateway,
        workdir = %workdir.display(),
        "supervisor starting"
    );
    tokio::spawn(log_push::run(
        probe_channel.clone(),
        token.clone(),
        Some(cli.sandbox_id.clone()),
    ));
    let (connected, connected_rx) = watch::channel(false);
    let give_up = give_up::GiveUp {
        channel: probe_channel,
        token: token.clone(),
        sandbox_id: cli.sandbox_id.clone(),
        after: Duration::from_millis(cli.give_up_after_ms),
        connected: connected_rx,
        status_file: cli.status_file.clone(),
    };
    let host_key = match &cli.ssh_host_key {
        Some(path) => ssh::HostKey::load_or_create(path),
        None => Ok(ssh::HostKey::generate()),
    };
    let ssh_host_key = match host_key {
        Ok(key) => {
            info!(fingerprint = key.fingerprint(), "ssh host key");
            Some(key)
        }
        Err(err) => {
            error!("{err:#}; ssh relays will be refused");
            None
        }
    };
    let serving = SandboxServing {
        exec: Arc::new(ExecSettings {
            sandbox_init: sandbox.as_ref().map(isolation::Sandbox::init_pidfd),
            cgroup: cgroup.clone(),
            egress: sandbox
                .as_ref()
                .filter(|_| !cli.host_network)
                .map(|sandbox| {
                    Arc::new(egress::Egress::new(
                        sandbox.init_pidfd(),
                        &egress::deny_list(&cli.egress_deny, &cli.gateway),
                    ))
                }),
            ..ExecSettings::new(cli.sandbox_id.clone(), workdir)
        }),
        ssh_host_key,
        token,
        relay_scope: RelayScope::Session,
    };
    let session = ConfigSession::builder(client, cli.sandbox_id.clone()).instance_id(instance_id);

    // Orphans of sandbox processes come back to us, so shutdown can end them.
    if let Err(err) = sandbox_processes::become_subreaper() {
        warn!(error = %err, "cannot become a child subreaper; orphaned sandbox processes may outlive the supervisor");
    }
    tokio::spawn(sandbox_processes::reap_loop());

    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let (alive, mut all_relays_done) = mpsc::channel::<()>(1);
    let outer_pid = sandbox.as_ref().map(isolation::Sandbox::outer_pid);
    let mut gave_up = None;
    tokio::select! {
        result = session::run(&serving, session, alive, connected) => {
            result?;
            unreachable!("the session loop never ends");
        }
        _ = isolation::ended(outer_pid) => {
            // Exec cannot enter a sandbox whose PID 1 is gone: leave, so the
            // gateway sees the sandbox fail instead of every exec failing.
            bail!("the sandbox init exited");
        }
        reason = give_up.wait() => {
            info!("the gateway no longer knows this sandbox: shutting down");
            gave_up = Some(reason);
        }
        _ = sigterm.recv() => info!("SIGTERM: shutting down"),
        _ = sigint.recv() => info!("SIGINT: shutting down"),
    }
    // The session future is gone, which cancelled every relay: execs are
    // being killed and reaped. Wait until the last relay let go.
    if tokio::time::timeout(SHUTDOWN_GRACE, all_relays_done.recv())
        .await
        .is_err()
    {
        warn!("relays still running at exit");
    }
    // Whatever the sandbox left running (background jobs, daemons) ends too.
    if let Some(sandbox) = sandbox.as_mut() {
        sandbox.kill();
    }
    sandbox_processes::kill_all(SHUTDOWN_GRACE).await;
    if let Some(cgroup) = &cgroup {
        cgroup.remove();
    }
    info!("supervisor stopped");
    match gave_up {
        Some(reason) => bail!(reason),
        None => Ok(()),
    }
}

//! `openshell-supervisor`: the reference supervisor of one sandbox.
//!
//! The gateway's process sandbox driver starts one per sandbox. It holds the
//! sandbox's session with the gateway ([`session`]) and serves the relays
//! the gateway announces on it: processes ([`exec`]) and loopback TCP
//! connections ([`forward`]). Configuration, pushed or polled, is applied
//! by [`config_apply`] to `.openshell/config.json` in the sandbox directory.
//!
//! The sandbox token comes from `OPENSHELL_SANDBOX_TOKEN` only (never a
//! flag, so it does not show in `ps`), is sent as bearer metadata, and is
//! kept out of logs, errors and child environments. SIGTERM or SIGINT kill
//! every running exec before the process exits 0.

mod config_apply;
mod exec;
mod forward;
mod relay;
mod sandbox_processes;
mod session;
mod transport;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use openshell_sdk::ClientConfig;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::exec::ExecSettings;
use crate::session::SessionConfig;
use crate::transport::BearerToken;

const TOKEN_VAR: &str = "OPENSHELL_SANDBOX_TOKEN";
/// How long shutdown waits for killed execs to be reaped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Reference OpenShell supervisor: keeps one sandbox's session with the
/// gateway and runs the exec and TCP relays it announces.
///
/// The sandbox token is read from the OPENSHELL_SANDBOX_TOKEN environment
/// variable (required).
#[derive(Debug, Parser)]
#[command(name = "openshell-supervisor", version)]
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run(cli: Cli) -> anyhow::Result<()> {
    let secret = match std::env::var(TOKEN_VAR) {
        Ok(token) => token,
        Err(std::env::VarError::NotPresent) => bail!("{TOKEN_VAR} is not set"),
        Err(std::env::VarError::NotUnicode(_)) => bail!("{TOKEN_VAR} is not valid UTF-8"),
    };
    let token = BearerToken::new(&secret).with_context(|| format!("{TOKEN_VAR} is invalid"))?;
    if cli.sandbox_id.is_empty() {
        bail!("--sandbox-id is empty");
    }
    let workdir = std::path::absolute(&cli.workdir)
        .with_context(|| format!("--workdir {}", cli.workdir.display()))?;
    if !workdir.is_dir() {
        warn!(workdir = %workdir.display(), "workdir is not a directory (yet)");
    }
    let mut client = ClientConfig::builder(&cli.gateway)
        .token(secret.as_str())
        // The driver hands the supervisor whatever URL the gateway was given.
        .allow_cleartext_token(true)
        .connect_timeout(Duration::from_secs(5))
        // Notices a gateway that vanished without closing the connection.
        .keepalive(Some(Duration::from_secs(15)))
        .keepalive_timeout(Duration::from_secs(10));
    match &cli.ca_file {
        Some(path) if cli.gateway.starts_with("https://") => {
            let pem =
                std::fs::read(path).with_context(|| format!("read CA file {}", path.display()))?;
            client = client.ca_pem(pem);
        }
        Some(_) => warn!("--ca-file is only used for https gateways"),
        None => {}
    }
    let client = client
        .build()
        .map_err(|err| anyhow::anyhow!("gateway settings: {err}"))?;
    drop(secret);
    let instance_id = uuid::Uuid::new_v4().to_string();
    info!(
        sandbox_id = cli.sandbox_id,
        instance_id,
        gateway = cli.gateway,
        workdir = %workdir.display(),
        "supervisor starting"
    );
    let config = SessionConfig {
        client,
        sandbox_id: cli.sandbox_id.clone(),
        instance_id,
        token,
        exec: Arc::new(ExecSettings::new(cli.sandbox_id, workdir)),
    };

    // Orphans of sandbox processes come back to us, so shutdown can end them.
    if let Err(err) = sandbox_processes::become_subreaper() {
        warn!(error = %err, "cannot become a child subreaper; orphaned sandbox processes may outlive the supervisor");
    }
    tokio::spawn(sandbox_processes::reap_loop());

    let mut sigterm = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let (alive, mut all_relays_done) = mpsc::channel::<()>(1);
    tokio::select! {
        result = session::run(config, alive) => {
            result?;
            unreachable!("the session loop never ends");
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
    sandbox_processes::kill_all(SHUTDOWN_GRACE).await;
    info!("supervisor stopped");
    Ok(())
}

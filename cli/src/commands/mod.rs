//! One module per command group; each returns the process's exit code or a
//! [`Failure`](crate::failure::Failure).

use std::future::Future;

use crate::args::{Cli, Command};
use crate::failure::Failure;
use crate::settings::{self, Settings};

mod config;
mod exec;
mod files;
mod forward;
mod gateway;
mod logs;
mod provider;
mod sandbox;
mod signals;
mod ssh;

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Completions(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(
                args.shell,
                &mut command,
                "openshell",
                &mut std::io::stdout(),
            );
            Ok(0)
        }
        Command::Gateway(command) => gateway::run(command),
        command => {
            let settings = settings::resolve(&cli.global)?;
            run_connected(command, settings).await
        }
    }
}

async fn run_connected(command: Command, settings: Settings) -> Result<u8, Failure> {
    match command {
        Command::Sandbox(command) => sandbox::run(command, &settings).await,
        Command::Exec(args) => exec::run(args, &settings).await,
        Command::Logs(args) => logs::run(args, &settings).await,
        Command::Forward(args) => forward::run(args, &settings).await,
        Command::SshProxy(args) => ssh::proxy(args, &settings).await,
        Command::Ssh(args) => ssh::run(args, &settings).await,
        Command::SshConfig(args) => ssh::config(args, &settings).await,
        Command::Config(command) => config::run(command, &settings).await,
        Command::Provider(command) => provider::run(command, &settings).await,
        Command::Gateway(_) | Command::Completions(_) => unreachable!("handled without a gateway"),
    }
}

/// Runs `fut` until it finishes or an interrupting signal arrives; a signal
/// becomes exit code 128 + n after `fut` is dropped (which cancels its
/// calls).
pub(crate) async fn until_signal<T>(
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<Result<T, Failure>, u8> {
    let mut signals = match signals::Interrupts::new() {
        Ok(signals) => signals,
        Err(failure) => return Ok(Err(failure)),
    };
    tokio::select! {
        result = fut => Ok(result),
        code = signals.recv() => Err(code),
    }
}

/// A sandbox name the CLI may put into an ssh command line: the gateway's
/// own charset for names.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), Failure> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(Failure::invalid(format!(
            "{what} {:?} is not a valid name (letters, digits, '-', '_', '.'; not starting with '-' or '.')",
            name.chars().take(64).collect::<String>()
        )))
    }
}

/// A unary call of the contract by path with prost messages (for the RPCs
/// sdk-core has no curated call for), on the core's one call path.
pub(crate) async fn unary<Req, Resp>(
    client: &openshell_sdk::Client,
    path: &str,
    request: &Req,
) -> Result<Resp, Failure>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let response = client
        .raw_unary(
            path,
            bytes::Bytes::from(request.encode_to_vec()),
            openshell_sdk::Metadata::new(),
            openshell_sdk::CallOptions::new(),
        )
        .await?;
    Resp::decode(response.bytes)
        .map_err(|e| Failure::new("protocol", format!("{path}: undecodable answer: {e}")))
}

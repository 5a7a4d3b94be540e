//! `openshell-gateway`: the reference OpenShell gateway.
//!
//! `serve` runs one replica: the OpenShell gRPC API, the supervisor session
//! endpoint, the process sandbox driver, the store (SQLite under the data
//! directory, or PostgreSQL), and Prometheus metrics on a separate listener.
//! Given a peer token it joins a cluster: membership, ring placement,
//! redirects, the peer relay and owner reporting.
//!
//! Layout: `serve` (one replica, wired together) sits on `api` (the gRPC
//! services and the request layer), `config` (configuration model and
//! delivery), `sandboxes` (lifecycle, the process driver, watch),
//! `sessions` (supervisor sessions and relay routing), `cluster`
//! (membership and the ring), and the low layers `store`, `metrics`,
//! `auth`, `validate` and `secret`. A module imports only modules below it;
//! `make test` checks that no two modules import each other in a circle.
//! The edge proxy is its own crate (`openshell-edge`); `up` starts replicas
//! and an edge as processes.

mod api;
mod auth;
mod cluster;
mod config;
mod host_token;
mod metrics;
mod sandboxes;
mod secret;
mod serve;
mod sessions;
mod store;
mod up;
mod validate;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::serve::{ServeArgs, flag_policy};

#[derive(Parser)]
#[command(
    name = "openshell-gateway",
    version,
    about = "Reference OpenShell gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run one gateway replica.
    Serve(ServeArgs),
    /// Run the developer cluster: replicas + edge + process sandboxes.
    Up(up::UpArgs),
    /// Run the edge proxy: routes gRPC by `x-openshell-replica` to replicas.
    Edge(openshell_edge::EdgeArgs),
    /// Issue (or rotate) the token of a shared supervisor host.
    HostToken(host_token::HostTokenArgs),
    /// Show the developer cluster's processes (`up`'s status file).
    Status(up::status::StatusArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let mut cli = Cli::command();
    let matches = cli.get_matches_mut();
    let parsed = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.format(&mut cli).exit());
    match parsed.command {
        Command::Serve(args) => {
            flag_policy::check_serve(
                cli.find_subcommand("serve").expect("serve is a subcommand"),
                matches
                    .subcommand_matches("serve")
                    .expect("serve was parsed"),
                args.allow_test_flags,
            )?;
            serve::serve(args).await
        }
        Command::Up(args) => up::run(args).await,
        Command::Edge(args) => openshell_edge::run(args).await,
        Command::HostToken(args) => host_token::run(args).await,
        Command::Status(args) => std::process::exit(up::status::run(args)?),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Command};

    #[test]
    fn serve_args_debug_redacts_secrets() {
        let cli = Cli::try_parse_from([
            "openshell-gateway",
            "serve",
            "--token",
            "user-token-aaa,user-token-bbb",
            "--peer-token",
            "peer-token-ccc",
            "--database-url",
            "postgres://gw:db-password-ddd@db.example/openshell",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve");
        };
        assert_eq!(args.tokens.len(), 2);
        let shown = format!("{args:?}");
        for secret in ["user-token", "peer-token-ccc", "db-password", "db.example"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}

//! `openshell`: the command line for OpenShell gateways, on sdk-core.
//!
//! - `args`: the command line (clap);
//! - `settings`: endpoint, token and CA from flags, environment, config file;
//! - `failure`: the one-line errors and the exit codes;
//! - `output`: tables, JSON, the spinner;
//! - `terminal`: raw mode and window size for `exec -t`;
//! - `known_hosts`: the host keys `openshell ssh` pins;
//! - `commands`: one module per command group.
//!
//! The process ends with `std::process::exit` once the command returned
//! (guards such as raw mode already dropped): a read of stdin still parked
//! on a blocking thread must not hold the exit up.

mod args;
mod commands;
mod failure;
mod known_hosts;
mod output;
mod settings;
mod terminal;

use clap::Parser;

use crate::args::Cli;
use crate::failure::EXIT_ERROR;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => usage(err),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: io: starting the runtime: {err}");
            std::process::exit(i32::from(EXIT_ERROR));
        }
    };
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("{}", failure.line());
            failure.exit
        }
    };
    std::process::exit(i32::from(code));
}

/// `--help` and `--version` print as clap does (exit 0), as does the help
/// shown for a missing subcommand (exit 2); any other usage error is one
/// line, exit 2.
fn usage(err: clap::Error) -> ! {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => err.exit(),
        _ => {
            let rendered = err.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid command line");
            let message = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("error: usage: {message} (see openshell --help)");
            std::process::exit(2);
        }
    }
}

//! `openshell gateway up ARGS...`: replaces this process with
//! `openshell-gateway up ARGS...`, taken from the directory of the
//! `openshell` executable (where `cargo build` and `cargo install` put both)
//! or else from `PATH`. Ctrl-C then reaches the gateway directly.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use crate::args::GatewayCommand;
use crate::failure::Failure;

const GATEWAY: &str = "openshell-gateway";

/// The gateway binary beside our own executable, else the first on PATH.
pub fn gateway_binary() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(GATEWAY)))
        .filter(|p| p.is_file());
    beside.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(GATEWAY))
                .find(|p| p.is_file())
        })
    })
}

pub fn run(command: GatewayCommand) -> Result<u8, Failure> {
    let GatewayCommand::Up(args) = command;
    let binary = gateway_binary().ok_or_else(|| {
        Failure::new(
            "not_found",
            format!("{GATEWAY} is neither beside this executable nor on PATH (cargo install --path gateway)"),
        )
    })?;
    let err = std::process::Command::new(&binary)
        .arg("up")
        .args(&args.args)
        .exec();
    Err(Failure::new(
        "io",
        format!("running {}: {err}", binary.display()),
    ))
}

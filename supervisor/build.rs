//! Builds `openshell-sandbox-reaper` (`reaper/reaper.rs`), the tiny program
//! a host's sandbox PID 1 execs once set up, for the supervisor to embed.
//! Only on x86-64 Linux: elsewhere `reaper` is not set and PID 1 reaps in
//! the init's own code.

use std::path::PathBuf;
use std::process::Command;

/// Codegen and link options: no std, no start files, nothing dynamic.
const CODEGEN: [&str; 10] = [
    "panic=abort",
    "opt-level=s",
    "debuginfo=0",
    "strip=symbols",
    "relocation-model=static",
    "target-feature=+crt-static",
    "link-arg=-nostartfiles",
    "link-arg=-nostdlib",
    "link-arg=-static",
    "link-arg=-no-pie",
];

fn main() {
    println!("cargo::rustc-check-cfg=cfg(reaper)");
    println!("cargo::rerun-if-changed=reaper/reaper.rs");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch != "x86_64" || os != "linux" {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let target = std::env::var("TARGET").expect("TARGET");
    let mut rustc = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()));
    rustc
        .args([
            "--edition",
            "2024",
            "--crate-type",
            "bin",
            "--target",
            &target,
        ])
        .args(["--crate-name", "openshell_sandbox_reaper"]);
    for option in CODEGEN {
        rustc.args(["-C", option]);
    }
    let status = rustc
        .arg("-o")
        .arg(out.join("openshell-sandbox-reaper"))
        .arg("reaper/reaper.rs")
        .status()
        .expect("running rustc for reaper/reaper.rs");
    assert!(status.success(), "building reaper/reaper.rs failed");
    println!("cargo::rustc-cfg=reaper");
}

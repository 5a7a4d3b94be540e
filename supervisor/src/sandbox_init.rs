//! `openshell-sandbox-init`: a sandbox's init, and nothing else.
//!
//! The same code as `openshell-supervisor __sandbox-init` (the
//! supervisor's `isolation::init` module, compiled in here by path), in a
//! binary of its own so that an init costs what it does, not the
//! supervisor's image: a host keeps two such processes per isolated
//! sandbox for as long as it serves the sandbox, and every exec of the
//! large binary dirties its relocated data (about a megabyte in a debug
//! build) in each of them. The host runs this binary when it sits next to
//! its own executable (cargo builds both), and itself otherwise.

#[allow(dead_code)]
#[path = "isolation/init.rs"]
mod init;

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().and_then(|arg| arg.to_str()) == Some(init::ZYGOTE_FLAG) {
        return init::zygote_main();
    }
    init::main(&args, init::Shape::Parent)
}

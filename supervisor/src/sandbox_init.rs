//! `openshell-sandbox-init`: a sandbox's init, and nothing else.
//!
//! The same code as `openshell-supervisor __sandbox-init` (the
//! supervisor's `isolation::init` module, compiled in here by path), in a
//! binary of its own so that an init costs what it does, not the
//! supervisor's image: a host runs it as its fork server (`--zygote`), and
//! every exec of the large binary would dirty its relocated data (about a
//! megabyte in a debug build). Each isolated sandbox's setup is forked from
//! it; its PID 1 then becomes the reaper program. The host runs this binary
//! when it sits next to its own executable (cargo builds both), and itself
//! otherwise.

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

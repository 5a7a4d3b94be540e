//! OS errors as users read them, and how a program that cannot start is
//! reported (the same whether it is started directly or inside a sandbox).

/// An OS error as its plain description ("Connection refused"), without
/// the " (os error N)" suffix, for messages shown to users.
pub fn describe(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_owned(),
        None => err.to_string(),
    }
}

/// The exit code of a program that could not start, like a shell's: 126
/// when the file is there but cannot be executed, else 127.
pub fn cannot_run_code(err: &std::io::Error) -> i32 {
    match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::ENOEXEC | libc::EISDIR) => 126,
        _ if err.kind() == std::io::ErrorKind::PermissionDenied => 126,
        _ => 127,
    }
}

/// The stderr line of a program that could not start.
pub fn cannot_run_message(argv0: &str, reason: impl std::fmt::Display) -> String {
    format!("openshell-supervisor: cannot run `{argv0}`: {reason}\n")
}

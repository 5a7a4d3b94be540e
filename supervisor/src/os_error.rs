//! OS errors as users read them.

/// An OS error as its plain description ("Connection refused"), without
/// the " (os error N)" suffix, for messages shown to users.
pub fn describe(err: &std::io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_owned(),
        None => err.to_string(),
    }
}

//! How the CLI fails: one line on stderr (`error: <code>: <message>`) with
//! the core's error code, and an exit code.
//!
//! | exit | when |
//! |---|---|
//! | 0 | success |
//! | 1 | an error (the gateway's, the connection's, a bad argument the CLI checks itself) |
//! | 2 | usage: clap refused the command line |
//! | the remote code | `exec` and `ssh`: the command's own exit code (0..=255) |
//! | 255 | `exec` and `ssh`: the CLI itself failed (as ssh does), so a remote 1 stays distinguishable |
//! | 128 + n | interrupted by signal n (Ctrl-C is 130) |

use std::fmt;

/// Exit code of an error.
pub const EXIT_ERROR: u8 = 1;
/// Exit code of `exec` and `ssh` when the CLI itself failed.
pub const EXIT_REMOTE_COMMAND_FAILED: u8 = 255;

/// A failure to report: the code names its kind (the core's codes, plus the
/// CLI's own `invalid_argument`, `io`, `not_found`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub message: String,
    pub exit: u8,
}

impl Failure {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            exit: EXIT_ERROR,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }

    /// The same failure with another exit code.
    pub fn with_exit(mut self, exit: u8) -> Self {
        self.exit = exit;
        self
    }

    /// The one line printed on stderr: control characters (a multi-line
    /// server message) become spaces.
    pub fn line(&self) -> String {
        let message: String = self
            .message
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        format!("error: {}: {}", self.code, message.trim())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl From<openshell_sdk::Error> for Failure {
    fn from(err: openshell_sdk::Error) -> Self {
        Self::new(err.code(), err.message())
    }
}

/// `io` failure naming what was being done (never a secret value).
pub fn io(what: &str, err: &std::io::Error) -> Failure {
    Failure::new("io", format!("{what}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_with_the_code() {
        let f = Failure::new("not_found", "sandbox \"x\" not found\nmore");
        assert_eq!(f.line(), "error: not_found: sandbox \"x\" not found more");
        assert_eq!(f.exit, 1);
        let core = openshell_sdk::Error::invalid_config("endpoint has no host");
        assert_eq!(
            Failure::from(core).line(),
            "error: invalid_config: endpoint has no host"
        );
    }
}

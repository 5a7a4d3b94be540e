//! Secret values in arguments and configuration structs (user and peer
//! tokens, a database URL that may carry a password). `Debug` prints
//! `<redacted>`, so a `{:?}` of the structs holding them (a log line, a
//! panic message) never shows the value; code that needs it calls
//! [`Secret::expose`].

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// For clap: any string is a valid secret.
impl FromStr for Secret {
    type Err = Infallible;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(value))
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = Secret::new("hunter2-token");
        assert_eq!(format!("{secret:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(secret.clone())), "Some(<redacted>)");
        assert_eq!(secret.expose(), "hunter2-token");
    }
}

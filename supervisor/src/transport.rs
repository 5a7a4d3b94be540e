//! The sandbox token as request metadata, and status text for logs.
//!
//! Channels come from sdk-core: the session runs on an `openshell_sdk`
//! client, and every `RelayStream` of that session uses the same client's
//! channel, so relays ride the same HTTP/2 connection as the session that
//! announced them (the gateway replica holding the session answers them).
//!
//! The sandbox token is a credential: it lives only inside [`BearerToken`],
//! whose `Debug` is redacted and whose metadata value is marked sensitive.
//! No error message built here contains it.

use std::fmt;

use anyhow::bail;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};

/// The `authorization: Bearer <sandbox token>` value for every call.
#[derive(Clone)]
pub struct BearerToken(AsciiMetadataValue);

impl BearerToken {
    pub fn new(token: &str) -> anyhow::Result<Self> {
        if token.is_empty() {
            bail!("the sandbox token is empty");
        }
        let mut value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("the sandbox token is not a valid header value"))?;
        value.set_sensitive(true);
        Ok(Self(value))
    }

    /// Wraps a message into a request that carries the token.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        request
    }
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

/// A status as text for logs and relay errors: code, message, and the
/// transport causes tonic keeps in the source chain ("Connection refused").
pub fn describe_status(status: &tonic::Status) -> String {
    let mut text = format!("{:?}", status.code());
    if !status.message().is_empty() {
        text.push_str(": ");
        text.push_str(status.message());
    }
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_never_shows_in_debug() {
        let token = BearerToken::new("s3cret-token").unwrap();
        assert!(!format!("{token:?}").contains("s3cret"));
        let request = token.request(());
        let value = request.metadata().get("authorization").unwrap();
        assert_eq!(value.to_str().unwrap(), "Bearer s3cret-token");
        assert!(value.is_sensitive());
    }

    #[test]
    fn bad_tokens_are_rejected_without_echoing_them() {
        assert!(BearerToken::new("").is_err());
        let err = BearerToken::new("bad\ntoken").unwrap_err();
        assert!(!format!("{err:#}").contains("bad"));
    }
}

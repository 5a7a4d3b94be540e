//! The sandbox token as request metadata, and status text for logs.
//!
//! Channels come from sdk-core: the session runs on an `openshell_sdk`
//! client, and every `RelayStream` of that session uses the same client's
//! channel, so relays ride the same HTTP/2 connection as the session that
//! announced them (the gateway replica holding the session answers them).
//!
//! The sandbox (or host) token is a credential: it lives only inside
//! [`BearerToken`], whose `Debug` is redacted and whose metadata value is
//! marked sensitive.
//! No error message built here contains it.

use std::fmt;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};

/// The `authorization: Bearer <sandbox token>` value for every call.
#[derive(Clone)]
pub struct BearerToken(AsciiMetadataValue);

impl BearerToken {
    pub fn new(token: &str) -> anyhow::Result<Self> {
        if token.is_empty() {
            bail!("it is empty");
        }
        let mut value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("it is not a valid header value"))?;
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

/// What to do with `--token-file` once read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFile {
    /// Delete it (a sandbox token: the driver writes a fresh one per start).
    Delete,
    /// Keep it, but only if no group or other may read it (a host token: a
    /// restarted host reads it again).
    KeepPrivate,
}

/// The `what` token (sandbox or host), from an inherited descriptor `fd`
/// (closed after reading) or a `file`, checked to be a usable bearer value.
pub fn read_token(
    fd: Option<i32>,
    file: Option<&Path>,
    what: &str,
    after: TokenFile,
) -> anyhow::Result<String> {
    let mut secret = String::new();
    if let Some(fd) = fd {
        if fd < 3 {
            bail!("--token-fd must name an inherited descriptor above 2");
        }
        // SAFETY: the descriptor was inherited for exactly this; nothing
        // else in the process uses it, and the File closes it.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.read_to_string(&mut secret)
            .with_context(|| format!("reading the {what} token from --token-fd"))?;
    } else if let Some(path) = file {
        if after == TokenFile::KeepPrivate {
            use std::os::unix::fs::MetadataExt;
            let mode = std::fs::metadata(path)
                .context("reading --token-file")?
                .mode();
            if mode & 0o077 != 0 {
                bail!(
                    "--token-file {} may be read by group or others (mode {:o}); chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
        }
        secret = std::fs::read_to_string(path).context("reading --token-file")?;
        if after == TokenFile::Delete {
            std::fs::remove_file(path).context("deleting --token-file")?;
        }
    } else {
        bail!("the {what} token is required: --token-fd or --token-file");
    }
    let secret = secret.trim_end_matches(['\n', '\r']).to_owned();
    BearerToken::new(&secret).with_context(|| format!("the {what} token is invalid"))?;
    Ok(secret)
}

/// The gateway settings of a supervisor or host: `gateway` with `token`,
/// and the CA in `ca_file` for https.
pub fn client_config(
    gateway: &str,
    token: &str,
    ca_file: Option<&Path>,
) -> anyhow::Result<openshell_sdk::ClientConfig> {
    let mut client = openshell_sdk::ClientConfig::builder(gateway)
        .token(token)
        // The driver hands the supervisor whatever URL the gateway was given.
        .allow_cleartext_token(true)
        .connect_timeout(Duration::from_secs(5))
        // Notices a gateway that vanished without closing the connection.
        .keepalive(Some(Duration::from_secs(15)))
        .keepalive_timeout(Duration::from_secs(10));
    match ca_file {
        Some(path) if gateway.starts_with("https://") => {
            let pem =
                std::fs::read(path).with_context(|| format!("read CA file {}", path.display()))?;
            client = client.ca_pem(pem);
        }
        Some(_) => tracing::warn!("--ca-file is only used for https gateways"),
        None => {}
    }
    client
        .build()
        .map_err(|err| anyhow::anyhow!("gateway settings: {err}"))
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

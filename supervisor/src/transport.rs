//! Connections to the gateway: one tonic `Channel` per endpoint, plus the
//! sandbox token as request metadata.
//!
//! The session and every `RelayStream` of that session share one channel,
//! so relays ride the same HTTP/2 connection as the session that announced
//! them (the gateway replica holding the session is the one that answers).
//!
//! The sandbox token is a credential: it lives only inside [`BearerToken`],
//! whose `Debug` is redacted and whose metadata value is marked sensitive.
//! No error message built here contains it.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

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

/// How `https` endpoints are verified: the `--ca-file` CA, else system roots.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    ca: Option<Certificate>,
}

impl TlsSettings {
    pub fn from_ca_file(path: Option<&Path>) -> anyhow::Result<Self> {
        let ca = match path {
            Some(path) => {
                let pem = std::fs::read(path)
                    .with_context(|| format!("read CA file {}", path.display()))?;
                Some(Certificate::from_pem(pem))
            }
            None => None,
        };
        Ok(Self { ca })
    }

    fn client_config(&self) -> ClientTlsConfig {
        match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(ca.clone()),
            None => ClientTlsConfig::new().with_native_roots(),
        }
    }
}

/// Builds a lazily connecting channel to `url` (`http://` or `https://`).
pub fn channel(url: &str, tls: &TlsSettings) -> anyhow::Result<Channel> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("invalid gateway URL {url:?}"))?;
    let endpoint = match endpoint.uri().scheme_str() {
        Some("https") => endpoint
            .tls_config(tls.client_config())
            .with_context(|| format!("TLS setup for {url}"))?,
        Some("http") => endpoint,
        _ => bail!("gateway URL {url:?} must start with http:// or https://"),
    };
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // Notices a gateway that vanished without closing the connection.
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        // Relays carry bulk data; the HTTP/2 default window (64 KiB) is slow.
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20);
    Ok(endpoint.connect_lazy())
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

    #[tokio::test]
    async fn channel_accepts_http_and_https_only() {
        let tls = TlsSettings::default();
        assert!(channel("http://127.0.0.1:1", &tls).is_ok());
        assert!(channel("https://localhost:1", &tls).is_ok());
        assert!(channel("ftp://127.0.0.1:1", &tls).is_err());
        assert!(channel("not a url", &tls).is_err());
    }
}

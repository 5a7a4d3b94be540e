//! Builds the one tonic [`Channel`] a client uses for every call.
//!
//! One HTTP/2 connection (re-established by tonic when it drops) carries all
//! unary calls and streams of a [`Client`](crate::Client). TLS uses rustls
//! with either the system roots or the CA bundle from the configuration.

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::config::ClientConfig;
use crate::error::Error;

/// Largest HTTP/2 frame the client accepts (SETTINGS_MAX_FRAME_SIZE; the
/// default is 16 KiB).
const MAX_FRAME_SIZE: u32 = 256 * 1024;

const USER_AGENT: &str = concat!("openshell-sdk-rust/", env!("CARGO_PKG_VERSION"));

/// The tonic endpoint for a configuration: address, timeouts, keepalive, TLS.
pub fn endpoint(config: &ClientConfig) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::from(config.endpoint.clone())
        .user_agent(USER_AGENT)
        .map_err(|e| Error::invalid_config(format!("user agent: {e}")))?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        // Exec output and forwards are bulk streams; 64 KiB windows throttle them.
        .initial_stream_window_size(2 << 20)
        .initial_connection_window_size(16 << 20)
        // 64 KiB data frames arrive as one HTTP/2 frame each, not five.
        .max_frame_size(MAX_FRAME_SIZE)
        .tcp_keepalive(config.keepalive)
        .keep_alive_timeout(config.keepalive_timeout);
    if let Some(interval) = config.keepalive {
        endpoint = endpoint.http2_keep_alive_interval(interval);
    }
    if config.tls {
        endpoint = endpoint
            .tls_config(tls_config(config))
            .map_err(|e| Error::Tls {
                message: describe(&e),
            })?;
    }
    Ok(endpoint)
}

fn tls_config(config: &ClientConfig) -> ClientTlsConfig {
    let mut tls = ClientTlsConfig::new();
    tls = match &config.ca_pem {
        Some(pem) => tls.ca_certificate(Certificate::from_pem(pem)),
        None => tls.with_native_roots(),
    };
    if let Some(name) = &config.tls_server_name {
        tls = tls.domain_name(name.clone());
    }
    tls.timeout(config.connect_timeout)
}

/// Connects now; fails with `connect` or `tls` if the endpoint is unusable.
pub async fn connect(config: &ClientConfig) -> Result<Channel, Error> {
    endpoint(config)?
        .connect()
        .await
        .map_err(|e| Error::from_transport(&e))
}

/// A channel that connects on first use (and reconnects as needed). Must be
/// called inside a tokio runtime.
pub fn connect_lazy(config: &ClientConfig) -> Result<Channel, Error> {
    Ok(endpoint(config)?.connect_lazy())
}

fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_CA: &str = include_str!("testdata/test-ca.pem");

    #[tokio::test]
    async fn builds_plain_and_tls_endpoints() {
        let plain = ClientConfig::builder("http://127.0.0.1:1").build().unwrap();
        endpoint(&plain).unwrap();
        let with_ca = ClientConfig::builder("https://localhost:1")
            .ca_pem(TEST_CA)
            .tls_server_name("gateway.test")
            .build()
            .unwrap();
        endpoint(&with_ca).unwrap();
        connect_lazy(&with_ca).unwrap();
    }

    #[tokio::test]
    async fn refused_connections_are_connect_errors() {
        // Bind then drop to get a port nobody listens on.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let config = ClientConfig::builder(format!("http://127.0.0.1:{port}"))
            .connect_timeout(std::time::Duration::from_secs(2))
            .build()
            .unwrap();
        let err = connect(&config).await.unwrap_err();
        assert_eq!(err.code(), "connect", "{err}");
        assert!(err.retryable());
    }
}

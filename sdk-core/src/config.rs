//! Client configuration: endpoint, TLS, credentials, timeouts, limits.
//!
//! [`ClientConfig::builder`] validates everything up front, so a bad setting
//! fails with `invalid_config` (or `tls` for an unusable CA) before any
//! connection is attempted.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::auth::{AccessToken, Credentials, TokenProvider};
use crate::error::Error;

/// Default cap on buffered exec output (stdout and stderr together).
pub const DEFAULT_EXEC_OUTPUT_LIMIT: usize = 64 * 1024 * 1024;
/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default HTTP/2 keepalive ping interval.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(30);
/// Default time to wait for a keepalive ping answer.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Default deadline of unary calls and of `wait_ready` / `wait_deleted`.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Default largest message the client accepts.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// Owner-routing settings (see [`ClientConfigBuilder::owner_routing`]),
/// read by the routing layer above this module.
#[derive(Debug, Clone, Copy)]
pub struct RoutingConfig {
    /// Send replica hints at all.
    pub enabled: bool,
    /// How long a cached owner is trusted.
    pub cache_ttl: Duration,
    /// Most sandboxes kept in the cache.
    pub cache_capacity: usize,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            cache_ttl: Duration::from_secs(5),
            cache_capacity: 1024,
        }
    }
}

/// A validated client configuration. Build it with [`ClientConfig::builder`].
///
/// `Debug` never shows the token.
#[derive(Clone)]
pub struct ClientConfig {
    pub(crate) endpoint: http::Uri,
    pub(crate) tls: bool,
    pub(crate) ca_pem: Option<Vec<u8>>,
    pub(crate) tls_server_name: Option<String>,
    pub(crate) credentials: Credentials,
    pub(crate) connect_timeout: Duration,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) keepalive_timeout: Duration,
    pub(crate) default_deadline: Option<Duration>,
    pub(crate) exec_output_limit: usize,
    pub(crate) max_message_size: usize,
    pub(crate) routing: RoutingConfig,
}

impl ClientConfig {
    /// A configuration from the environment: `OPENSHELL_ENDPOINT` (default
    /// `http://127.0.0.1:17670`, what `make up` serves) and, when set,
    /// `OPENSHELL_TOKEN`. The examples use it.
    pub fn from_env() -> ClientConfigBuilder {
        let endpoint = std::env::var("OPENSHELL_ENDPOINT")
            .unwrap_or_else(|_| "http://127.0.0.1:17670".to_owned());
        let builder = Self::builder(endpoint);
        match std::env::var("OPENSHELL_TOKEN") {
            Ok(token) if !token.is_empty() => builder.token(token),
            _ => builder,
        }
    }

    /// Starts a configuration for `endpoint` (`http://host:port` or
    /// `https://host:port`).
    pub fn builder(endpoint: impl Into<String>) -> ClientConfigBuilder {
        ClientConfigBuilder {
            endpoint: endpoint.into(),
            ca_pem: None,
            tls_server_name: None,
            token: None,
            provider: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            keepalive: Some(DEFAULT_KEEPALIVE),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            default_deadline: Some(DEFAULT_DEADLINE),
            exec_output_limit: DEFAULT_EXEC_OUTPUT_LIMIT,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            allow_cleartext_token: false,
            routing: RoutingConfig::default(),
        }
    }

    /// The endpoint URI.
    pub fn endpoint(&self) -> &http::Uri {
        &self.endpoint
    }

    /// Whether the connection uses TLS (`https`).
    pub fn uses_tls(&self) -> bool {
        self.tls
    }

    /// Whether calls carry a bearer token.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// Deadline of unary calls and `wait_*` when the call sets none.
    pub fn default_deadline(&self) -> Option<Duration> {
        self.default_deadline
    }

    /// Cap on buffered exec output.
    pub fn exec_output_limit(&self) -> usize {
        self.exec_output_limit
    }

    /// Connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The same configuration aimed at another endpoint of the same gateway
    /// (a `SessionRedirect` target): credentials, CA bundle and timeouts are
    /// kept. A CA bundle and server name are dropped for an `http` endpoint;
    /// leaving `https` for `http` is refused, so a token that travelled
    /// encrypted never goes out in cleartext.
    pub fn for_endpoint(&self, endpoint: &str) -> Result<ClientConfig, Error> {
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|_| Error::invalid_config(format!("endpoint {endpoint:?} is not a URI")))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(Error::invalid_config(format!(
                    "endpoint {endpoint:?} must start with http:// or https://"
                )));
            }
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(Error::invalid_config("endpoint has no host"));
        }
        if uri.path() != "/" && !uri.path().is_empty() {
            return Err(Error::invalid_config("endpoint must not have a path"));
        }
        if self.tls && !tls {
            return Err(Error::invalid_config(format!(
                "refusing to leave https for cleartext endpoint {endpoint:?}"
            )));
        }
        let mut config = self.clone();
        config.endpoint = uri;
        config.tls = tls;
        if !tls {
            config.ca_pem = None;
            config.tls_server_name = None;
        }
        Ok(config)
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoint", &self.endpoint.to_string())
            .field("tls", &self.tls)
            .field(
                "ca_pem",
                &self.ca_pem.as_ref().map(|p| format!("<{} bytes>", p.len())),
            )
            .field("tls_server_name", &self.tls_server_name)
            .field("credentials", &self.credentials)
            .field("connect_timeout", &self.connect_timeout)
            .field("keepalive", &self.keepalive)
            .field("keepalive_timeout", &self.keepalive_timeout)
            .field("default_deadline", &self.default_deadline)
            .field("exec_output_limit", &self.exec_output_limit)
            .field("max_message_size", &self.max_message_size)
            .finish()
    }
}

/// Builder for [`ClientConfig`]; [`build`](Self::build) validates.
#[derive(Clone)]
pub struct ClientConfigBuilder {
    endpoint: String,
    ca_pem: Option<Vec<u8>>,
    tls_server_name: Option<String>,
    token: Option<AccessToken>,
    provider: Option<Arc<dyn TokenProvider>>,
    connect_timeout: Duration,
    keepalive: Option<Duration>,
    keepalive_timeout: Duration,
    default_deadline: Option<Duration>,
    exec_output_limit: usize,
    max_message_size: usize,
    allow_cleartext_token: bool,
    routing: RoutingConfig,
}

impl ClientConfigBuilder {
    /// Trusts this CA bundle (PEM) instead of the system roots. `https` only.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Overrides the TLS server name (SNI and certificate check); defaults to
    /// the endpoint host.
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// Sends this bearer token on every call.
    pub fn token(mut self, token: impl Into<AccessToken>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Gets bearer tokens from the host (see [`crate::auth`]).
    pub fn token_provider(mut self, provider: Arc<dyn TokenProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Time allowed to establish a connection (TCP and TLS).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// HTTP/2 keepalive ping interval (also used as TCP keepalive); `None`
    /// disables pings.
    pub fn keepalive(mut self, interval: Option<Duration>) -> Self {
        self.keepalive = interval;
        self
    }

    /// Time to wait for a keepalive ping answer before the connection is
    /// considered dead.
    pub fn keepalive_timeout(mut self, timeout: Duration) -> Self {
        self.keepalive_timeout = timeout;
        self
    }

    /// Deadline of unary calls and `wait_ready` / `wait_deleted` when the
    /// call's [`CallOptions`](crate::CallOptions) set none; `None` means no
    /// deadline. Streams never get this default.
    pub fn default_deadline(mut self, deadline: Option<Duration>) -> Self {
        self.default_deadline = deadline;
        self
    }

    /// Cap on buffered exec output, stdout and stderr together.
    pub fn exec_output_limit(mut self, bytes: usize) -> Self {
        self.exec_output_limit = bytes;
        self
    }

    /// Largest response message accepted.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Allows a token over cleartext `http` to a host that is not loopback.
    /// Off by default: the token would travel readable by anyone on the path.
    pub fn allow_cleartext_token(mut self, allow: bool) -> Self {
        self.allow_cleartext_token = allow;
        self
    }

    /// Owner routing (on by default): owner-routed streams carry the replica
    /// hint `x-openshell-replica` of their sandbox's owner. Off: every call
    /// goes out unhinted and multi-replica gateways relay it.
    pub fn owner_routing(mut self, enabled: bool) -> Self {
        self.routing.enabled = enabled;
        self
    }

    /// How long a looked-up owner is trusted (default 5 s).
    pub fn owner_cache_ttl(mut self, ttl: Duration) -> Self {
        self.routing.cache_ttl = ttl;
        self
    }

    /// Validates and returns the configuration.
    pub fn build(self) -> Result<ClientConfig, Error> {
        let endpoint: http::Uri = self.endpoint.parse().map_err(|_| {
            Error::invalid_config(format!("endpoint {:?} is not a URI", self.endpoint))
        })?;
        let tls = match endpoint.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(other) => {
                return Err(Error::invalid_config(format!(
                    "endpoint scheme {other:?} is not supported (use http or https)"
                )));
            }
            None => {
                return Err(Error::invalid_config(format!(
                    "endpoint {:?} needs a scheme (http:// or https://)",
                    self.endpoint
                )));
            }
        };
        let host = endpoint
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| Error::invalid_config("endpoint has no host"))?
            .to_owned();
        if endpoint.path() != "/" && !endpoint.path().is_empty() {
            return Err(Error::invalid_config(
                "endpoint must not have a path (gRPC paths are added per call)",
            ));
        }
        if let Some(pem) = &self.ca_pem {
            if !tls {
                return Err(Error::invalid_config("a CA bundle needs an https endpoint"));
            }
            validate_ca_pem(pem)?;
        }
        if self.tls_server_name.is_some() && !tls {
            return Err(Error::invalid_config(
                "a TLS server name needs an https endpoint",
            ));
        }
        let credentials = match (self.token, self.provider) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid_config(
                    "set either a token or a token provider, not both",
                ));
            }
            (Some(token), None) => {
                if token.secret().trim().is_empty() {
                    return Err(Error::invalid_config("token is empty"));
                }
                crate::auth::bearer_header(&token)?;
                Credentials::Static(token)
            }
            (None, Some(provider)) => Credentials::Provider(provider),
            (None, None) => Credentials::None,
        };
        if credentials.is_some() && !tls && !self.allow_cleartext_token && !is_loopback(&host) {
            return Err(Error::invalid_config(format!(
                "refusing to send a token over cleartext http to {host}; use https or allow_cleartext_token(true)"
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid_config("connect timeout must be positive"));
        }
        if self.keepalive.is_some_and(|k| k.is_zero()) || self.keepalive_timeout.is_zero() {
            return Err(Error::invalid_config("keepalive settings must be positive"));
        }
        if self.default_deadline.is_some_and(|d| d.is_zero()) {
            return Err(Error::invalid_config("default deadline must be positive"));
        }
        if self.exec_output_limit == 0 {
            return Err(Error::invalid_config("exec output limit must be positive"));
        }
        if self.max_message_size < 1024 {
            return Err(Error::invalid_config(
                "max message size must be at least 1 KiB",
            ));
        }
        Ok(ClientConfig {
            endpoint,
            tls,
            ca_pem: self.ca_pem,
            tls_server_name: self.tls_server_name,
            credentials,
            connect_timeout: self.connect_timeout,
            keepalive: self.keepalive,
            keepalive_timeout: self.keepalive_timeout,
            default_deadline: self.default_deadline,
            exec_output_limit: self.exec_output_limit,
            max_message_size: self.max_message_size,
            routing: self.routing,
        })
    }
}

impl fmt::Debug for ClientConfigBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfigBuilder")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "provider",
                &self.provider.as_ref().map(|_| "<host token provider>"),
            )
            .finish_non_exhaustive()
    }
}

/// A CA bundle must hold at least one parsable certificate.
fn validate_ca_pem(pem: &[u8]) -> Result<(), Error> {
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| Error::Tls {
            message: format!("CA bundle is not valid PEM: {e}"),
        })?;
        count += 1;
    }
    if count == 0 {
        return Err(Error::Tls {
            message: "CA bundle holds no PEM certificate".into(),
        });
    }
    Ok(())
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = ClientConfig::builder("http://127.0.0.1:50051")
            .build()
            .unwrap();
        assert!(!c.uses_tls());
        assert!(!c.has_credentials());
        assert_eq!(c.default_deadline(), Some(DEFAULT_DEADLINE));
        assert_eq!(c.exec_output_limit(), DEFAULT_EXEC_OUTPUT_LIMIT);
        assert_eq!(c.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        let c = ClientConfig::builder("https://gw.example:443")
            .build()
            .unwrap();
        assert!(c.uses_tls());
    }

    fn invalid(b: ClientConfigBuilder) -> Error {
        let err = b.build().unwrap_err();
        assert_eq!(err.code(), "invalid_config", "{err}");
        err
    }

    #[test]
    fn rejects_bad_endpoints() {
        invalid(ClientConfig::builder("not a uri"));
        invalid(ClientConfig::builder("127.0.0.1:50051"));
        invalid(ClientConfig::builder("ftp://host:1"));
        invalid(ClientConfig::builder("http://host:1/some/path"));
    }

    #[test]
    fn rejects_conflicting_or_bad_settings() {
        struct P;
        impl TokenProvider for P {
            fn token(&self, _: bool) -> futures::future::BoxFuture<'_, Result<AccessToken, Error>> {
                Box::pin(async { Ok(AccessToken::new("t")) })
            }
        }
        invalid(
            ClientConfig::builder("http://localhost:1")
                .token("a")
                .token_provider(Arc::new(P)),
        );
        invalid(ClientConfig::builder("http://localhost:1").token("  "));
        invalid(ClientConfig::builder("http://localhost:1").ca_pem("x"));
        invalid(ClientConfig::builder("http://localhost:1").tls_server_name("x"));
        invalid(ClientConfig::builder("http://localhost:1").connect_timeout(Duration::ZERO));
        invalid(ClientConfig::builder("http://localhost:1").keepalive(Some(Duration::ZERO)));
        invalid(ClientConfig::builder("http://localhost:1").default_deadline(Some(Duration::ZERO)));
        invalid(ClientConfig::builder("http://localhost:1").exec_output_limit(0));
        invalid(ClientConfig::builder("http://localhost:1").max_message_size(10));
        ClientConfig::builder("http://localhost:1")
            .token_provider(Arc::new(P))
            .default_deadline(None)
            .keepalive(None)
            .build()
            .unwrap();
    }

    #[test]
    fn refuses_cleartext_tokens_to_remote_hosts() {
        let err = invalid(ClientConfig::builder("http://gateway.example:80").token("secret-tok"));
        assert!(!err.to_string().contains("secret-tok"));
        for loopback in ["http://127.0.0.1:1", "http://localhost:1", "http://[::1]:1"] {
            ClientConfig::builder(loopback).token("t").build().unwrap();
        }
        ClientConfig::builder("http://gateway.example:80")
            .token("t")
            .allow_cleartext_token(true)
            .build()
            .unwrap();
        ClientConfig::builder("https://gateway.example")
            .token("t")
            .build()
            .unwrap();
    }

    #[test]
    fn bad_ca_bundles_fail_as_tls() {
        let err = ClientConfig::builder("https://h:1")
            .ca_pem("no certificate here")
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "tls");
        let err = ClientConfig::builder("https://h:1")
            .ca_pem("-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n")
            .build()
            .unwrap_err();
        assert_eq!(err.code(), "tls");
    }

    #[test]
    fn for_endpoint_keeps_settings_and_refuses_downgrades() {
        let home = ClientConfig::builder("http://127.0.0.1:1")
            .token("t")
            .connect_timeout(Duration::from_secs(3))
            .build()
            .unwrap();
        let peer = home.for_endpoint("http://127.0.0.1:2").unwrap();
        assert_eq!(peer.endpoint().port_u16(), Some(2));
        assert!(peer.has_credentials());
        assert_eq!(peer.connect_timeout(), Duration::from_secs(3));
        assert!(
            home.for_endpoint("https://gw.example:443")
                .unwrap()
                .uses_tls()
        );
        for bad in ["nope", "ftp://h:1", "http://h:1/x", "http://"] {
            assert_eq!(
                home.for_endpoint(bad).unwrap_err().code(),
                "invalid_config",
                "{bad}"
            );
        }
        let secure = ClientConfig::builder("https://gw.example:443")
            .token("t")
            .build()
            .unwrap();
        assert_eq!(
            secure.for_endpoint("http://10.0.0.1:1").unwrap_err().code(),
            "invalid_config"
        );
    }

    #[test]
    fn debug_redacts_the_token() {
        let builder = ClientConfig::builder("http://127.0.0.1:1").token("tok-very-secret");
        assert!(!format!("{builder:?}").contains("tok-very-secret"));
        let config = builder.build().unwrap();
        let text = format!("{config:?}");
        assert!(!text.contains("tok-very-secret"), "{text}");
        assert!(text.contains("redacted"));
    }
}

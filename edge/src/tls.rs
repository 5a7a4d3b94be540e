//! TLS on both sides of the edge, with rustls on the ring provider (the one
//! tonic is built with here, so no second provider is compiled in).
//!
//! Upstream: `https://` replica routes are dialled with TLS, ALPN `h2`, the
//! route's host (a DNS name or an IP address) as the name to verify, against
//! `--upstream-ca` or else the system's roots. A certificate that does not
//! verify is a failed dial like a refused connect: nothing of the request
//! was sent. Downstream: `--tls-cert`/`--tls-key` make the edge serve TLS
//! (h2 by ALPN) instead of h2c.
//!
//! Each config is built with its provider explicitly, never from a process
//! default, so nothing here depends on which provider another crate in the
//! same binary installed.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};

const ALPN_H2: &[u8] = b"h2";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn read_certs(path: &Path, what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {what} {} as PEM", path.display()))?;
    if certs.is_empty() {
        bail!("{what} {} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

/// The client side of upstream TLS: trusts every certificate of the PEM
/// bundle at `ca`, or the system's roots without one. Also says how many
/// roots it trusts (none: no https route can ever connect).
pub(crate) fn upstream_config(ca: Option<&Path>) -> anyhow::Result<(Arc<ClientConfig>, usize)> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in read_certs(path, "--upstream-ca")? {
                roots.add(cert).with_context(|| {
                    format!(
                        "--upstream-ca {}: not a usable CA certificate",
                        path.display()
                    )
                })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for err in &native.errors {
                tracing::debug!(%err, "loading a system root certificate");
            }
            let (added, ignored) = roots.add_parsable_certificates(native.certs);
            tracing::debug!(
                added,
                ignored,
                "system root certificates for https replicas"
            );
        }
    }
    let trusted = roots.len();
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok((Arc::new(config), trusted))
}

/// The server side of client TLS: the certificate chain at `cert` with the
/// private key at `key` (PKCS#8, PKCS#1 or SEC1), which must match it.
pub(crate) fn serving_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let chain = read_certs(cert, "--tls-cert")?;
    let pem = std::fs::read(key).with_context(|| format!("reading --tls-key {}", key.display()))?;
    let private = PrivateKeyDer::from_pem_slice(&pem)
        .with_context(|| format!("--tls-key {}: no PEM private key", key.display()))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .with_context(|| {
            format!(
                "--tls-cert {} with --tls-key {}: not a usable pair",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// The ALPN a TLS session settled on must allow HTTP/2: `h2`, or none at
/// all (a peer without ALPN that speaks h2 by prior knowledge).
pub(crate) fn check_alpn(negotiated: Option<&[u8]>) -> anyhow::Result<()> {
    match negotiated {
        None | Some(ALPN_H2) => Ok(()),
        Some(other) => bail!(
            "ALPN negotiated {:?}, not h2",
            String::from_utf8_lossy(other)
        ),
    }
}

//! Routes: which replicas exist and how each is reached, from `--replica`
//! flags and the routes file (re-read on SIGHUP). Only configuration names
//! an address; a request header only picks one of these entries.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use http::Uri;
use http::uri::{Authority, Scheme};
use tokio_rustls::rustls::pki_types::ServerName;

/// Where a replica is reached: always taken from configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) authority: Authority,
    /// `https://` routes: the name the replica's certificate must carry
    /// (the URL's host, a DNS name or an IP address). `None`: h2c.
    pub(crate) tls: Option<ServerName<'static>>,
}

impl Target {
    pub(crate) fn scheme(&self) -> Scheme {
        match self.tls {
            Some(_) => Scheme::HTTPS,
            None => Scheme::HTTP,
        }
    }
}

pub(crate) fn validate_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        bail!("invalid replica id {id:?}: use up to 63 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

pub(crate) fn parse_url(url: &str) -> anyhow::Result<Target> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("invalid replica URL {url:?}"))?;
    let https = match uri.scheme() {
        Some(s) if *s == Scheme::HTTP => false,
        Some(s) if *s == Scheme::HTTPS => true,
        _ => bail!("replica URL {url:?}: use http://host:port (h2c) or https://host:port (TLS)"),
    };
    let authority = uri
        .authority()
        .with_context(|| format!("replica URL {url:?} has no host"))?
        .clone();
    if authority.as_str().contains('@') {
        bail!("replica URL {url:?} must not carry credentials");
    }
    let port = authority
        .port_u16()
        .with_context(|| format!("replica URL {url:?} needs an explicit port"))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        bail!("replica URL {url:?} must not have a path or query");
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if host.is_empty() {
        bail!("replica URL {url:?} has no host");
    }
    let tls = match https {
        true => Some(
            ServerName::try_from(host.clone())
                .with_context(|| format!("replica URL {url:?}: {host:?} is no TLS server name"))?,
        ),
        false => None,
    };
    Ok(Target {
        host,
        port,
        authority,
        tls,
    })
}

pub(crate) fn parse_replica_arg(spec: &str) -> anyhow::Result<(String, Target)> {
    let (id, url) = spec
        .split_once('=')
        .with_context(|| format!("--replica expects ID=URL, got {spec:?}"))?;
    validate_id(id)?;
    let target = parse_url(url).with_context(|| format!("--replica {id}"))?;
    Ok((id.to_owned(), target))
}

#[derive(serde::Deserialize)]
pub(crate) struct RoutesFile {
    pub(crate) replicas: BTreeMap<String, String>,
}

/// The command-line routes plus the routes file (which wins on the same id),
/// ordered by id.
pub(crate) fn load_routes(
    cli: &[(String, Target)],
    file: Option<&Path>,
) -> anyhow::Result<Vec<(String, Target)>> {
    let mut routes: BTreeMap<String, Target> = cli.iter().cloned().collect();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading routes file {}", path.display()))?;
        let parsed: RoutesFile = serde_json::from_str(&text)
            .with_context(|| format!("parsing routes file {}", path.display()))?;
        for (id, url) in parsed.replicas {
            validate_id(&id).with_context(|| format!("routes file {}", path.display()))?;
            let target = parse_url(&url)
                .with_context(|| format!("routes file {}: replica {id}", path.display()))?;
            routes.insert(id, target);
        }
    }
    Ok(routes.into_iter().collect())
}

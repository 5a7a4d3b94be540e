//! The built-in edge with TLS on either side, as real processes on
//! loopback: `https://` replica routes dialled with TLS and verified
//! against `--upstream-ca` (a replica whose certificate does not verify is
//! a failed dial, answered `not-forwarded`), the edge serving TLS to its
//! clients with `--tls-cert`/`--tls-key`, and the flags that stop it at
//! start.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{TOKEN, collect, create_ready, exec_request};
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_sdk::{CallOptions, ClientConfig, ExecRequest};
use openshell_testkit::tls::{TestPki, make_pki};
use openshell_testkit::{Edge, Gateway, GatewayOptions, bin};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};
use tonic::{Code, Request, Status};

const SERVED_BY: &str = "x-openshell-served-by";
const TLS_WARNING: &str = "TLS handshake with the replica failed";

/// A private CA and a server certificate for 127.0.0.1, in its own folder.
fn pki(dir: &Path, name: &str) -> TestPki {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub).unwrap();
    make_pki(&sub)
}

fn tls_replica(id: &str, pki: &TestPki) -> Gateway {
    Gateway::start(GatewayOptions {
        replica_id: Some(id.into()),
        tokens: vec![TOKEN.into()],
        tls: Some((pki.server_cert.clone(), pki.server_key.clone())),
        supervisor_ca: Some(pki.ca_cert.clone()),
        ..Default::default()
    })
}

fn plain_replica(id: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        replica_id: Some(id.into()),
        tokens: vec![TOKEN.into()],
        ..Default::default()
    })
}

/// The CA certificates of `pkis`, one PEM bundle.
fn bundle(dir: &Path, pkis: &[&TestPki]) -> PathBuf {
    let path = dir.join("bundle.pem");
    let pem: Vec<u8> = pkis
        .iter()
        .flat_map(|p| std::fs::read(&p.ca_cert).unwrap())
        .collect();
    std::fs::write(&path, pem).unwrap();
    path
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Bearer token plus an optional `x-openshell-replica`.
#[derive(Clone)]
struct Hinted(Option<String>);

impl tonic::service::Interceptor for Hinted {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let bearer: MetadataValue<_> = format!("Bearer {TOKEN}").parse().unwrap();
        request.metadata_mut().insert("authorization", bearer);
        if let Some(replica) = &self.0 {
            request
                .metadata_mut()
                .insert("x-openshell-replica", replica.parse().unwrap());
        }
        Ok(request)
    }
}

type EdgeClient = OpenShellClient<InterceptedService<Channel, Hinted>>;

/// A channel to `url`, trusting `ca` for an `https://` one.
async fn channel(url: &str, ca: Option<&Path>) -> Result<Channel, tonic::transport::Error> {
    let mut endpoint = Channel::from_shared(url.to_owned()).unwrap();
    if let Some(ca) = ca {
        endpoint = endpoint.tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap())),
        )?;
    }
    endpoint.connect().await
}

async fn client(url: &str, ca: Option<&Path>, replica: Option<&str>) -> EdgeClient {
    let channel = channel(url, ca).await.expect("connect to the edge");
    OpenShellClient::with_interceptor(channel, Hinted(replica.map(str::to_owned)))
}

fn served_by(metadata: &MetadataMap) -> Option<String> {
    metadata
        .get(SERVED_BY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn health(client: &mut EdgeClient) -> Result<String, Status> {
    let response = client.health(HealthRequest {}).await?;
    Ok(served_by(response.metadata()).expect("a replica's answer names the replica"))
}

/// The edge's own answer for a replica it could not reach: UNAVAILABLE, no
/// message, the not-forwarded marker, no served-by.
fn assert_not_forwarded(status: &Status, log: &str) {
    assert_eq!(status.code(), Code::Unavailable, "{status:?}; log:\n{log}");
    assert_eq!(status.message(), "", "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("x-openshell-edge")
            .and_then(|v| v.to_str().ok()),
        Some("not-forwarded"),
        "{status:?}"
    );
    assert_eq!(served_by(status.metadata()), None, "{status:?}");
}

#[tokio::test]
async fn tls_replicas_are_reached_through_the_edge() {
    let dir = tempfile::tempdir().unwrap();
    // Two private CAs, one per replica: --upstream-ca is a bundle of both.
    let (pki0, pki1) = (pki(dir.path(), "a"), pki(dir.path(), "b"));
    let (gw0, gw1) = (tls_replica("gw-0", &pki0), tls_replica("gw-1", &pki1));
    // Mixed schemes: a cleartext replica next to them.
    let gw2 = plain_replica("gw-2");
    assert!(gw0.url.starts_with("https://") && gw1.url.starts_with("https://"));
    let ca = bundle(dir.path(), &[&pki0, &pki1]);
    let edge = Edge::start_with(
        &[("gw-0", &gw0.url), ("gw-1", &gw1.url), ("gw-2", &gw2.url)],
        &["--upstream-ca", arg(&ca)],
    );
    assert!(edge.url.starts_with("http://"), "{}", edge.url);

    for id in ["gw-0", "gw-1", "gw-2", "gw-1", "gw-0"] {
        let mut hinted = client(&edge.url, None, Some(id)).await;
        for _ in 0..2 {
            assert_eq!(health(&mut hinted).await.unwrap(), id);
        }
    }
    let mut any = client(&edge.url, None, None).await;
    let mut seen = BTreeSet::new();
    for _ in 0..9 {
        seen.insert(health(&mut any).await.unwrap());
    }
    assert_eq!(seen.len(), 3, "round robin reaches every replica: {seen:?}");

    // A stream over the TLS hop: 1 MB of stdout and an exit code.
    let mut to_gw1 = client(&edge.url, None, Some("gw-1")).await;
    create_ready(&mut to_gw1, "edge-tls-exec").await;
    let response = to_gw1
        .exec_sandbox(exec_request(
            "edge-tls-exec",
            &[
                "sh",
                "-c",
                "head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2; exit 3",
            ],
        ))
        .await
        .expect("exec");
    assert_eq!(served_by(response.metadata()).as_deref(), Some("gw-1"));
    let out = tokio::time::timeout(Duration::from_secs(60), collect(response.into_inner()))
        .await
        .expect("exec finished within 60 s")
        .expect("exec stream");
    assert_eq!(out.stdout.len(), 1_000_000);
    assert_eq!(out.stderr, b"done\n");
    assert_eq!(out.exit_code, Some(3));
    assert!(!edge.log().contains(TLS_WARNING), "{}", edge.log());
}

/// gw-1's certificate comes from a CA the edge does not trust: its dial
/// fails like a refused connect (nothing sent), hinted calls answer
/// not-forwarded UNAVAILABLE, unhinted ones go to gw-0 (so the SDK never
/// needs its unrouted retry for them), and the log says why, once, without
/// the token.
#[tokio::test]
async fn a_replica_whose_certificate_does_not_verify_is_never_forwarded_to() {
    let dir = tempfile::tempdir().unwrap();
    let (pki0, pki1) = (pki(dir.path(), "a"), pki(dir.path(), "b"));
    let (gw0, gw1) = (tls_replica("gw-0", &pki0), tls_replica("gw-1", &pki1));
    let edge = Edge::start_with(
        &[("gw-0", &gw0.url), ("gw-1", &gw1.url)],
        &["--upstream-ca", arg(&pki0.ca_cert)],
    );
    let mut to_gw1 = client(&edge.url, None, Some("gw-1")).await;
    for _ in 0..3 {
        let status = health(&mut to_gw1).await.unwrap_err();
        assert_not_forwarded(&status, &edge.log());
    }
    let mut any = client(&edge.url, None, None).await;
    for _ in 0..6 {
        assert_eq!(health(&mut any).await.unwrap(), "gw-0");
    }
    assert_eq!(
        health(&mut client(&edge.url, None, Some("gw-0")).await)
            .await
            .unwrap(),
        "gw-0"
    );
    assert!(
        edge.metric("openshell_edge_connect_failures_total")
            .unwrap()
            >= 3.0
    );
    let log = edge.log();
    assert_eq!(log.matches(TLS_WARNING).count(), 1, "{log}");
    assert!(log.contains("--upstream-ca"), "{log}");
    assert!(log.contains("certificate"), "{log}");
    assert!(!log.contains(TOKEN), "the token was logged:\n{log}");

    // The SDK: unhinted calls never need the retry (the edge moves on to
    // gw-0 itself); a call hinted to gw-1 gets exactly one.
    let sdk = openshell_sdk::Client::connect(
        ClientConfig::builder(edge.url.clone())
            .token(TOKEN)
            .allow_cleartext_token(true)
            .build()
            .unwrap(),
    )
    .await
    .expect("SDK connect");
    for _ in 0..4 {
        let answered = sdk.health(CallOptions::new()).await.expect("health");
        assert_eq!(answered.served_by.as_deref(), Some("gw-0"));
    }
    let mut to_gw0 = client(&edge.url, None, Some("gw-0")).await;
    create_ready(&mut to_gw0, "on-gw-0").await;
    let before = sdk.routing_stats();
    let out = sdk
        .exec(
            ExecRequest::new("on-gw-0", ["echo", "unhinted"]),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout_text(), "unhinted\n");
    assert_eq!(
        sdk.routing_stats().unrouted_retries,
        before.unrouted_retries,
        "an unhinted call was retried"
    );
    // A stale owner guess naming gw-1: not forwarded, retried once unhinted.
    sdk.assume_owner("on-gw-0", "gw-1").unwrap();
    let out = sdk
        .exec(
            ExecRequest::new("on-gw-0", ["echo", "retried"]),
            CallOptions::new(),
        )
        .await
        .expect("exec after the unrouted retry");
    assert_eq!(out.stdout_text(), "retried\n");
    assert_eq!(
        sdk.routing_stats().unrouted_retries,
        before.unrouted_retries + 1
    );
}

/// `--tls-cert`/`--tls-key`: the edge serves TLS; a client trusting its CA
/// reaches the replicas (a TLS one behind it too), one trusting another CA
/// or speaking h2c does not.
#[tokio::test]
async fn the_edge_serves_tls_to_clients_that_trust_it() {
    let dir = tempfile::tempdir().unwrap();
    let (edge_pki, replica_pki, other) = (
        pki(dir.path(), "edge"),
        pki(dir.path(), "replica"),
        pki(dir.path(), "other"),
    );
    let gw0 = tls_replica("gw-0", &replica_pki);
    let gw1 = plain_replica("gw-1");
    let edge = Edge::start_with(
        &[("gw-0", &gw0.url), ("gw-1", &gw1.url)],
        &[
            "--tls-cert",
            arg(&edge_pki.server_cert),
            "--tls-key",
            arg(&edge_pki.server_key),
            "--upstream-ca",
            arg(&replica_pki.ca_cert),
        ],
    );
    assert!(edge.url.starts_with("https://"), "{}", edge.url);
    for id in ["gw-0", "gw-1"] {
        let mut hinted = client(&edge.url, Some(&edge_pki.ca_cert), Some(id)).await;
        assert_eq!(health(&mut hinted).await.unwrap(), id);
    }
    let sdk = openshell_sdk::Client::connect(
        ClientConfig::builder(edge.url.clone())
            .token(TOKEN)
            .ca_pem(std::fs::read(&edge_pki.ca_cert).unwrap())
            .build()
            .unwrap(),
    )
    .await
    .expect("SDK connect over TLS");
    let mut seen = BTreeSet::new();
    for _ in 0..4 {
        let answered = sdk.health(CallOptions::new()).await.expect("health");
        seen.insert(answered.served_by.expect("served by"));
    }
    assert_eq!(seen.len(), 2, "{seen:?}");

    // Another CA: the handshake fails, no call is answered.
    let refused = match channel(&edge.url, Some(&other.ca_cert)).await {
        Err(_) => true,
        Ok(channel) => OpenShellClient::new(channel)
            .health(HealthRequest {})
            .await
            .is_err(),
    };
    assert!(refused, "a client trusting another CA got through");
    let untrusting = ClientConfig::builder(edge.url.clone())
        .token(TOKEN)
        .ca_pem(std::fs::read(&other.ca_cert).unwrap())
        .build()
        .unwrap();
    let failed = match openshell_sdk::Client::connect(untrusting).await {
        Err(err) => err,
        Ok(sdk) => sdk.health(CallOptions::new()).await.unwrap_err(),
    };
    assert_eq!(failed.code(), "tls", "{failed:?}");
    // h2c to the TLS port gets nowhere either.
    let cleartext = edge.url.replacen("https://", "http://", 1);
    let h2c = match channel(&cleartext, None).await {
        Err(_) => true,
        Ok(channel) => OpenShellClient::new(channel)
            .health(HealthRequest {})
            .await
            .is_err(),
    };
    assert!(h2c, "an h2c client got an answer from a TLS edge");
    // The edge still serves the trusting client.
    let mut again = client(&edge.url, Some(&edge_pki.ca_cert), None).await;
    health(&mut again).await.unwrap();
}

/// `openshell-gateway edge ARGS` that must not start: exits non-zero
/// within 20 s; its stderr.
fn refused_start(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let mut child = Command::new(bin("openshell-gateway"))
        .arg("edge")
        .args(["--listen", "127.0.0.1:0", "--ready-file", arg(&ready)])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start openshell-gateway edge");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the edge started with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{args:?} exited 0: {stderr}");
    assert!(!ready.exists(), "{args:?} wrote the ready file");
    stderr
}

#[tokio::test]
async fn bad_tls_flags_stop_the_edge_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (pki(dir.path(), "a"), pki(dir.path(), "b"));
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let route = "gw-0=https://127.0.0.1:1";
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (vec!["--tls-key", arg(&a.server_key)], &["--tls-cert"]),
        (vec!["--tls-cert", arg(&a.server_cert)], &["--tls-key"]),
        (
            vec!["--tls-cert", arg(&missing), "--tls-key", arg(&a.server_key)],
            &["--tls-cert", "missing.pem"],
        ),
        (
            vec![
                "--tls-cert",
                arg(&a.server_cert),
                "--tls-key",
                arg(&missing),
            ],
            &["--tls-key", "missing.pem"],
        ),
        (
            vec!["--tls-cert", arg(&not_pem), "--tls-key", arg(&a.server_key)],
            &["--tls-cert", "no PEM certificate"],
        ),
        (
            vec![
                "--tls-cert",
                arg(&a.server_cert),
                "--tls-key",
                arg(&a.server_cert),
            ],
            &["--tls-key", "no PEM private key"],
        ),
        (
            vec![
                "--tls-cert",
                arg(&a.server_cert),
                "--tls-key",
                arg(&b.server_key),
            ],
            &["not a usable pair"],
        ),
        (
            vec!["--upstream-ca", arg(&missing)],
            &["--upstream-ca", "missing.pem"],
        ),
        (
            vec!["--upstream-ca", arg(&not_pem)],
            &["--upstream-ca", "no PEM certificate"],
        ),
        (vec![], &["https://127.0.0.1"]),
    ];
    for (args, wanted) in cases {
        let mut all = vec!["--replica", route];
        if args.is_empty() {
            // An https route without a port.
            all = vec!["--replica", "gw-0=https://127.0.0.1"];
        }
        all.extend(&args);
        let stderr = refused_start(&all);
        for piece in wanted {
            assert!(
                stderr.contains(piece),
                "{all:?}: {piece:?} not in:\n{stderr}"
            );
        }
    }

    // --upstream-ca with only http routes is fine.
    let gw0 = plain_replica("gw-0");
    let edge = Edge::start_with(&[("gw-0", &gw0.url)], &["--upstream-ca", arg(&a.ca_cert)]);
    let mut to_gw0 = client(&edge.url, None, Some("gw-0")).await;
    assert_eq!(health(&mut to_gw0).await.unwrap(), "gw-0");
}

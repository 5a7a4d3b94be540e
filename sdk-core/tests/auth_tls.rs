//! Credentials and TLS against the real gateway: a wrong or missing token,
//! a host token provider refreshed once for 20 concurrent rejected calls,
//! and a gateway serving TLS with a CA made by the test.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use futures::future::BoxFuture;
use openshell_sdk::{
    AccessToken, CallOptions, Client, ClientConfig, CreateSandbox, Error, ExecRequest,
    ListSandboxes, TokenProvider,
};
use openshell_testkit::tls::make_pki;
use openshell_testkit::{Gateway, GatewayOptions};

#[tokio::test]
async fn a_wrong_or_missing_token_is_unauthenticated() {
    let gw = start();
    // A sandbox to aim at, made with the right token.
    let good = client(&gw).await;
    create_ready(&good, "guarded").await;

    let mut lookups = 0;
    for token in [Some("wrong-token-1b2c"), None] {
        let client = client_with_token(&gw, token).await;
        let err = within(
            10,
            "get",
            client.sandboxes().get("guarded", CallOptions::new()),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "unauthenticated", "{token:?}: {err}");
        assert_eq!(err.grpc_code(), tonic::Code::Unauthenticated);
        assert!(!err.retryable());
        assert_eq!(err.served_by(), Some(REPLICA));

        let err = within(
            10,
            "list",
            client
                .sandboxes()
                .list(ListSandboxes::default(), CallOptions::new()),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "unauthenticated", "{err}");

        // Streams too: exec and watch.
        let err = within(
            10,
            "exec",
            client.exec(ExecRequest::new("guarded", ["true"]), CallOptions::new()),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), "unauthenticated", "{err}");
        let mut watch = client
            .sandboxes()
            .watch("guarded", CallOptions::new())
            .await
            .expect("watch handle");
        let err = within(10, "watch", futures::StreamExt::next(&mut watch))
            .await
            .expect("an error")
            .unwrap_err();
        assert_eq!(err.code(), "unauthenticated", "{err}");
        lookups += client.routing_stats().owner_lookups;
    }
    // Two explicit gets, plus the owner lookups before the exec streams.
    let rejected = gw
        .metric(r#"openshell_server_requests_total{method="GetSandbox",code="unauthenticated"}"#)
        .unwrap_or(0.0);
    assert_eq!(
        rejected,
        2.0 + lookups as f64,
        "a static token is not retried"
    );
}

/// Returns a stale token until asked to refresh; counts every call.
struct StaleThenFresh {
    fresh: String,
    calls: AtomicUsize,
    refreshes: AtomicUsize,
}

impl StaleThenFresh {
    fn new(fresh: &str) -> Arc<Self> {
        Arc::new(Self {
            fresh: fresh.to_owned(),
            calls: AtomicUsize::new(0),
            refreshes: AtomicUsize::new(0),
        })
    }
}

impl TokenProvider for StaleThenFresh {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if force_refresh {
                self.refreshes.fetch_add(1, Ordering::SeqCst);
            }
            // Slow enough that concurrent callers pile up on one call.
            tokio::time::sleep(Duration::from_millis(100)).await;
            if force_refresh {
                Ok(AccessToken::new(self.fresh.clone()))
            } else {
                Ok(AccessToken::new("stale-token-e0a1"))
            }
        })
    }
}

async fn provider_client(gw: &Gateway, provider: Arc<dyn TokenProvider>) -> Client {
    let config = ClientConfig::builder(gw.url.clone())
        .token_provider(provider)
        .build()
        .expect("config");
    within(10, "connect", Client::connect(config))
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_rejected_calls_share_exactly_one_refresh() {
    let gw = start();
    create_ready(&client(&gw).await, "shared").await;

    let provider = StaleThenFresh::new(TOKEN);
    let client = provider_client(&gw, provider.clone()).await;
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.sandboxes().get("shared", CallOptions::new()).await })
        })
        .collect();
    within(30, "20 calls", async {
        for call in calls {
            let sandbox = call
                .await
                .expect("task")
                .expect("call succeeds after refresh");
            assert_eq!(sandbox.name, "shared");
        }
    })
    .await;
    assert_eq!(
        provider.refreshes.load(Ordering::SeqCst),
        1,
        "forced refreshes"
    );
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2, "provider calls");
    let rejected = gw
        .metric(r#"openshell_server_requests_total{method="GetSandbox",code="unauthenticated"}"#)
        .unwrap_or(0.0);
    assert!((1.0..=20.0).contains(&rejected), "rejected = {rejected}");

    // The refreshed token is cached: more calls (unary and streams) need no
    // provider call.
    let out = within(
        30,
        "exec",
        client.exec(
            ExecRequest::new("shared", ["echo", "ok"]),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec");
    assert_eq!(out.stdout_text(), "ok\n");
    within(
        10,
        "list",
        client
            .sandboxes()
            .list(ListSandboxes::default(), CallOptions::new()),
    )
    .await
    .expect("list");
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_streaming_call_is_retried_once_after_a_refresh() {
    let gw = start();
    create_ready(&client(&gw).await, "streamed").await;
    let provider = StaleThenFresh::new(TOKEN);
    let client = provider_client(&gw, provider.clone()).await;
    // The first call is a stream: rejected, refreshed, replayed.
    let out = within(
        30,
        "exec",
        client.exec(
            ExecRequest::new("streamed", ["echo", "replayed"]),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec after refresh");
    assert_eq!(out.stdout_text(), "replayed\n");
    assert_eq!(provider.refreshes.load(Ordering::SeqCst), 1);
}

/// Never has a good token.
struct AlwaysWrong(AtomicUsize);

impl TokenProvider for AlwaysWrong {
    fn token(&self, _force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(AccessToken::new(format!("wrong-{n}"))) })
    }
}

/// Fails like a host whose credential store is down.
struct Down;

impl TokenProvider for Down {
    fn token(&self, _force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async { Err(Error::auth("credential store unreachable", true)) })
    }
}

#[tokio::test]
async fn a_provider_that_cannot_help_is_asked_once_more_then_the_error_surfaces() {
    let gw = start();
    let provider = Arc::new(AlwaysWrong(AtomicUsize::new(0)));
    let client = provider_client(&gw, provider.clone()).await;
    let err = within(10, "get", client.sandboxes().get("any", CallOptions::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unauthenticated", "{err}");
    // One token, one forced refresh, no third attempt.
    assert_eq!(provider.0.load(Ordering::SeqCst), 2);

    let client = provider_client(&gw, Arc::new(Down)).await;
    let err = within(10, "get", client.sandboxes().get("any", CallOptions::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "auth", "{err}");
    assert!(err.retryable());
    assert!(err.to_string().contains("credential store unreachable"));
}

#[tokio::test]
async fn tls_with_the_ca_works_end_to_end_and_without_it_fails_with_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let gw = Gateway::start(GatewayOptions {
        tokens: vec![TOKEN.into()],
        tls: Some((pki.server_cert.clone(), pki.server_key.clone())),
        supervisor_ca: Some(pki.ca_cert.clone()),
        replica_id: Some(REPLICA.into()),
        ..Default::default()
    });
    assert!(gw.url.starts_with("https://"), "{}", gw.url);
    let ca = std::fs::read(&pki.ca_cert).unwrap();

    let config = ClientConfig::builder(gw.url.clone())
        .ca_pem(ca.clone())
        .token(TOKEN)
        .build()
        .expect("config");
    assert!(config.uses_tls());
    let client = within(10, "TLS connect", Client::connect(config))
        .await
        .expect("TLS connect with the CA");
    let health = within(10, "health", client.health(CallOptions::new()))
        .await
        .expect("health over TLS");
    assert_eq!(health.served_by.as_deref(), Some(REPLICA));
    // Supervisors reach the gateway over TLS too: the sandbox gets READY and runs.
    within(
        10,
        "create",
        client
            .sandboxes()
            .create(CreateSandbox::new().name("secure"), CallOptions::new()),
    )
    .await
    .expect("create");
    within(
        40,
        "wait_ready",
        client.sandboxes().wait_ready("secure", CallOptions::new()),
    )
    .await
    .expect("ready over TLS");
    let out = within(
        30,
        "exec",
        client.exec(
            ExecRequest::new("secure", ["echo", "over tls"]),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec over TLS");
    assert_eq!(out.stdout_text(), "over tls\n");

    // Without the CA (system roots): the certificate is not trusted.
    let untrusted = ClientConfig::builder(gw.url.clone())
        .token(TOKEN)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let err = within(10, "TLS connect", Client::connect(untrusted.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
    assert!(!err.retryable());
    // The same when the handshake happens on the first call of a lazy client.
    let lazy = Client::connect_lazy(untrusted).await.unwrap();
    let err = within(10, "health", lazy.health(CallOptions::new()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
    let err = within(
        10,
        "exec",
        lazy.exec(ExecRequest::new("secure", ["true"]), CallOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");

    // The right CA but a name the certificate does not carry.
    let misnamed = ClientConfig::builder(gw.url.clone())
        .ca_pem(ca)
        .tls_server_name("gateway.other.example")
        .token(TOKEN)
        .build()
        .unwrap();
    let err = within(10, "TLS connect", Client::connect(misnamed))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");

    // A CA bundle that is not PEM fails as tls before any I/O.
    let err = ClientConfig::builder(gw.url.clone())
        .ca_pem("not a certificate")
        .build()
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
}

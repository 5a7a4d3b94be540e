//! Helpers for the sdk-core integration tests: every test talks to the real
//! `openshell-gateway` (and its real supervisors) started by testkit on
//! loopback. Every wait is bounded.
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecEvent, Sandbox};
use openshell_testkit::{Gateway, GatewayOptions};

/// The user token every test gateway accepts.
pub const TOKEN: &str = "sdk-test-token-7c41d9e2";
/// The replica id test gateways announce in `x-openshell-served-by`.
pub const REPLICA: &str = "gw-sdk-it";

/// A gateway with one user token and a recognisable replica id.
pub fn start() -> Gateway {
    Gateway::start(GatewayOptions {
        replica_id: Some(REPLICA.into()),
        ..GatewayOptions::with_token(TOKEN)
    })
}

/// A connected client with the test token.
pub async fn client(gw: &Gateway) -> Client {
    client_with_token(gw, Some(TOKEN)).await
}

pub async fn client_with_token(gw: &Gateway, token: Option<&str>) -> Client {
    let mut builder = ClientConfig::builder(gw.url.clone())
        .connect_timeout(Duration::from_secs(5))
        .default_deadline(Some(Duration::from_secs(30)));
    if let Some(token) = token {
        builder = builder.token(token);
    }
    let config = builder.build().expect("client config");
    within(10, "connect", Client::connect(config))
        .await
        .expect("connect to the gateway")
}

/// Awaits `fut` for at most `secs` seconds; panics naming `what` otherwise.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {secs} s"),
    }
}

/// Creates a sandbox by name and waits (at most 30 s) until it is READY.
pub async fn create_ready(client: &Client, name: &str) -> Sandbox {
    let sandboxes = client.sandboxes();
    within(
        10,
        "create",
        sandboxes.create(CreateSandbox::new().name(name), CallOptions::new()),
    )
    .await
    .expect("create sandbox");
    within(
        40,
        "wait_ready",
        sandboxes.wait_ready(name, CallOptions::new().deadline(Duration::from_secs(30))),
    )
    .await
    .expect("sandbox ready")
}

/// Reads the next event of an exec stream (at most `secs` seconds).
pub async fn next_event<S>(
    stream: &mut S,
    secs: u64,
) -> Option<Result<ExecEvent, openshell_sdk::Error>>
where
    S: futures::Stream<Item = Result<ExecEvent, openshell_sdk::Error>> + Unpin,
{
    use futures::StreamExt;
    within(secs, "next exec event", stream.next()).await
}

/// Reads the exec's first line of stdout (it announces it started), then
/// returns the host pids of its processes, found by `marker` in the
/// `TEST_MARKER` variable: a pid the sandbox reports is one of its own
/// namespace, not the host's.
pub async fn read_started<S>(stream: &mut S, marker: &str) -> Vec<i32>
where
    S: futures::Stream<Item = Result<ExecEvent, openshell_sdk::Error>> + Unpin,
{
    let mut text = String::new();
    while !text.contains('\n') {
        match next_event(stream, 20).await {
            Some(Ok(ExecEvent::Stdout(data))) => text.push_str(&String::from_utf8_lossy(&data)),
            Some(Ok(ExecEvent::Stderr(data))) => {
                panic!("unexpected stderr: {}", String::from_utf8_lossy(&data))
            }
            other => panic!("expected a line on stdout, got {other:?}"),
        }
    }
    let pids = openshell_testkit::pids_with_env("TEST_MARKER", marker);
    assert!(!pids.is_empty(), "no process carries the marker");
    pids
}

/// An echo server (back what it reads, then a half-close) on one port number
/// in the network of each of `sandboxes`: their own under isolation, the
/// test's otherwise (then one bind serves all).
pub async fn echo_in(client: &Client, sandboxes: &[&str]) -> u16 {
    let mut port = 0;
    for sandbox in sandboxes {
        let argv = openshell_testkit::netns::PRINT_NETNS;
        let out = within(
            20,
            "read the sandbox's netns",
            client.exec(
                openshell_sdk::ExecRequest::new(*sandbox, argv),
                CallOptions::new(),
            ),
        )
        .await
        .expect("exec");
        let link = String::from_utf8_lossy(&out.stdout).into_owned();
        let net = openshell_testkit::netns::SandboxNet::from_link(&link).expect("netns");
        if port != 0 && net.is_own() {
            continue;
        }
        let listener = net
            .listen(("127.0.0.1", port))
            .expect("listen in the sandbox");
        port = listener.local_addr().unwrap().port();
        openshell_testkit::netns::serve_echo(listener);
    }
    port
}

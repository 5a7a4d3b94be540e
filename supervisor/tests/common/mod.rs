//! Helpers for the supervisor's tests: a real `openshell-gateway` started
//! by testkit (no gateway double), the SDK as its client, and waits on
//! processes. Build the binaries first (`cargo build --bins`; `make test`
//! does).
#![allow(dead_code)]

use std::time::Duration;

use futures::StreamExt;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecEvent, ExecRequest};
use openshell_testkit::{Gateway, GatewayOptions};

#[allow(unused_imports)]
pub use openshell_testkit::{eventually, is_running, issue_host_token, sandbox_token};

/// The user token of every test gateway.
pub const TOKEN: &str = "supervisor-test-user-token-41c9";
pub const WAIT: Duration = Duration::from_secs(10);

/// A real gateway with `--driver DRIVER` (`hosts`: sandboxes go to shared
/// hosts; `none`: the test starts each sandbox's supervisor itself).
pub fn gateway(driver: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        extra_args: vec![
            "--allow-test-flags".into(),
            "--driver".into(),
            driver.into(),
        ],
        ..GatewayOptions::with_token(TOKEN)
    })
}

pub async fn client(url: &str) -> Client {
    let config = ClientConfig::builder(url.to_owned())
        .token(TOKEN)
        .default_deadline(Some(Duration::from_secs(60)))
        .exec_output_limit(64 * 1024 * 1024)
        .build()
        .unwrap();
    Client::connect(config).await.expect("connect")
}

/// Creates a sandbox; its id.
pub async fn create(client: &Client, name: &str) -> String {
    client
        .sandboxes()
        .create(CreateSandbox::new().name(name), CallOptions::new())
        .await
        .expect("create")
        .id
}

pub async fn wait_ready(client: &Client, name: &str) {
    client
        .sandboxes()
        .wait_ready(name, CallOptions::new().deadline(Duration::from_secs(30)))
        .await
        .unwrap_or_else(|err| panic!("{name} not ready: {err}"));
}

/// Runs `sh -c script` in `sandbox`; stdout and the exit code.
pub async fn sh(client: &Client, sandbox: &str, script: &str) -> (String, i32) {
    let out = client
        .exec(
            ExecRequest::new(sandbox, ["sh", "-c", script]),
            CallOptions::new(),
        )
        .await
        .unwrap_or_else(|err| panic!("exec {script}: {err}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.exit_code,
    )
}

/// Like [`sh`], retried for up to 30 s while the call fails (a sandbox
/// whose session is coming back).
pub async fn sh_eventually(client: &Client, sandbox: &str, script: &str) -> (String, i32) {
    let request = ExecRequest::new(sandbox, ["sh", "-c", script]);
    let started = std::time::Instant::now();
    loop {
        match client.exec(request.clone(), CallOptions::new()).await {
            Ok(out) => {
                return (
                    String::from_utf8_lossy(&out.stdout).into_owned(),
                    out.exit_code,
                );
            }
            Err(err) if started.elapsed() > Duration::from_secs(30) => {
                panic!("exec {script} still failing: {err}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Starts `sh -c script` as a streaming exec whose first output line is
/// pids (`echo $$ $!`); returns them and the stream (dropping it cancels
/// the exec).
pub async fn exec_with_pids(
    client: &Client,
    sandbox: &str,
    script: &str,
) -> (Vec<i32>, openshell_sdk::ExecStream) {
    let mut stream = client
        .exec_stream(
            ExecRequest::new(sandbox, ["sh", "-c", script]),
            CallOptions::new(),
        )
        .await
        .expect("exec stream");
    let mut line = Vec::new();
    while !line.ends_with(b"\n") {
        match tokio::time::timeout(WAIT, stream.next()).await {
            Ok(Some(Ok(ExecEvent::Stdout(chunk)))) => line.extend_from_slice(&chunk),
            other => panic!("expected pids on stdout, got {other:?}"),
        }
    }
    let pids = String::from_utf8(line)
        .unwrap()
        .split_whitespace()
        .map(|pid| pid.parse().unwrap())
        .collect();
    (pids, stream)
}

pub fn process_gone(pid: i32) -> bool {
    !is_running(pid)
}

pub async fn wait_gone(pid: i32) {
    let gone = eventually(Duration::from_secs(5), || process_gone(pid)).await;
    assert!(gone, "process {pid} is still running");
}

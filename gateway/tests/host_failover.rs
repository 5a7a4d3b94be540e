//! Sandboxes of a lost supervisor host, with real processes only: gateway
//! replicas (`--driver hosts`, `--host-lost-after-ms 3000`) behind the
//! built-in edge, real `openshell-supervisor host` processes, the SDK as
//! the client.
//!
//! - `restart`: a host that stops answering (SIGSTOP: its connection stays
//!   open, so the gateway closes it as idle) loses its sandboxes to a live
//!   host, where they start from nothing; a watcher sees the `HostLost`
//!   condition; when the host answers again it stops the copies it still
//!   runs.
//! - `error`: the sandbox stays on its killed host in ERROR and comes back,
//!   files and all, when the host starts again.
//! - switching `--driver` on restart: process -> hosts adopts a sandbox onto
//!   a host (its process supervisor stops); hosts -> process takes it off
//!   the host and starts a supervisor, and the host stops its copy.

mod common;

use std::time::Duration;

use common::TOKEN;
use common::hosts::*;
use futures::StreamExt;
use openshell_sdk::proto::SandboxPhase;
use openshell_sdk::{CallOptions, Client, ClientConfig, ExecRequest, WatchEvent, WatchOptions};
use openshell_testkit::cluster::Postgres;
use openshell_testkit::{
    Gateway, GatewayOptions, HostOptions, SupervisorHost, eventually, is_running, issue_host_token,
    signal,
};

const LOST_AFTER_MS: &str = "3000";

/// The `HostLost` condition's reason and message.
fn host_lost(sandbox: &openshell_sdk::Sandbox) -> Option<(String, String)> {
    sandbox
        .proto
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.r#type == "HostLost")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

async fn get(client: &Client, name: &str) -> openshell_sdk::Sandbox {
    client
        .sandboxes()
        .get(name, CallOptions::new())
        .await
        .expect("get")
}

/// Exec until it succeeds (a session that just moved may still be coming up).
async fn sh_soon(client: &Client, sandbox: &str, script: &str) -> String {
    within(60, "exec", async {
        loop {
            match client
                .exec(
                    ExecRequest::new(sandbox, ["sh", "-c", script]),
                    CallOptions::new(),
                )
                .await
            {
                Ok(out) if out.exit_code == 0 => {
                    break String::from_utf8_lossy(&out.stdout).into_owned();
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
}

fn total(setup: &Setup, sample: &str) -> f64 {
    setup
        .live()
        .map(|gw| gw.metric(sample).unwrap_or(0.0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_hosts_sandbox_restarts_on_a_live_host_and_the_returning_host_stops_its_copy() {
    restarts_on_a_live_host(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_hosts_sandbox_restarts_on_a_live_host_on_postgres() {
    let pg = Postgres::start();
    restarts_on_a_live_host(Some(pg.url())).await;
}

async fn restarts_on_a_live_host(database_url: Option<String>) {
    let setup = Setup::start_on(
        2,
        3000,
        &[
            "--host-lost-after-ms",
            LOST_AFTER_MS,
            "--heartbeat-ms",
            "1000",
        ],
        database_url,
    )
    .await;
    let mut first = setup.host("h-first", "namespaces");
    setup.holder().await;
    let client = setup.client().await;
    let id = ready_sandbox(&client, "moving").await;
    let copy = keep_a_file_and_a_sleeper(&client, "moving").await;
    assert!(std::fs::metadata(first.workdir(&id)).is_ok());

    let second = setup.host("h-second", "namespaces");
    assert!(
        eventually(Duration::from_secs(30), || setup
            .live()
            .map(held)
            .sum::<f64>()
            == 2.0)
        .await,
        "the second host never connected"
    );
    let mut watch = client.sandboxes().events(
        "moving",
        WatchOptions::default(),
        CallOptions::new().deadline(Duration::from_secs(120)),
    );

    // The first host stops answering: its session idles out (15 s), and
    // 3 s later its sandbox is restarted on the second host.
    let frozen = first.pid().unwrap();
    signal(frozen, libc::SIGSTOP);
    let seen = within(60, "a HostLost event", async {
        while let Some(event) = watch.next().await {
            if let Ok(WatchEvent::Sandbox { sandbox, .. }) = event
                && let Some(lost) = host_lost(&sandbox)
            {
                return lost;
            }
        }
        panic!("the watch ended before a HostLost event");
    })
    .await;
    assert_eq!(seen.0, "Restarted", "{seen:?}");
    assert!(
        seen.1.contains("\"h-first\"") && seen.1.contains("\"h-second\""),
        "{seen:?}"
    );
    assert!(seen.1.contains("not carried over"), "{seen:?}");
    let ready = client
        .sandboxes()
        .wait_ready(
            "moving",
            CallOptions::new().deadline(Duration::from_secs(60)),
        )
        .await
        .expect("ready on the second host");
    assert_eq!(ready.phase, SandboxPhase::Ready);
    // It runs on the second host now, from nothing.
    assert_eq!(sh_soon(&client, "moving", "ls; echo here").await, "here\n");
    assert!(std::fs::metadata(second.workdir(&id)).is_ok());
    assert_eq!(
        total(
            &setup,
            r#"openshell_server_sandboxes_host_lost_total{outcome="restarted"}"#
        ),
        1.0
    );
    // The READY sandbox keeps saying where its files went.
    let now = get(&client, "moving").await;
    assert_eq!(host_lost(&now).map(|l| l.0).as_deref(), Some("Restarted"));

    // The first host answers again: it reconnects, its assignment no longer
    // has the sandbox, and it stops the copy it still ran.
    signal(frozen, libc::SIGCONT);
    let stopped = eventually(Duration::from_secs(40), || {
        copy.iter().all(|pid| !is_running(*pid)) && std::fs::metadata(first.workdir(&id)).is_err()
    })
    .await;
    assert!(stopped, "the returning host still runs its copy: {copy:?}");
    // The sandbox stays served by the second host.
    assert_eq!(sh_soon(&client, "moving", "echo still").await, "still\n");
    first.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_policy_error_a_lost_hosts_sandbox_waits_in_error_and_returns_with_its_host() {
    let setup = Setup::start_with(
        1,
        3000,
        &[
            "--host-lost-after-ms",
            LOST_AFTER_MS,
            "--host-lost-policy",
            "error",
            "--heartbeat-ms",
            "1000",
        ],
    )
    .await;
    let mut host = setup.host("h-only", "namespaces");
    setup.holder().await;
    let client = setup.client().await;
    ready_sandbox(&client, "waits").await;
    assert_eq!(
        sh_soon(&client, "waits", "echo kept > kept; echo ok").await,
        "ok\n"
    );

    host.kill();
    let errored = within(60, "ERROR with HostLost", async {
        loop {
            let sandbox = get(&client, "waits").await;
            if sandbox.phase == SandboxPhase::Error {
                break sandbox;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let (reason, message) = host_lost(&errored).expect("a HostLost condition");
    assert_eq!(reason, "HostGone", "{message}");
    assert!(message.contains("\"h-only\""), "{message}");
    assert_eq!(
        total(
            &setup,
            r#"openshell_server_sandboxes_host_lost_total{outcome="error"}"#
        ),
        1.0
    );

    // A client waiting for it is told why it is not coming.
    let failed = client
        .sandboxes()
        .wait_ready(
            "waits",
            CallOptions::new().deadline(Duration::from_secs(10)),
        )
        .await
        .expect_err("an ERROR sandbox is not ready");
    assert!(failed.to_string().contains("HostLost"), "{failed}");

    // The same host starts again: the sandbox comes back with its files,
    // and the wait is over.
    host.restart();
    within(60, "READY again", async {
        while get(&client, "waits").await.phase != SandboxPhase::Ready {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_eq!(sh_soon(&client, "waits", "cat kept").await, "kept\n");
    assert_eq!(host_lost(&get(&client, "waits").await), None);
}

fn single(driver: &str) -> Vec<String> {
    [
        "--allow-test-flags",
        "--driver",
        driver,
        "--host-lost-after-ms",
        LOST_AFTER_MS,
        "--heartbeat-ms",
        "1000",
    ]
    .map(String::from)
    .to_vec()
}

/// Waits (at most 60 s) for `switch` to be READY after a driver change;
/// returns its `HostLost` message, whose reason must be `DriverChanged`.
async fn adopted(client: &Client, what: &str) -> String {
    let sandbox = client
        .sandboxes()
        .wait_ready(
            "switch",
            CallOptions::new().deadline(Duration::from_secs(60)),
        )
        .await
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    let (reason, message) = host_lost(&sandbox).expect("a HostLost condition");
    assert_eq!(reason, "DriverChanged", "{message}");
    message
}

async fn direct_client(gw: &Gateway) -> Client {
    let config = ClientConfig::builder(gw.url.clone())
        .token(TOKEN)
        .default_deadline(Some(Duration::from_secs(30)))
        .build()
        .unwrap();
    within(10, "connect", Client::connect(config))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switching_the_driver_adopts_sandboxes_both_ways() {
    let mut gw = Gateway::start(GatewayOptions {
        extra_args: single("process"),
        ..GatewayOptions::with_token(TOKEN)
    });
    let client = direct_client(&gw).await;
    let id = ready_sandbox(&client, "switch").await;
    let supervisor = gw.supervisor_pids();
    assert_eq!(supervisor.len(), 1);

    // process -> hosts: the sandbox's own supervisor stops, and the sweep
    // restarts the sandbox on the first host that connects.
    gw.set_extra_args(single("hosts"));
    gw.restart();
    let token = issue_host_token(&gw.store_dir(), "h-switch");
    let mut host = SupervisorHost::start(HostOptions {
        gateway: gw.url.clone(),
        host_id: "h-switch".into(),
        token,
        isolation: "namespaces".into(),
        extra_args: Vec::new(),
        launcher: Vec::new(),
    });
    let client = direct_client(&gw).await;
    let message = adopted(&client, "adopted by the host").await;
    assert!(message.contains("\"h-switch\""), "{message}");
    assert!(
        eventually(Duration::from_secs(10), || !is_running(supervisor[0])).await,
        "the process driver's supervisor still runs"
    );
    assert_eq!(
        sh_soon(&client, "switch", "echo on-host").await,
        "on-host\n"
    );
    assert!(std::fs::metadata(host.workdir(&id)).is_ok());

    // hosts -> process: taken off the host, started by the process driver;
    // the host's next assignment has no sandbox and it stops its copy.
    gw.set_extra_args(single("process"));
    gw.restart();
    let client = direct_client(&gw).await;
    let message = adopted(&client, "adopted by the process driver").await;
    assert!(message.contains("--driver process"), "{message}");
    assert_eq!(gw.supervisor_pids().len(), 1);
    assert_eq!(sh_soon(&client, "switch", "echo local").await, "local\n");
    assert!(
        eventually(Duration::from_secs(30), || std::fs::metadata(
            host.workdir(&id)
        )
        .is_err())
        .await,
        "the host still runs its copy"
    );
    host.stop();
}

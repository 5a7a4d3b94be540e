//! `HostSession` against a real `--driver hosts` gateway: `run` returns
//! only after the apply call in flight for one of its sandboxes returned,
//! so a host that tears its state down once `run` is over never races its
//! own apply function.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use openshell_sdk::{ApplyOutcome, CallOptions, ClientConfig, CreateSandbox, HostSession};
use openshell_testkit::{Gateway, GatewayOptions, issue_host_token};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_only_after_the_apply_call_in_flight() {
    let gw = Gateway::start(GatewayOptions {
        replica_id: Some(REPLICA.into()),
        extra_args: ["--allow-test-flags", "--driver", "hosts"]
            .map(String::from)
            .to_vec(),
        ..GatewayOptions::with_token(TOKEN)
    });
    let token = issue_host_token(&gw.store_dir(), "h-in-flight");
    let config = ClientConfig::builder(gw.url.clone())
        .token(token.as_str())
        .build()
        .unwrap();
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let started_tx = Mutex::new(started_tx);
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let host = HostSession::builder(config, "h-in-flight")
        .apply(Arc::new(move |_sandbox: &str, _snapshot| {
            let _ = started_tx.lock().unwrap().send(());
            std::thread::sleep(Duration::from_millis(1500));
            done.store(true, Ordering::SeqCst);
            ApplyOutcome::Applied
        }))
        .build()
        .unwrap();
    let cancel = CancellationToken::new();
    let run = {
        let (host, cancel) = (host.clone(), cancel.clone());
        tokio::spawn(async move { host.run(cancel).await })
    };
    // A sandbox for the host: its first configuration goes to the apply
    // function, and the session ends while that call runs.
    let client = client(&gw).await;
    let created = within(60, "create on the host", async {
        loop {
            match client
                .sandboxes()
                .create(CreateSandbox::new().name("in-flight"), CallOptions::new())
                .await
            {
                Ok(sandbox) => break sandbox,
                // No host session yet.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    assert_eq!(created.name, "in-flight");
    tokio::task::spawn_blocking(move || started_rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the apply function was called");
    cancel.cancel();
    within(30, "run", run).await.unwrap().unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "run returned while an apply call was still running"
    );
}

//! Push config writes reach every replica's sessions while membership
//! changes: a global setting and a provider change written within a second
//! of a fresh start of the whole cluster, and during a rolling restart of
//! its replicas, with 30 sandboxes. The replicas keep the default
//! membership refresh (10 s), so a writer's ring is stale right after a
//! start: it must notify the members the store knows at write time.
//!
//! Every sandbox must apply each write within 2 s of the write or of the
//! moment all sessions were connected again (a session accepted after the
//! write bootstraps with it), whichever is later.

mod common;
mod config_util;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use config_util::*;
use openshell_proto::*;
use openshell_testkit::cluster::{ClusterOptions, TestCluster};

const SANDBOXES: usize = 30;
const APPLY_WITHIN: Duration = Duration::from_secs(2);

fn push_sessions(cluster: &TestCluster) -> f64 {
    cluster
        .replicas
        .iter()
        .filter(|gw| gw.pid().is_some())
        .map(|gw| metric(gw, "openshell_server_config_push_sessions"))
        .sum()
}

fn provider(value: &str) -> Provider {
    Provider {
        name: "fleet-provider".into(),
        environment: [("FLEET_TOKEN".to_owned(), value.to_owned())].into(),
        ..Default::default()
    }
}

/// Writes a global setting and a provider change through `writer`, then
/// waits until every sandbox applied both (see the module doc for the
/// bound). Returns the slowest delay after the write.
async fn write_and_check(
    cluster: &TestCluster,
    writer: usize,
    wave: u32,
    paths: &[PathBuf],
) -> Duration {
    let mut client = client(&cluster.replicas[writer]).await;
    let before: Vec<u64> = paths
        .iter()
        .map(|p| {
            read_config(p)
                .map(|c| c["provider_env_revision"].as_u64().unwrap_or(0))
                .unwrap_or(0)
        })
        .collect();
    let want = format!("wave-{wave}");
    let written = Instant::now();
    client
        .update_config(UpdateConfigRequest {
            global: true,
            setting_key: "wave".into(),
            setting_value: Some(sandbox::SettingValue {
                value: Some(string(&want)),
            }),
            ..Default::default()
        })
        .await
        .expect("global write");
    client
        .update_provider(UpdateProviderRequest {
            provider: Some(provider(&format!("fleetval-{wave}"))),
        })
        .await
        .expect("provider change");

    let mut applied: Vec<Option<Duration>> = vec![None; paths.len()];
    let mut connected: Option<Duration> = None;
    let limit = Duration::from_secs(40);
    while applied.iter().any(Option::is_none) && written.elapsed() < limit {
        if connected.is_none() && push_sessions(cluster) >= SANDBOXES as f64 {
            connected = Some(written.elapsed());
        }
        for (i, path) in paths.iter().enumerate() {
            if applied[i].is_some() {
                continue;
            }
            if let Some(c) = read_config(path)
                && c["settings"]["wave"]["value"] == want.as_str()
                && c["provider_env_revision"].as_u64().unwrap_or(0) != before[i]
            {
                applied[i] = Some(written.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let missing: Vec<usize> = (0..paths.len()).filter(|i| applied[*i].is_none()).collect();
    assert!(
        missing.is_empty(),
        "wave {wave}: sandboxes {missing:?} never applied the writes within {limit:?}"
    );
    let connected = connected.unwrap_or(Duration::ZERO);
    let bound = connected + APPLY_WITHIN;
    let slowest = applied.iter().flatten().max().copied().unwrap();
    assert!(
        slowest <= bound,
        "wave {wave}: the slowest sandbox applied after {slowest:?}; all sessions were \
         connected after {connected:?}, so the bound was {bound:?}"
    );
    slowest
}

#[tokio::test]
async fn writes_reach_every_session_after_a_fresh_start_and_during_a_rolling_restart() {
    let mut extra_args = push_args(None);
    // Reconcile never repairs within the test: the marks must.
    extra_args.extend(["--allow-test-flags", "--config-reconcile-ms", "600000"].map(String::from));
    let mut cluster = TestCluster::start(ClusterOptions {
        replicas: 3,
        tokens: vec![TOKEN.into()],
        extra_args,
        ..ClusterOptions::default()
    });
    let data = cluster.shared_dir().join("data");
    let mut gw0 = client(&cluster.replicas[0]).await;
    gw0.create_provider(CreateProviderRequest {
        provider: Some(provider("fleetval-0")),
    })
    .await
    .unwrap();
    let mut paths = Vec::new();
    for i in 0..SANDBOXES {
        let name = format!("fleet-{i}");
        let sandbox = create_ready(&mut gw0, &name).await;
        gw0.attach_provider(AttachProviderRequest {
            sandbox: name,
            provider: "fleet-provider".into(),
        })
        .await
        .unwrap();
        paths.push(config_path(&data, &id(&sandbox)));
    }
    for path in &paths {
        wait_config(path, Duration::from_secs(20), |c| {
            c["provider_environment_keys"][0] == "FLEET_TOKEN"
        })
        .await;
    }
    let mut wave = 0;
    let mut slowest = Vec::new();

    // A fresh start of every replica. gw-0 (where supervisors dial) comes
    // up last and places every session on its owner at once, while gw-1
    // has read the membership only before gw-0 and gw-2 registered.
    for id in ["gw-0", "gw-1", "gw-2"] {
        cluster.replica_mut(id).stop();
    }
    for id in ["gw-1", "gw-2", "gw-0"] {
        cluster.replica_mut(id).restart();
    }
    let up = Instant::now();
    // Within a second of the last replica being ready, while supervisors
    // are still reconnecting.
    wave += 1;
    slowest.push(write_and_check(&cluster, 1, wave, &paths).await);
    // And once every session is back (gw-1 has still not refreshed its
    // ring unless reconnecting took 10 s): each must apply within 2 s.
    let back = openshell_testkit::eventually(Duration::from_secs(20), || {
        push_sessions(&cluster) >= SANDBOXES as f64
    })
    .await;
    assert!(back, "sessions did not come back");
    eprintln!(
        "FIGURE fresh start: all {SANDBOXES} push sessions back {:.1} s after the last replica was ready",
        up.elapsed().as_secs_f64()
    );
    wave += 1;
    slowest.push(write_and_check(&cluster, 1, wave, &paths).await);
    let writer = &cluster.replicas[1];
    assert!(
        metric(
            writer,
            r#"openshell_server_config_notify_members_total{source="store"}"#
        ) >= 2.0,
        "{}",
        writer.metrics()
    );
    assert!(
        metric(
            writer,
            r#"openshell_server_config_peer_notifies_total{scope="all",outcome="ok"}"#
        ) >= 2.0,
        "{}",
        writer.metrics()
    );

    // A rolling restart: each replica stops (its sessions move) and comes
    // back (it joins again); writes land during both moments, each through
    // a replica that is not the one restarting.
    for (restarting, writer) in [("gw-2", 1), ("gw-1", 2), ("gw-0", 1)] {
        cluster.replica_mut(restarting).stop();
        wave += 1;
        slowest.push(write_and_check(&cluster, writer, wave, &paths).await);
        cluster.replica_mut(restarting).restart();
        wave += 1;
        slowest.push(write_and_check(&cluster, writer, wave, &paths).await);
    }
    let ms: Vec<String> = slowest
        .iter()
        .map(|d| format!("{:.0}", d.as_secs_f64() * 1000.0))
        .collect();
    eprintln!(
        "FIGURE global write + provider change over {SANDBOXES} sandboxes, slowest apply per wave (ms; fresh start: at once, then with every session back; then stop/start x3): {}",
        ms.join(", ")
    );
    for gw in &cluster.replicas {
        assert!(!gw.log().contains("fleetval-"), "a provider value leaked");
    }
}

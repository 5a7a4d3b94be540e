//! Push config delivery on one replica, against the real gateway and real
//! supervisors: the bootstrap in SessionAccepted, updates applied well under
//! the poll interval, results counted, a rejected update resent by
//! reconcile, identical updates not sent, provider changes rebuilding the
//! environment, poll mode delivering the same configuration, and rollback
//! from push to poll by a restart.

mod common;
mod config_util;

use std::time::Duration;

use common::*;
use config_util::*;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions, eventually};

fn gateway(extra_args: Vec<String>) -> Gateway {
    Gateway::start(GatewayOptions {
        extra_args,
        ..GatewayOptions::with_token(TOKEN)
    })
}

/// The bootstrap was answered (APPLIED, or IGNORED_DUPLICATE of the
/// configuration the supervisor polled at startup).
async fn wait_bootstrap(gw: &Gateway) {
    let ok = eventually(Duration::from_secs(10), || {
        results(gw, "applied") + results(gw, "ignored_duplicate") >= 1.0
    })
    .await;
    assert!(ok, "bootstrap never answered:\n{}", gw.metrics());
}

#[tokio::test]
async fn push_bootstraps_delivers_fast_and_stops_polling() {
    let gw = gateway(push_args(None));
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "pushed").await;
    let ready_at = std::time::Instant::now();
    let id = id(&sandbox);
    let path = config_path(&gw.store_dir(), &id);
    wait_bootstrap(&gw).await;
    assert_eq!(metric(&gw, "openshell_server_config_push_sessions"), 1.0);
    assert_eq!(sent(&gw, "initial"), 1.0);
    let (first, _) = wait_config(&path, Duration::from_secs(5), |_| true).await;
    assert_eq!(revision(&first), 0);

    // Each write reaches the sandbox's file well under the 10 s poll interval.
    let mut latencies = Vec::new();
    for i in 0..10 {
        let answer = set(
            &mut client,
            "pushed",
            "greeting",
            string(&format!("hello-{i}")),
        )
        .await;
        assert_eq!(answer.settings_revision, i + 1);
        let want = format!("hello-{i}");
        let (config, took) = wait_config(&path, Duration::from_secs(3), |c| {
            c["settings"]["greeting"]["value"] == want.as_str()
        })
        .await;
        assert_eq!(revision(&config), i + 1);
        assert_eq!(config["settings"]["greeting"]["scope"], "sandbox");
        latencies.push(took);
    }
    let (median, max) = summary(&latencies);
    eprintln!(
        "FIGURE push write->applied latency over 10 writes: median {median:.1} ms, max {max:.1} ms"
    );
    assert!(max < 2000.0, "push latency {max} ms");
    wait_metric(
        &gw,
        r#"openshell_server_config_results_total{outcome="applied"}"#,
        10.0,
        Duration::from_secs(5),
    )
    .await;
    assert!(sent(&gw, "update") >= 10.0);

    // A burst of writes: marks merge, the newest build wins, and the
    // sandbox ends on the last value.
    let sent_before = sent(&gw, "update");
    for i in 0..20 {
        set(&mut client, "pushed", "burst", string(&format!("b-{i}"))).await;
    }
    let (config, _) = wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["burst"]["value"] == "b-19"
    })
    .await;
    assert_eq!(revision(&config), 30);
    let burst_sent = sent(&gw, "update") - sent_before;
    eprintln!("FIGURE push burst of 20 writes: {burst_sent} updates sent");
    assert!((1.0..=20.0).contains(&burst_sent), "{burst_sent}");

    // A policy goes through too, and processes in the sandbox read it.
    let policy = sandbox::SandboxPolicy {
        network_policies: [(
            "github".to_owned(),
            sandbox::NetworkPolicyRule {
                endpoints: vec![sandbox::NetworkEndpoint {
                    host: "api.github.com".into(),
                    port: 443,
                    protocol: "rest".into(),
                }],
                binaries: vec![sandbox::NetworkBinary {
                    path: "/usr/bin/curl".into(),
                }],
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    };
    let answer = client
        .update_config(UpdateConfigRequest {
            sandbox: "pushed".into(),
            policy: Some(policy.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.version, 1);
    assert_eq!(answer.policy_hash.len(), 64);
    // The same policy again changes nothing.
    let again = client
        .update_config(UpdateConfigRequest {
            sandbox: "pushed".into(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (again.version, &again.policy_hash),
        (1, &answer.policy_hash)
    );
    let (config, _) =
        wait_config(&path, Duration::from_secs(3), |c| c["policy_version"] == 1).await;
    assert_eq!(config["policy_hash"], answer.policy_hash.as_str());
    let out = sh(&mut client, "pushed", "cat .openshell/config.json").await;
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        seen["network_policies"]["github"]["endpoints"][0]["host"],
        "api.github.com"
    );

    // After the bootstrap the supervisor stopped polling: only its startup
    // poll reached GetSandboxConfig, even past a whole poll interval (10 s).
    // The window is what is tested, so it is waited out: no event marks a
    // poll that did not happen.
    let quiet = Duration::from_secs(11).saturating_sub(ready_at.elapsed());
    tokio::time::sleep(quiet).await;
    assert!(
        requests(&gw, "GetSandboxConfig", "ok") <= 1.0,
        "a push supervisor kept polling:\n{}",
        gw.metrics()
    );
    let log = supervisor_log(&gw.store_dir(), &id);
    assert!(log.contains("config_push=true"), "{log}");
}

#[tokio::test]
async fn rejected_updates_are_resent_and_identical_ones_are_not() {
    let gw = gateway(push_args(Some(700)));
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "picky").await;
    let path = config_path(&gw.store_dir(), &id(&sandbox));
    wait_bootstrap(&gw).await;
    set(&mut client, "picky", "log_level", string("info")).await;
    let (before, _) = wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["log_level"]["value"] == "info"
    })
    .await;

    // The reference supervisor refuses an unknown log level.
    set(&mut client, "picky", "log_level", string("loud")).await;
    wait_metric(
        &gw,
        r#"openshell_server_config_results_total{outcome="rejected"}"#,
        1.0,
        Duration::from_secs(3),
    )
    .await;
    // Reconcile sends it again (and it is refused again).
    wait_metric(
        &gw,
        r#"openshell_server_config_results_total{outcome="rejected"}"#,
        3.0,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        read_config(&path).unwrap(),
        before,
        "a rejected config was applied"
    );

    set(&mut client, "picky", "log_level", string("debug")).await;
    wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["log_level"]["value"] == "debug"
    })
    .await;
    // Applied now: reconcile keeps rebuilding but sends nothing. A rebuild
    // that found nothing to send marks the settled state; from there two
    // more reconcile rebuilds (each had its chance to send) send nothing.
    let unchanged_total = |gw: &Gateway| metric(gw, "openshell_server_config_unchanged_total");
    let reconciles = |gw: &Gateway| {
        metric(
            gw,
            r#"openshell_server_config_marks_total{source="reconcile"}"#,
        )
    };
    let settled = unchanged_total(&gw) + 1.0;
    wait_metric(
        &gw,
        "openshell_server_config_unchanged_total",
        settled,
        Duration::from_secs(10),
    )
    .await;
    let updates = sent(&gw, "update");
    let (unchanged, marks) = (unchanged_total(&gw), reconciles(&gw));
    let rebuilt = eventually(Duration::from_secs(10), || {
        unchanged_total(&gw) >= unchanged + 2.0 && reconciles(&gw) >= marks + 2.0
    })
    .await;
    assert!(
        rebuilt,
        "reconcile did not rebuild twice:\n{}",
        gw.metrics()
    );
    assert_eq!(sent(&gw, "update"), updates, "an identical update was sent");
    let log = gw.log();
    assert!(log.contains("supervisor rejected a config update"), "{log}");
    assert!(
        !log.contains("loud"),
        "a setting value reached the gateway log"
    );
}

#[tokio::test]
async fn provider_changes_rebuild_the_environment() {
    let gw = gateway(push_args(None));
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "creds").await;
    let id = id(&sandbox);
    let path = config_path(&gw.store_dir(), &id);
    wait_bootstrap(&gw).await;

    let provider = |value: &str| Provider {
        name: "github".into(),
        environment: [("API_TOKEN".to_owned(), value.to_owned())].into(),
        ..Default::default()
    };
    let created = client
        .create_provider(CreateProviderRequest {
            provider: Some(provider("tok-secret-one")),
        })
        .await
        .unwrap()
        .into_inner()
        .provider
        .unwrap();
    assert_eq!(created.environment_keys, ["API_TOKEN"]);
    assert!(
        created.environment.is_empty(),
        "provider values were returned"
    );
    let attached = client
        .attach_provider(AttachProviderRequest {
            sandbox: "creds".into(),
            provider: "github".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(attached.providers, ["github"]);
    wait_config(&path, Duration::from_secs(3), |c| {
        c["provider_environment_keys"][0] == "API_TOKEN"
    })
    .await;
    let out = sh(&mut client, "creds", "printf %s \"$API_TOKEN\"").await;
    assert_eq!(out.stdout_text(), "tok-secret-one");

    // A setting change reuses the environment: no environment build.
    let env_builds_before = env_builds(&gw, "mark");
    set(&mut client, "creds", "mode", string("fast")).await;
    wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["mode"]["value"] == "fast"
    })
    .await;
    assert_eq!(env_builds(&gw, "mark"), env_builds_before);

    // A provider change rebuilds it, and new processes see the new value.
    let (before, _) = wait_config(&path, Duration::from_secs(1), |_| true).await;
    let updated = client
        .update_provider(UpdateProviderRequest {
            provider: Some(provider("tok-secret-two")),
        })
        .await
        .unwrap()
        .into_inner()
        .provider
        .unwrap();
    assert!(updated.revision > created.revision);
    let (after, took) = wait_config(&path, Duration::from_secs(3), |c| {
        c["provider_env_revision"] != before["provider_env_revision"]
    })
    .await;
    eprintln!(
        "FIGURE push provider update->applied: {:.1} ms",
        took.as_secs_f64() * 1000.0
    );
    assert_eq!(
        revision(&after),
        revision(&before),
        "only the environment changed"
    );
    assert!(env_builds(&gw, "mark") > env_builds_before);
    let out = sh(&mut client, "creds", "printf %s \"$API_TOKEN\"").await;
    assert_eq!(out.stdout_text(), "tok-secret-two");

    // Detached: gone from later processes.
    client
        .detach_provider(DetachProviderRequest {
            sandbox: "creds".into(),
            provider: "github".into(),
        })
        .await
        .unwrap();
    wait_config(&path, Duration::from_secs(3), |c| {
        c["provider_environment_keys"]
            .as_array()
            .is_some_and(|k| k.is_empty())
    })
    .await;
    let out = sh(&mut client, "creds", "printf %s \"${API_TOKEN:-unset}\"").await;
    assert_eq!(out.stdout_text(), "unset");

    // Secrets never reach a log or the file.
    for text in [gw.log(), supervisor_log(&gw.store_dir(), &id)] {
        assert!(
            !text.contains("tok-secret"),
            "a provider value leaked:\n{text}"
        );
    }
    assert!(
        !std::fs::read_to_string(&path)
            .unwrap()
            .contains("tok-secret")
    );
}

#[tokio::test]
async fn global_writes_reach_every_push_session() {
    let gw = gateway(push_args(None));
    let mut client = client(&gw).await;
    let mut paths = Vec::new();
    for name in ["global-a", "global-b"] {
        let sandbox = create_ready(&mut client, name).await;
        paths.push(config_path(&gw.store_dir(), &id(&sandbox)));
    }
    wait_metric(
        &gw,
        "openshell_server_config_push_sessions",
        2.0,
        Duration::from_secs(10),
    )
    .await;
    set(&mut client, "global-a", "mode", string("sandbox")).await;
    let answer = client
        .update_config(UpdateConfigRequest {
            global: true,
            setting_key: "mode".into(),
            setting_value: Some(sandbox::SettingValue {
                value: Some(string("global")),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.settings_revision, 1);
    for path in &paths {
        let (config, _) = wait_config(path, Duration::from_secs(3), |c| {
            c["settings"]["mode"]["value"] == "global"
        })
        .await;
        // A global value overrides the sandbox's.
        assert_eq!(config["settings"]["mode"]["scope"], "global");
    }
    // Deleting it brings the sandbox value back where there is one.
    let deleted = client
        .update_config(UpdateConfigRequest {
            global: true,
            setting_key: "mode".into(),
            delete_setting: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(deleted.deleted);
    wait_config(&paths[0], Duration::from_secs(3), |c| {
        c["settings"]["mode"]["value"] == "sandbox"
    })
    .await;
    wait_config(&paths[1], Duration::from_secs(3), |c| {
        c["settings"].get("mode").is_none()
    })
    .await;
}

#[tokio::test]
async fn poll_mode_delivers_the_same_configuration() {
    let gw = gateway(Vec::new());
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "polled").await;
    let path = config_path(&gw.store_dir(), &id(&sandbox));
    assert_eq!(metric(&gw, "openshell_server_config_push_sessions"), 0.0);
    wait_config(&path, Duration::from_secs(5), |_| true).await;
    let mut latencies = Vec::new();
    for i in 0..2 {
        let want = format!("polled-{i}");
        set(&mut client, "polled", "greeting", string(&want)).await;
        let (config, took) = wait_config(&path, Duration::from_secs(15), |c| {
            c["settings"]["greeting"]["value"] == want.as_str()
        })
        .await;
        assert_eq!(revision(&config), i + 1);
        latencies.push(took);
    }
    let (median, max) = summary(&latencies);
    eprintln!(
        "FIGURE poll write->applied latency over 2 writes: median {median:.1} ms, max {max:.1} ms"
    );
    assert!(requests(&gw, "GetSandboxConfig", "ok") >= 2.0);
    assert_eq!(sent(&gw, "initial") + sent(&gw, "update"), 0.0);
}

#[tokio::test]
async fn rollback_to_poll_by_restart_and_back() {
    let mut gw = gateway(push_args(None));
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "rollback").await;
    let path = config_path(&gw.store_dir(), &id(&sandbox));
    wait_bootstrap(&gw).await;
    set(&mut client, "rollback", "stage", string("push")).await;
    let (pushed, _) = wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["stage"]["value"] == "push"
    })
    .await;

    // Poll mode and a restart: no migration, the supervisor goes back to
    // polling and keeps its configuration.
    gw.set_extra_args(poll_args());
    gw.restart();
    let mut client = common::client(&gw).await;
    wait_phase(&mut client, "rollback", SandboxPhase::Ready).await;
    assert_eq!(metric(&gw, "openshell_server_config_push_sessions"), 0.0);
    set(&mut client, "rollback", "stage", string("poll")).await;
    let (polled, _) = wait_config(&path, Duration::from_secs(15), |c| {
        c["settings"]["stage"]["value"] == "poll"
    })
    .await;
    assert_eq!(revision(&polled), revision(&pushed) + 1);
    assert!(requests(&gw, "GetSandboxConfig", "ok") >= 1.0);
    assert_eq!(sent(&gw, "initial"), 0.0);

    // And forward again.
    gw.set_extra_args(push_args(None));
    gw.restart();
    let mut client = common::client(&gw).await;
    wait_phase(&mut client, "rollback", SandboxPhase::Ready).await;
    wait_metric(
        &gw,
        "openshell_server_config_push_sessions",
        1.0,
        Duration::from_secs(10),
    )
    .await;
    set(&mut client, "rollback", "stage", string("push-again")).await;
    wait_config(&path, Duration::from_secs(3), |c| {
        c["settings"]["stage"]["value"] == "push-again"
    })
    .await;
}

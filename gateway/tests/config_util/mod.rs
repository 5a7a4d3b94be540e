//! Helpers for the push-config tests: gateway arguments, the applied
//! `.openshell/config.json` of a sandbox, config writes and metrics.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openshell_proto::sandbox::{SettingValue, setting_value};
use openshell_proto::*;
use openshell_testkit::{Gateway, metric_value};
use serde_json::Value;

use crate::common::Client;

/// `serve` arguments for push mode (with a reconcile interval, if given).
pub fn push_args(reconcile_ms: Option<u64>) -> Vec<String> {
    let mut args = vec!["--config-delivery-mode".to_owned(), "push".to_owned()];
    if let Some(ms) = reconcile_ms {
        args.push("--allow-test-flags".into());
        args.push("--config-reconcile-ms".into());
        args.push(ms.to_string());
    }
    args
}

pub fn poll_args() -> Vec<String> {
    vec!["--config-delivery-mode".into(), "poll".into()]
}

pub fn id(sandbox: &Sandbox) -> String {
    sandbox.metadata.as_ref().unwrap().id.clone()
}

/// Where the reference supervisor writes the applied configuration.
pub fn config_path(store_dir: &Path, sandbox_id: &str) -> PathBuf {
    store_dir
        .join("sandboxes")
        .join(sandbox_id)
        .join("work/.openshell/config.json")
}

pub fn read_config(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&text).ok()
}

/// Waits (polling every 2 ms, at most `limit`) until the applied
/// configuration satisfies `check`; returns it and how long that took.
pub async fn wait_config(
    path: &Path,
    limit: Duration,
    check: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        if let Some(value) = read_config(path)
            && check(&value)
        {
            return (value, started.elapsed());
        }
        assert!(
            started.elapsed() < limit,
            "applied config never matched within {limit:?}; last: {:?}",
            read_config(path)
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub fn revision(config: &Value) -> u64 {
    config["config_revision"].as_u64().unwrap_or(0)
}

pub fn string(value: &str) -> setting_value::Value {
    setting_value::Value::StringValue(value.to_owned())
}

pub fn setting(sandbox: &str, key: &str, value: setting_value::Value) -> UpdateConfigRequest {
    UpdateConfigRequest {
        sandbox: sandbox.to_owned(),
        setting_key: key.to_owned(),
        setting_value: Some(SettingValue { value: Some(value) }),
        ..Default::default()
    }
}

pub async fn set(
    client: &mut Client,
    sandbox: &str,
    key: &str,
    value: setting_value::Value,
) -> UpdateConfigResponse {
    client
        .update_config(setting(sandbox, key, value))
        .await
        .expect("update config")
        .into_inner()
}

pub fn metric(gw: &Gateway, sample: &str) -> f64 {
    metric_value(&gw.metrics(), sample).unwrap_or(0.0)
}

pub fn results(gw: &Gateway, outcome: &str) -> f64 {
    metric(
        gw,
        &format!(r#"openshell_server_config_results_total{{outcome="{outcome}"}}"#),
    )
}

pub fn sent(gw: &Gateway, kind: &str) -> f64 {
    metric(
        gw,
        &format!(r#"openshell_server_config_updates_sent_total{{kind="{kind}"}}"#),
    )
}

pub fn requests(gw: &Gateway, method: &str, code: &str) -> f64 {
    metric(
        gw,
        &format!(r#"openshell_server_requests_total{{method="{method}",code="{code}"}}"#),
    )
}

pub fn env_builds(gw: &Gateway, trigger: &str) -> f64 {
    metric(
        gw,
        &format!(
            r#"openshell_server_config_build_duration_seconds_count{{part="provider_environment",trigger="{trigger}",outcome="ok"}}"#
        ),
    )
}

/// Waits (bounded) until a metric sample reaches `at_least`.
pub async fn wait_metric(gw: &Gateway, sample: &str, at_least: f64, limit: Duration) {
    let ok = openshell_testkit::eventually(limit, || metric(gw, sample) >= at_least).await;
    assert!(
        ok,
        "{sample} never reached {at_least} (now {}):\n{}",
        metric(gw, sample),
        gw.metrics()
    );
}

/// The sandbox token the driver gave the sandbox's supervisor.
pub fn sandbox_token(store_dir: &Path, sandbox_id: &str) -> String {
    openshell_testkit::sandbox_token(store_dir, sandbox_id).expect("sandbox token")
}

pub fn supervisor_log(store_dir: &Path, sandbox_id: &str) -> String {
    std::fs::read_to_string(
        store_dir
            .join("sandboxes")
            .join(sandbox_id)
            .join("supervisor.log"),
    )
    .unwrap_or_default()
}

/// Median and maximum of a set of durations, in milliseconds.
pub fn summary(samples: &[Duration]) -> (f64, f64) {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (ms[ms.len() / 2], *ms.last().unwrap())
}

//! Rust runner of the conformance scenarios (`conformance/scenarios.json`).
//!
//! Performs every scenario's steps with `openshell_sdk::Client` against the
//! cluster at `$OPENSHELL_ENDPOINT` and reports what it observed, one JSON
//! line per step (format: `conformance/README.md`, "Observations"). It never
//! reads a step's `expect`: the harness judges every runner in one place.
//!
//! Usage: `openshell-conformance-rust [SCENARIOS_JSON] [--only ID ...]`.
//!
//! Modules: `runner` (the client, sandbox names, inputs, step dispatch),
//! `report` (observation lines), `ops::*` (one module per area of the SDK).

mod ops;
mod report;
mod runner;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::report::emit;
use crate::runner::Runner;

/// A step that takes longer is reported as a failure and the next one runs.
const STEP_LIMIT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut only = HashSet::new();
    if let Some(i) = args.iter().position(|a| a == "--only") {
        only = args.drain(i..).skip(1).collect();
    }
    let path = args
        .first()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios.json"));
    let scenarios: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let mut runner = Runner::from_env().await?;
    emit(json!({
        "type": "hello",
        "runner": "rust",
        "run": runner.run_id,
        "sandbox_prefix": runner.prefix,
        "capabilities": runner.caps,
    }));
    for scenario in scenarios["scenarios"].as_array().into_iter().flatten() {
        let id = scenario["id"].as_str().unwrap_or_default();
        if only.is_empty() || only.contains(id) {
            run_scenario(&mut runner, id, scenario).await;
        }
    }
    runner.cleanup().await;
    Ok(())
}

async fn run_scenario(runner: &mut Runner, id: &str, scenario: &Value) {
    let missing: Vec<&str> = strs(&scenario["requires"])
        .filter(|c| !runner.caps.contains(c))
        .collect();
    if !missing.is_empty() {
        emit(json!({"type": "skip", "scenario": id, "missing": missing}));
        return;
    }
    for alias in strs(&scenario["uses"]) {
        if let Err(e) = runner.ensure(alias).await {
            let failure = format!("{e:#}");
            emit(json!({"type": "setup", "scenario": id, "alias": alias, "failure": failure}));
            return;
        }
    }
    for (index, step) in scenario["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let op = step["op"].as_str().unwrap_or_default();
        let started = Instant::now();
        let outcome = tokio::time::timeout(STEP_LIMIT, runner.perform(op, step)).await;
        let mut line = json!({
            "type": "step",
            "scenario": id,
            "step": index,
            "op": op,
            "ms": started.elapsed().as_millis() as u64,
        });
        let (key, value) = report::outcome(outcome);
        line[key] = value;
        emit(line);
    }
}

fn strs(value: &Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

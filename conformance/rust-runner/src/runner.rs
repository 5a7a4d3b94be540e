//! The runner's state: one client, the sandbox names of this run, the step
//! inputs (with `${alias}` and `${run}` replaced) and the dispatch of ops.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::anyhow;
use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, Error};
use prost_reflect::DescriptorPool;
use serde_json::Value;

use crate::report::StepResult;

pub struct Runner {
    pub client: Client,
    pub endpoint: String,
    /// The cluster's data directory (`OPENSHELL_CONFORMANCE_DATA_DIR`):
    /// where sandbox supervisors' PIDs, and so their tokens, are found.
    pub data_dir: Option<PathBuf>,
    /// The harness's control port (`OPENSHELL_CONFORMANCE_CONTROL`), which
    /// changes the routes of the edge in front of the cluster.
    pub control: Option<String>,
    pub run_id: String,
    /// Every sandbox alias is named `<prefix><alias>` (README: "Naming").
    pub prefix: String,
    pub caps: Vec<&'static str>,
    pub pool: DescriptorPool,
    /// Aliases created and READY.
    ready: HashSet<String>,
    /// Every name an alias was given, deleted at the end.
    named: BTreeSet<String>,
}

impl Runner {
    pub async fn from_env() -> anyhow::Result<Self> {
        let endpoint =
            std::env::var("OPENSHELL_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:17670".into());
        let run_id: String = std::env::var("OPENSHELL_CONFORMANCE_RUN")
            .unwrap_or_else(|_| format!("{:08x}", std::process::id()))
            .to_lowercase()
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(12)
            .collect();
        let data_dir = std::env::var_os("OPENSHELL_CONFORMANCE_DATA_DIR").map(PathBuf::from);
        let control = std::env::var("OPENSHELL_CONFORMANCE_CONTROL").ok();
        // The core has the owner-routing counters; a config session needs a
        // sandbox token, read from the supervisor in the data directory;
        // making a replica unreachable is the harness's job.
        let mut caps = vec!["routing_stats"];
        if data_dir.is_some() {
            caps.push("push_config");
        }
        if control.is_some() {
            caps.push("replica_control");
        }
        let config = ClientConfig::builder(endpoint.clone()).build()?;
        Ok(Runner {
            client: Client::connect_lazy(config).await?,
            endpoint,
            data_dir,
            control,
            prefix: format!("cf-rs-{run_id}-"),
            run_id,
            caps,
            pool: DescriptorPool::decode(openshell_sdk::proto::FILE_DESCRIPTOR_SET)?,
            ready: HashSet::new(),
            named: BTreeSet::new(),
        })
    }

    pub fn name(&mut self, alias: &str) -> String {
        let name = format!("{}{alias}", self.prefix);
        self.named.insert(name.clone());
        name
    }

    /// Replaces `${run}` with the run id and `${alias}` with a sandbox name.
    pub fn subst(&mut self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.subst_str(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| self.subst(v)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (self.subst_str(k), self.subst(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    pub fn subst_str(&mut self, s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("${") {
            let Some(len) = rest[start..].find('}') else {
                break;
            };
            let key = &rest[start + 2..start + len];
            out.push_str(&rest[..start]);
            if key == "run" {
                out.push_str(&self.run_id.clone());
            } else {
                out.push_str(&self.name(key));
            }
            rest = &rest[start + len + 1..];
        }
        out.push_str(rest);
        out
    }

    /// The sandbox a step names: a literal `name` or a `sandbox` alias.
    pub fn target(&mut self, step: &Value) -> String {
        if let Some(name) = step["name"].as_str() {
            return self.subst_str(name);
        }
        let alias = step["sandbox"].as_str().unwrap_or("main").to_owned();
        self.name(&alias)
    }

    /// Creates an alias's sandbox (once) and waits until it is READY.
    pub async fn ensure(&mut self, alias: &str) -> Result<(), Error> {
        if self.ready.contains(alias) {
            return Ok(());
        }
        let name = self.name(alias);
        let sandboxes = self.client.sandboxes();
        match sandboxes
            .create(CreateSandbox::new().name(&name), opts())
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == "already_exists" => {}
            Err(e) => return Err(e),
        }
        sandboxes
            .wait_ready(&name, opts().deadline(Duration::from_secs(60)))
            .await?;
        self.ready.insert(alias.to_owned());
        Ok(())
    }

    /// A `create_sandbox` step made the alias's sandbox anew.
    pub fn forget_ready(&mut self, alias: &str) {
        self.ready.remove(alias);
    }

    pub async fn cleanup(&mut self) {
        let sandboxes = self.client.sandboxes();
        for name in &self.named {
            if sandboxes.delete(name, opts()).await.is_ok() {
                let deadline = opts().deadline(Duration::from_secs(60));
                let _ = sandboxes.wait_deleted(name, deadline).await;
            }
        }
    }

    /// Performs one step and returns what it observed.
    pub async fn perform(&mut self, op: &str, step: &Value) -> StepResult {
        match op {
            "create_sandbox" => self.create_sandbox(step).await,
            "wait_ready" | "get_sandbox" => self.sandbox_phase(op, step).await,
            "list_sandboxes" => self.list_sandboxes(step).await,
            "delete_sandbox" | "wait_deleted" => self.delete_sandbox(op, step).await,
            "client_health" => self.client_health(step).await,
            "exec" => self.exec(step).await,
            "exec_stream" => self.exec_stream(step).await,
            "exec_repeat" => self.exec_repeat(step).await,
            "interactive" => self.interactive(step).await,
            "routing_stats_delta" => self.routing_stats_delta(step).await,
            "unroute_owner_then_exec" => self.unroute_owner_then_exec(step).await,
            "forward" => self.forward(step).await,
            "raw_unary" => self.raw_unary(step).await,
            "raw_stream" => self.raw_stream(step).await,
            "config_session" => self.config_session(step).await,
            "write_file" => self.write_file(step).await,
            "read_file" => self.read_file(step).await,
            "file_round_trip" => self.file_round_trip(step).await,
            "logs" => self.logs(step).await,
            "watch_logs" => self.watch_logs(step).await,
            "watch_events" => self.watch_events(step).await,
            other => Err(anyhow!("this runner does not know op {other:?}").into()),
        }
    }
}

pub fn opts() -> CallOptions {
    CallOptions::new()
}

/// A step input in seconds.
pub fn secs(step: &Value, key: &str) -> Option<Duration> {
    step[key].as_f64().map(Duration::from_secs_f64)
}

pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

pub fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
        .collect()
}

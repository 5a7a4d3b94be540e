//! Sandbox lifecycle ops and `client_health`.

use std::time::Duration;

use openshell_sdk::{Client, ClientConfig, CreateSandbox, ListSandboxes, SandboxPhase};
use serde_json::{Value, json};

use crate::report::StepResult;
use crate::runner::{Runner, opts, secs, string_map};

impl Runner {
    pub async fn create_sandbox(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let mut request = CreateSandbox::new().name(&name);
        for (k, v) in string_map(&step["env"]) {
            request = request.env(k, v);
        }
        for (k, v) in string_map(&step["labels"]) {
            request = request.label(k, v);
        }
        let sandbox = self.client.sandboxes().create(request, opts()).await?;
        if let Some(alias) = step["sandbox"].as_str() {
            self.forget_ready(alias);
        }
        Ok(json!({
            "name": sandbox.name,
            "phase": phase_name(sandbox.phase),
            "labels": sandbox.labels,
        }))
    }

    /// `wait_ready` or `get_sandbox`.
    pub async fn sandbox_phase(&mut self, op: &str, step: &Value) -> StepResult {
        let name = self.target(step);
        let sandboxes = self.client.sandboxes();
        let sandbox = if op == "wait_ready" {
            let mut o = opts();
            o.deadline = secs(step, "timeout");
            sandboxes.wait_ready(&name, o).await?
        } else {
            sandboxes.get(&name, opts()).await?
        };
        Ok(json!({"name": sandbox.name, "phase": phase_name(sandbox.phase)}))
    }

    pub async fn list_sandboxes(&mut self, step: &Value) -> StepResult {
        let filter = ListSandboxes {
            label_selector: step["label_selector"].as_str().map(str::to_owned),
            page_size: None,
        };
        let found = self.client.sandboxes().list(filter, opts()).await?;
        let names: Vec<String> = found.into_iter().map(|s| s.name).collect();
        Ok(json!({"names": names}))
    }

    /// `delete_sandbox` or `wait_deleted`.
    pub async fn delete_sandbox(&mut self, op: &str, step: &Value) -> StepResult {
        let name = self.target(step);
        let sandboxes = self.client.sandboxes();
        if op == "delete_sandbox" {
            sandboxes.delete(&name, opts()).await?;
        } else {
            let mut o = opts();
            o.deadline = secs(step, "timeout");
            sandboxes.wait_deleted(&name, o).await?;
        }
        Ok(json!({}))
    }

    /// A health call on a fresh client for the step's `endpoint`.
    pub async fn client_health(&mut self, step: &Value) -> StepResult {
        let endpoint = step["endpoint"].as_str().unwrap_or_default();
        let config = ClientConfig::builder(endpoint)
            .connect_timeout(Duration::from_secs(2))
            .build()?;
        Client::connect_lazy(config).await?.health(opts()).await?;
        Ok(json!({}))
    }
}

fn phase_name(phase: SandboxPhase) -> String {
    phase
        .as_str_name()
        .trim_start_matches("SANDBOX_PHASE_")
        .to_owned()
}

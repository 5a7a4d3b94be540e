//! Rust runner of the conformance scenarios (`conformance/scenarios.json`).
//!
//! Runs every scenario with `openshell_sdk::Client` against the cluster at
//! `$OPENSHELL_ENDPOINT` and prints one JSON line per scenario on stdout:
//! `{"id": ..., "status": "pass" | "fail" | "skip", "detail": ..., "ms": ...}`.
//!
//! Usage: `openshell-conformance-rust [SCENARIOS_JSON] [--only ID ...]`. The
//! harness (`conformance/harness`) starts the cluster and runs every runner.
//! Raw steps build their request messages from the scenario's proto JSON
//! with prost-reflect over the contract's descriptor set.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use futures::StreamExt;
use openshell_sdk::proto::StreamingKind;
use openshell_sdk::proto::sandbox::{SettingValue, setting_value};
use openshell_sdk::{
    ApplyOutcome, CallOptions, CancellationToken, Client, ClientConfig, ConfigSession,
    ConfigSnapshot, CreateSandbox, DeliveryMode, Error, ExecEvent, ExecRequest, ListSandboxes,
    Metadata,
};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LANGUAGE: &str = "rs";

/// What a step produced, checked against its `expect`.
#[derive(Default, Debug)]
struct Outcome {
    phase: Option<String>,
    labels: BTreeMap<String, String>,
    names: Vec<String>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    output: Vec<u8>,
    exit_code: Option<i32>,
    exit_last: Option<bool>,
    events: usize,
    echoed: Option<bool>,
    accepted: u64,
    closed_refuses: Option<bool>,
    metadata: Vec<(String, String)>,
    response: Option<DynamicMessage>,
    hinted_delta: u64,
    unrouted_retry_delta: u64,
    config: Option<ConfigOutcome>,
}

/// What a `config_session` step saw.
#[derive(Default, Debug)]
struct ConfigOutcome {
    mode: String,
    bootstrap: bool,
    acknowledged: bool,
    rejected: u64,
    updates_received: u64,
    polls: u64,
    /// String settings of the last applied snapshot.
    applied: BTreeMap<String, String>,
    max_latency: Duration,
}

struct Runner {
    client: Client,
    endpoint: String,
    /// The cluster's data directory (`OPENSHELL_CONFORMANCE_DATA_DIR`):
    /// where sandbox supervisors' PIDs, and so their tokens, are found.
    data_dir: Option<PathBuf>,
    run_id: String,
    names: HashMap<String, String>,
    ready: HashSet<String>,
    pool: DescriptorPool,
    caps: HashSet<&'static str>,
}

fn capabilities(data_dir: Option<&Path>) -> HashSet<&'static str> {
    // The core has the owner-routing counters.
    let mut caps = HashSet::from(["routing_stats"]);
    // The core has ConfigSession; a session needs a sandbox token, read
    // from the sandbox's supervisor in the cluster's data directory.
    if data_dir.is_some() {
        caps.insert("push_config");
    }
    caps
}

fn opts() -> CallOptions {
    CallOptions::new()
}

fn secs(step: &Value, key: &str) -> Option<Duration> {
    step.get(key)
        .and_then(Value::as_f64)
        .map(Duration::from_secs_f64)
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

impl Runner {
    fn name(&mut self, alias: &str) -> String {
        let run_id = self.run_id.clone();
        self.names
            .entry(alias.to_owned())
            .or_insert_with(|| {
                let mut n = format!("cf-{LANGUAGE}-{run_id}-{alias}");
                n.truncate(63);
                n.trim_end_matches('-').to_owned()
            })
            .clone()
    }

    fn subst(&mut self, value: &Value) -> Value {
        match value {
            Value::String(s) => {
                let mut s = s.replace("${run}", &self.run_id);
                for alias in ["main", "life"] {
                    let pattern = format!("${{{alias}}}");
                    if s.contains(&pattern) {
                        s = s.replace(&pattern, &self.name(alias));
                    }
                }
                Value::String(s)
            }
            Value::Array(a) => Value::Array(a.iter().map(|v| self.subst(v)).collect()),
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, v)| (k.clone(), self.subst(v))).collect())
            }
            other => other.clone(),
        }
    }

    fn target(&mut self, step: &Value) -> String {
        if let Some(name) = step.get("name") {
            return self.subst(name).as_str().unwrap_or_default().to_owned();
        }
        let alias = step["sandbox"].as_str().unwrap_or("main").to_owned();
        self.name(&alias)
    }

    async fn ensure(&mut self, alias: &str) -> Result<(), Error> {
        if self.ready.contains(alias) {
            return Ok(());
        }
        let name = self.name(alias);
        match self
            .client
            .sandboxes()
            .create(CreateSandbox::new().name(&name), opts())
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == "already_exists" => {}
            Err(e) => return Err(e),
        }
        self.client
            .sandboxes()
            .wait_ready(&name, opts().deadline(Duration::from_secs(60)))
            .await?;
        self.ready.insert(alias.to_owned());
        Ok(())
    }

    async fn cleanup(&mut self) {
        for name in self.names.values() {
            if self.client.sandboxes().delete(name, opts()).await.is_ok() {
                let _ = self
                    .client
                    .sandboxes()
                    .wait_deleted(name, opts().deadline(Duration::from_secs(60)))
                    .await;
            }
        }
    }

    async fn run(&mut self, scenario: &Value) -> (&'static str, String) {
        let missing: Vec<String> = strings(scenario.get("requires"))
            .into_iter()
            .filter(|c| !self.caps.contains(c.as_str()))
            .collect();
        if !missing.is_empty() {
            return (
                "skip",
                format!("runner lacks capability: {}", missing.join(", ")),
            );
        }
        for alias in strings(scenario.get("uses")) {
            if let Err(e) = self.ensure(&alias).await {
                return ("fail", format!("setting up sandbox {alias}: {e}"));
            }
        }
        let steps = scenario["steps"].as_array().cloned().unwrap_or_default();
        for (index, step) in steps.iter().enumerate() {
            let op = step["op"].as_str().unwrap_or("?");
            let result = tokio::time::timeout(Duration::from_secs(120), self.step(step)).await;
            let failure = match result {
                Err(_) => Some("timed out after 120 s".to_owned()),
                Ok(Err(e)) => Some(format!("{e:#}")),
                Ok(Ok(())) => None,
            };
            if let Some(failure) = failure {
                let mut detail = format!("step {index} ({op}): {failure}");
                detail.truncate(400);
                return ("fail", detail);
            }
        }
        ("pass", String::new())
    }

    async fn step(&mut self, step: &Value) -> anyhow::Result<()> {
        let expect = step.get("expect").cloned().unwrap_or(json!({}));
        let want_error = expect.get("error");
        match self.execute(step).await {
            Err(StepError::Sdk(err)) => {
                let Some(want) = want_error else {
                    bail!("unexpected error {}: {}", err.code(), err.message());
                };
                let codes = match want {
                    Value::String(s) => vec![s.clone()],
                    other => strings(Some(other)),
                };
                if !codes.iter().any(|c| c == err.code()) {
                    bail!("error code {:?}, expected {codes:?}: {err}", err.code());
                }
                if let Some(secret) = expect.get("message_excludes").and_then(Value::as_str)
                    && err.to_string().contains(secret)
                {
                    bail!("the error message echoes a secret value");
                }
                if let Some(r) = expect.get("retryable").and_then(Value::as_bool)
                    && err.retryable() != r
                {
                    bail!("retryable is {}", err.retryable());
                }
                Ok(())
            }
            Err(StepError::Other(e)) => Err(e),
            Ok(outcome) => {
                if let Some(want) = want_error {
                    bail!("expected error {want}, got success");
                }
                self.check(&expect, &outcome)
            }
        }
    }

    async fn execute(&mut self, step: &Value) -> Result<Outcome, StepError> {
        let op = step["op"].as_str().unwrap_or_default().to_owned();
        let sandboxes = self.client.sandboxes();
        let mut out = Outcome::default();
        match op.as_str() {
            "create_sandbox" => {
                let name = self.target(step);
                let mut request = CreateSandbox::new().name(&name);
                for (k, v) in string_map(step.get("env")) {
                    request = request.env(k, v);
                }
                for (k, v) in string_map(step.get("labels")) {
                    request = request.label(k, v);
                }
                let s = sandboxes.create(request, opts()).await?;
                if let Some(alias) = step.get("sandbox").and_then(Value::as_str) {
                    self.ready.remove(alias);
                }
                out.phase = Some(phase_name(s.phase));
                out.labels = s.labels;
            }
            "wait_ready" => {
                let name = self.target(step);
                let mut o = opts();
                o.deadline = secs(step, "timeout");
                out.phase = Some(phase_name(sandboxes.wait_ready(&name, o).await?.phase));
            }
            "get_sandbox" => {
                let name = self.target(step);
                out.phase = Some(phase_name(sandboxes.get(&name, opts()).await?.phase));
            }
            "list_sandboxes" => {
                let filter = ListSandboxes {
                    label_selector: step["label_selector"].as_str().map(str::to_owned),
                    page_size: None,
                };
                out.names = sandboxes
                    .list(filter, opts())
                    .await?
                    .into_iter()
                    .map(|s| s.name)
                    .collect();
            }
            "delete_sandbox" => {
                let name = self.target(step);
                sandboxes.delete(&name, opts()).await?;
            }
            "wait_deleted" => {
                let name = self.target(step);
                let mut o = opts();
                o.deadline = secs(step, "timeout");
                sandboxes.wait_deleted(&name, o).await?;
            }
            "exec" => {
                let request = self.exec_request(step);
                let r = self.client.exec(request, opts()).await?;
                out.stdout = r.stdout;
                out.stderr = r.stderr;
                out.exit_code = Some(r.exit_code);
            }
            "exec_stream" => {
                let request = self.exec_request(step);
                let mut stream = self.client.exec_stream(request, opts()).await?;
                let mut exits = 0;
                let mut last_is_exit = false;
                while let Some(event) = stream.next().await {
                    out.events += 1;
                    last_is_exit = false;
                    match event? {
                        ExecEvent::Stdout(d) => out.stdout.extend_from_slice(&d),
                        ExecEvent::Stderr(d) => out.stderr.extend_from_slice(&d),
                        ExecEvent::Exit(code) => {
                            exits += 1;
                            last_is_exit = true;
                            out.exit_code = Some(code);
                        }
                    }
                }
                out.exit_last = Some(last_is_exit && exits == 1);
            }
            "interactive" => self.interactive(step, &mut out).await?,
            "forward" => self.forward(step, &mut out).await?,
            "exec_repeat" => {
                let count = step["count"].as_u64().unwrap_or(1);
                for i in 0..count {
                    let request = self.exec_request(step);
                    let r = self.client.exec(request, opts()).await?;
                    if i > 0 && (r.stdout != out.stdout || r.exit_code != 0) {
                        return Err(anyhow!("exec {i} differs: {r:?}").into());
                    }
                    out.stdout = r.stdout;
                    out.exit_code = Some(r.exit_code);
                }
            }
            "raw_unary" => {
                let method = step["method"].as_str().unwrap_or_default();
                let request = self.message(method, &step["request"], true)?;
                let mut metadata = Metadata::new();
                for pair in step["metadata"].as_array().into_iter().flatten() {
                    metadata.append(
                        pair[0].as_str().unwrap_or_default(),
                        pair[1].as_str().unwrap_or_default(),
                    );
                }
                let path = format!("/{}/{method}", openshell_sdk::proto::SERVICE);
                let answer = self
                    .client
                    .raw_unary(&path, request, metadata, opts())
                    .await?;
                out.metadata = answer
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                let descriptor = self.method(method)?.output();
                out.response = Some(
                    DynamicMessage::decode(descriptor, answer.bytes)
                        .map_err(|e| anyhow!("decoding the answer: {e}"))?,
                );
            }
            "raw_stream" => {
                let method = step["method"].as_str().unwrap_or_default();
                let path = format!("/{}/{method}", openshell_sdk::proto::SERVICE);
                let messages = step["messages"].as_array().cloned().unwrap_or_default();
                let mut stream = self
                    .client
                    .raw_stream(&path, Metadata::new(), opts())
                    .await?;
                for message in &messages {
                    stream.send(self.message(method, message, true)?).await?;
                }
                stream.close_send();
                while stream.recv().await?.is_some() {
                    out.events += 1;
                }
            }
            "routing_stats_delta" => self.routing_stats_delta(step, &mut out).await?,
            "config_session" => self.config_session(step, &mut out).await?,
            "client_health" => {
                let endpoint = step["endpoint"].as_str().unwrap_or_default();
                let config = ClientConfig::builder(endpoint)
                    .connect_timeout(Duration::from_secs(2))
                    .build()?;
                let other = Client::connect_lazy(config).await?;
                other.health(opts()).await?;
            }
            other => return Err(anyhow!("this runner does not know op {other:?}").into()),
        }
        Ok(out)
    }

    async fn routing_stats_delta(
        &mut self,
        step: &Value,
        out: &mut Outcome,
    ) -> Result<(), StepError> {
        let before = self.client.routing_stats();
        for _ in 0..step["count"].as_u64().unwrap_or(1) {
            let request = self.exec_request(step);
            self.client.exec(request, opts()).await?;
        }
        let after = self.client.routing_stats();
        out.hinted_delta = after.hinted - before.hinted;
        out.unrouted_retry_delta = after.unrouted_retries - before.unrouted_retries;
        Ok(())
    }

    /// `config_session`: takes over a sandbox's session with a
    /// `ConfigSession` on the sandbox's own token (its real supervisor
    /// stopped first), writes the step's settings and watches them arrive.
    async fn config_session(&mut self, step: &Value, out: &mut Outcome) -> Result<(), StepError> {
        let data_dir = self
            .data_dir
            .clone()
            .ok_or_else(|| anyhow!("no OPENSHELL_CONFORMANCE_DATA_DIR"))?;
        let name = self.target(step);
        let sandbox = self.client.sandboxes().get(&name, opts()).await?;
        let token = take_over(&data_dir, &sandbox.id).await?;

        let reject = step.get("reject").map(|r| {
            (
                r["setting"].as_str().unwrap_or_default().to_owned(),
                r["value"].as_str().unwrap_or_default().to_owned(),
            )
        });
        let last: Arc<Mutex<Option<ConfigSnapshot>>> = Arc::default();
        let apply = {
            let last = last.clone();
            let reject = reject.clone();
            Arc::new(move |snapshot: ConfigSnapshot| {
                if let Some((key, value)) = &reject
                    && string_setting(&snapshot, key).as_deref() == Some(value.as_str())
                {
                    return ApplyOutcome::Rejected(format!("{key} must not be {value}"));
                }
                *last.lock().unwrap() = Some(snapshot);
                ApplyOutcome::Applied
            })
        };
        let config = ClientConfig::builder(self.endpoint.clone())
            .token(token.as_str())
            .build()?;
        let session = ConfigSession::builder(config, sandbox.id.clone())
            .apply(apply)
            .config_push(step["announce_push"].as_bool().unwrap_or(true))
            .poll_interval(secs(step, "poll_interval").unwrap_or(Duration::from_secs(10)))
            .build()?;
        let cancel = CancellationToken::new();
        let running = {
            let (session, cancel) = (session.clone(), cancel.clone());
            tokio::spawn(async move { session.run(cancel).await })
        };
        let _stop = cancel.clone().drop_guard();

        let accepted = wait_for(Duration::from_secs(30), || {
            let stats = session.stats();
            stats.sessions_accepted >= 1 && stats.mode.is_some()
        })
        .await;
        if !accepted {
            return Err(anyhow!("no session accepted in 30 s: {:?}", session.stats()).into());
        }
        if session.stats().mode == Some(DeliveryMode::Push)
            && !wait_for(Duration::from_secs(10), || {
                session.stats().last_update_id >= 1
            })
            .await
        {
            return Err(anyhow!("the bootstrap was never answered").into());
        }

        let mut config = ConfigOutcome::default();
        let mut globals = Vec::new();
        for write in step["writes"].as_array().cloned().unwrap_or_default() {
            let write = self.subst(&write);
            let key = write["setting"].as_str().unwrap_or_default().to_owned();
            let value = write["value"].as_str().unwrap_or_default().to_owned();
            let global = write["global"].as_bool().unwrap_or(false);
            let refused = reject.as_ref() == Some(&(key.clone(), value.clone()));
            let rejected_before = session.stats().rejected;
            let started = Instant::now();
            self.update_setting(&name, global, &key, Some(&value))
                .await?;
            if global {
                globals.push(key.clone());
            }
            let arrived = wait_for(Duration::from_secs(15), || {
                if refused {
                    session.stats().rejected > rejected_before
                } else {
                    last.lock()
                        .unwrap()
                        .as_ref()
                        .is_some_and(|s| string_setting(s, &key).as_deref() == Some(value.as_str()))
                }
            })
            .await;
            if !arrived {
                return Err(anyhow!("{key}={value} never reached the session").into());
            }
            config.max_latency = config.max_latency.max(started.elapsed());
        }
        // Global settings would reach every later session: removed again.
        for key in globals {
            self.update_setting(&name, true, &key, None).await?;
        }
        let stats = session.stats();
        config.mode = match stats.mode {
            Some(DeliveryMode::Push) => "push".into(),
            Some(DeliveryMode::Poll) => "poll".into(),
            None => String::new(),
        };
        config.bootstrap = stats.mode == Some(DeliveryMode::Push)
            && stats.updates_received >= 1
            && stats.last_update_id >= 1;
        // Every pushed update answered, in order, on one session: ids run
        // 1.. from the bootstrap, and one more than the writes arrived.
        let writes = step["writes"].as_array().map_or(0, Vec::len) as u64;
        config.acknowledged = stats.sessions_accepted == 1
            && stats.updates_received > writes
            && stats.last_update_id == stats.updates_received;
        config.rejected = stats.rejected;
        config.updates_received = stats.updates_received;
        config.polls = stats.polls;
        if let Some(snapshot) = last.lock().unwrap().as_ref() {
            for key in snapshot.sandbox_config.settings.keys() {
                if let Some(value) = string_setting(snapshot, key) {
                    config.applied.insert(key.clone(), value);
                }
            }
        }
        cancel.cancel();
        let _ = running.await;
        out.config = Some(config);
        Ok(())
    }

    /// `UpdateConfig` of one string setting (deleted when `value` is None).
    async fn update_setting(
        &self,
        sandbox: &str,
        global: bool,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), Error> {
        let request = openshell_sdk::proto::UpdateConfigRequest {
            sandbox: if global {
                String::new()
            } else {
                sandbox.to_owned()
            },
            global,
            setting_key: key.to_owned(),
            setting_value: value.map(|v| SettingValue {
                value: Some(setting_value::Value::StringValue(v.to_owned())),
            }),
            delete_setting: value.is_none(),
            ..Default::default()
        };
        let path = format!("/{}/UpdateConfig", openshell_sdk::proto::SERVICE);
        self.client
            .raw_unary(
                &path,
                Bytes::from(request.encode_to_vec()),
                Metadata::new(),
                opts(),
            )
            .await?;
        Ok(())
    }

    fn check_config(&mut self, key: &str, want: &Value, got: &ConfigOutcome) -> anyhow::Result<()> {
        match key {
            "mode" => {
                if Some(got.mode.as_str()) != want.as_str() {
                    bail!("delivery mode {:?}, expected {want}", got.mode);
                }
            }
            "bootstrap" => {
                if Some(got.bootstrap) != want.as_bool() {
                    bail!("bootstrap received and answered: {}", got.bootstrap);
                }
            }
            "updates_acknowledged" => {
                if Some(got.acknowledged) != want.as_bool() {
                    bail!("every pushed update answered: {}", got.acknowledged);
                }
            }
            "rejected" => {
                if Some(got.rejected) != want.as_u64() {
                    bail!("{} updates rejected, expected {want}", got.rejected);
                }
            }
            "updates_received" => {
                if Some(got.updates_received) != want.as_u64() {
                    bail!("{} pushed updates, expected {want}", got.updates_received);
                }
            }
            "min_polls" => {
                if got.polls < want.as_u64().unwrap_or(0) {
                    bail!("{} polls", got.polls);
                }
            }
            "max_latency" => {
                if got.max_latency.as_secs_f64() > want.as_f64().unwrap_or(0.0) {
                    bail!("a write took {:?} to arrive", got.max_latency);
                }
            }
            "applied_settings" => {
                let want = self.subst(want);
                for (k, v) in want.as_object().into_iter().flatten() {
                    let k = self.subst(&Value::String(k.clone()));
                    let k = k.as_str().unwrap_or_default();
                    if got.applied.get(k).map(String::as_str) != v.as_str() {
                        bail!("applied settings {:?}, expected {k}={v}", got.applied);
                    }
                }
            }
            _ => unreachable!("checked by the caller"),
        }
        Ok(())
    }

    fn exec_request(&mut self, step: &Value) -> ExecRequest {
        let mut request = ExecRequest::new(self.target(step), strings(step.get("command")));
        request.environment = string_map(step.get("env"));
        if let Some(stdin) = step["stdin"].as_str() {
            request.stdin = Bytes::from(stdin.to_owned());
        }
        if let Some(size) = step["stdin_size"].as_u64() {
            request.stdin = Bytes::from(vec![0u8; size as usize]);
        }
        request.timeout = secs(step, "exec_timeout");
        if step["tty"].as_bool() == Some(true) {
            request = request.tty(
                step["cols"].as_u64().unwrap_or(80) as u32,
                step["rows"].as_u64().unwrap_or(24) as u32,
            );
        }
        request
    }

    fn method(&self, name: &str) -> anyhow::Result<prost_reflect::MethodDescriptor> {
        self.pool
            .get_service_by_name(openshell_sdk::proto::SERVICE)
            .and_then(|s| s.methods().find(|m| m.name() == name))
            .ok_or_else(|| anyhow!("no method {name}"))
    }

    /// Encodes a request message of `method` from proto JSON.
    fn message(&mut self, method: &str, body: &Value, input: bool) -> anyhow::Result<Bytes> {
        let m = self.method(method)?;
        let descriptor = if input { m.input() } else { m.output() };
        let body = self.subst(body);
        let message = DynamicMessage::deserialize(descriptor, body)
            .with_context(|| format!("building a {method} request from JSON"))?;
        Ok(Bytes::from(message.encode_to_vec()))
    }

    async fn interactive(&mut self, step: &Value, out: &mut Outcome) -> Result<(), StepError> {
        let request = self.exec_request(step);
        let mut session = self.client.exec_interactive(request, opts()).await?;
        let record = |event: ExecEvent, out: &mut Outcome| match event {
            ExecEvent::Stdout(d) => {
                out.output.extend_from_slice(&d);
                out.stdout.extend_from_slice(&d);
                false
            }
            ExecEvent::Stderr(d) => {
                out.output.extend_from_slice(&d);
                false
            }
            ExecEvent::Exit(code) => {
                out.exit_code = Some(code);
                true
            }
        };
        for action in step["actions"].as_array().cloned().unwrap_or_default() {
            if let Some(wanted) = action["wait_output"].as_str() {
                while !contains(&out.output, wanted.as_bytes()) {
                    match session.next_event().await {
                        Some(event) => {
                            if record(event?, out) {
                                return Err(anyhow!("ended before {wanted:?}").into());
                            }
                        }
                        None => return Err(anyhow!("ended before {wanted:?}").into()),
                    }
                }
            } else if let Some(size) = action["resize"].as_array() {
                let cols = size[0].as_u64().unwrap_or(80) as u32;
                let rows = size[1].as_u64().unwrap_or(24) as u32;
                session.resize(cols, rows).await?;
            } else if let Some(text) = action["write"].as_str() {
                session.write(Bytes::from(text.to_owned())).await?;
            } else if action["close_stdin"].as_bool() == Some(true) {
                session.close_stdin();
            }
        }
        while let Some(event) = session.next_event().await {
            if record(event?, out) {
                break;
            }
        }
        Ok(())
    }

    async fn forward(&mut self, step: &Value, out: &mut Outcome) -> Result<(), StepError> {
        let sandbox = self.target(step);
        if let Some(port) = step.get("remote_port").and_then(Value::as_u64) {
            let handle = self
                .client
                .forward(&sandbox, port as u16, "127.0.0.1:0", opts())
                .await?;
            handle.close();
            return Ok(());
        }
        let server = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| anyhow!("echo server: {e}"))?;
        let target = server.local_addr().map_err(|e| anyhow!("{e}"))?.port();
        let echo = tokio::spawn(async move {
            while let Ok((mut conn, _)) = server.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        let handle = self
            .client
            .forward(&sandbox, target, "127.0.0.1:0", opts())
            .await?;
        let addr = handle.local_addr();
        let size = step["bytes_per_connection"].as_u64().unwrap_or(1024) as usize;
        let connections = step["connections"].as_u64().unwrap_or(1) as usize;
        let rounds = (0..connections).map(|i| async move {
            let payload: Vec<u8> = (0..size).map(|j| (i * 31 + j * 7) as u8).collect();
            let mut conn = tokio::net::TcpStream::connect(addr).await?;
            let (mut r, mut w) = conn.split();
            let send = async {
                w.write_all(&payload).await?;
                w.shutdown().await
            };
            let mut echoed = Vec::new();
            let (sent, read) = tokio::join!(send, r.read_to_end(&mut echoed));
            sent?;
            read?;
            Ok::<bool, std::io::Error>(echoed == payload)
        });
        let results = futures::future::join_all(rounds).await;
        out.echoed = Some(results.iter().all(|r| matches!(r, Ok(true))));
        out.accepted = handle.stats().connections_accepted;
        handle.close();
        handle.closed().await;
        out.closed_refuses = Some(tokio::net::TcpStream::connect(addr).await.is_err());
        echo.abort();
        Ok(())
    }

    fn check(&mut self, expect: &Value, out: &Outcome) -> anyhow::Result<()> {
        let Some(expect) = expect.as_object() else {
            return Ok(());
        };
        for (key, want) in expect {
            match key.as_str() {
                "error" | "message_excludes" | "retryable" => {}
                "phase" => {
                    if out.phase.as_deref() != want.as_str() {
                        bail!("phase {:?}, expected {want}", out.phase);
                    }
                }
                "phase_in" => {
                    let allowed = strings(Some(want));
                    if !allowed
                        .iter()
                        .any(|p| Some(p.as_str()) == out.phase.as_deref())
                    {
                        bail!("phase {:?}, expected one of {allowed:?}", out.phase);
                    }
                }
                "label" => {
                    let pair = strings(Some(want));
                    if out.labels.get(&pair[0]) != Some(&pair[1]) {
                        bail!("labels {:?}", out.labels);
                    }
                }
                "contains" => {
                    let name = self.name(want.as_str().unwrap_or_default());
                    if !out.names.contains(&name) {
                        bail!("{name} not listed");
                    }
                }
                "stdout" | "stderr" => {
                    let got = if key == "stdout" {
                        &out.stdout
                    } else {
                        &out.stderr
                    };
                    if String::from_utf8_lossy(got) != want.as_str().unwrap_or_default() {
                        bail!("{key} {:?}, expected {want}", String::from_utf8_lossy(got));
                    }
                }
                "exit_code" => {
                    if out.exit_code.map(i64::from) != want.as_i64() {
                        bail!("exit code {:?}, expected {want}", out.exit_code);
                    }
                }
                "exit_last" => {
                    if out.exit_last != want.as_bool() {
                        bail!("the exit event is not the single last event");
                    }
                }
                "min_events" => {
                    if (out.events as u64) < want.as_u64().unwrap_or(0) {
                        bail!("{} events", out.events);
                    }
                }
                "stdout_len" => {
                    if out.stdout.len() as u64 != want.as_u64().unwrap_or(0) {
                        bail!("{} bytes of stdout", out.stdout.len());
                    }
                }
                "output_contains" => {
                    for text in strings(Some(want)) {
                        if !contains(&out.output, text.as_bytes()) {
                            bail!(
                                "{text:?} not in output {:?}",
                                String::from_utf8_lossy(&out.output)
                            );
                        }
                    }
                }
                "echoed" => {
                    if out.echoed != want.as_bool() {
                        bail!("a connection did not echo its payload");
                    }
                }
                "min_accepted" => {
                    if out.accepted < want.as_u64().unwrap_or(0) {
                        bail!("{} connections accepted", out.accepted);
                    }
                }
                "closed_refuses" => {
                    if out.closed_refuses != want.as_bool() {
                        bail!("the listener still accepts after close");
                    }
                }
                "metadata_prefix" => {
                    let pair = strings(Some(want));
                    let value = out
                        .metadata
                        .iter()
                        .find(|(k, _)| *k == pair[0])
                        .map(|(_, v)| v);
                    if !value.is_some_and(|v| v.starts_with(&pair[1])) {
                        bail!("{} = {value:?}", pair[0]);
                    }
                }
                "response_field" => {
                    let pair = strings(Some(want));
                    let expected = self.subst(&Value::String(pair[1].clone()));
                    let got = out
                        .response
                        .as_ref()
                        .and_then(|m| field(m, &pair[0]))
                        .unwrap_or_default();
                    if Some(got.as_str()) != expected.as_str() {
                        bail!("{} = {got:?}", pair[0]);
                    }
                }
                "hinted_min" => {
                    if out.hinted_delta < want.as_u64().unwrap_or(0) {
                        bail!("{} hinted attempts", out.hinted_delta);
                    }
                }
                "unrouted_retry" => {
                    if out.unrouted_retry_delta != want.as_u64().unwrap_or(0) {
                        bail!("{} unrouted retries", out.unrouted_retry_delta);
                    }
                }
                "mode"
                | "bootstrap"
                | "updates_acknowledged"
                | "rejected"
                | "applied_settings"
                | "max_latency"
                | "updates_received"
                | "min_polls" => {
                    let Some(config) = &out.config else {
                        bail!("{key} needs a config_session step");
                    };
                    self.check_config(key, want, config)?;
                }
                other => bail!("this runner does not know expectation {other:?}"),
            }
        }
        Ok(())
    }
}

/// A string setting of a snapshot.
fn string_setting(snapshot: &ConfigSnapshot, key: &str) -> Option<String> {
    match snapshot
        .sandbox_config
        .settings
        .get(key)?
        .value
        .as_ref()?
        .value
        .as_ref()?
    {
        setting_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

/// Polls `check` every 20 ms for at most `limit`.
async fn wait_for(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

fn process_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Reads the sandbox token the harness's cluster keeps for tests
/// (`<data-dir>/sandboxes/<id>/token`), then stops the sandbox's supervisor
/// (`<data-dir>/sandboxes/<id>/supervisor.pid`)
/// by its PID (SIGTERM; bounded wait) so the step's session is the
/// sandbox's only one.
async fn take_over(data_dir: &Path, sandbox_id: &str) -> anyhow::Result<String> {
    let pid_file = data_dir
        .join("sandboxes")
        .join(sandbox_id)
        .join("supervisor.pid");
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .parse()
        .context("supervisor.pid")?;
    // Guard against a reused PID: it must be this sandbox's supervisor.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if !args.iter().any(|a| a.ends_with(b"openshell-supervisor"))
        || !args.contains(&sandbox_id.as_bytes())
    {
        bail!("process {pid} is not the supervisor of sandbox {sandbox_id}");
    }
    let token_file = data_dir.join("sandboxes").join(sandbox_id).join("token");
    let token = std::fs::read_to_string(&token_file)
        .with_context(|| format!("reading {}", token_file.display()))?
        .trim()
        .to_owned();
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    if !wait_for(Duration::from_secs(10), || !process_running(pid)).await {
        bail!("supervisor {pid} did not stop within 10 s");
    }
    Ok(token)
}

/// A string field at a dotted path of a message.
fn field(message: &DynamicMessage, path: &str) -> Option<String> {
    let mut parts = path.split('.').peekable();
    let mut current = message.clone();
    while let Some(part) = parts.next() {
        let value = current.get_field_by_name(part)?.into_owned();
        if parts.peek().is_none() {
            return value.as_str().map(str::to_owned);
        }
        current = value.as_message()?.clone();
    }
    None
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

fn phase_name(phase: openshell_sdk::SandboxPhase) -> String {
    phase
        .as_str_name()
        .trim_start_matches("SANDBOX_PHASE_")
        .to_owned()
}

enum StepError {
    Sdk(Error),
    Other(anyhow::Error),
}

impl From<Error> for StepError {
    fn from(e: Error) -> Self {
        StepError::Sdk(e)
    }
}

impl From<anyhow::Error> for StepError {
    fn from(e: anyhow::Error) -> Self {
        StepError::Other(e)
    }
}

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
    let endpoint =
        std::env::var("OPENSHELL_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:17670".into());
    let run_id = std::env::var("OPENSHELL_CONFORMANCE_RUN")
        .unwrap_or_else(|_| format!("{:08x}", std::process::id()));
    let config = ClientConfig::builder(endpoint.clone()).build()?;
    let data_dir = std::env::var_os("OPENSHELL_CONFORMANCE_DATA_DIR").map(PathBuf::from);
    let mut runner = Runner {
        client: Client::connect_lazy(config).await?,
        endpoint,
        caps: capabilities(data_dir.as_deref()),
        data_dir,
        run_id,
        names: HashMap::new(),
        ready: HashSet::new(),
        pool: DescriptorPool::decode(openshell_sdk::proto::FILE_DESCRIPTOR_SET)?,
    };
    // The method table must know every method a raw step names.
    debug_assert!(
        openshell_sdk::proto::METHODS
            .iter()
            .any(|m| m.kind == StreamingKind::Unary)
    );
    for scenario in scenarios["scenarios"].as_array().into_iter().flatten() {
        let id = scenario["id"].as_str().unwrap_or_default();
        if !only.is_empty() && !only.contains(id) {
            continue;
        }
        let started = Instant::now();
        let (status, detail) = runner.run(scenario).await;
        println!(
            "{}",
            json!({"id": id, "status": status, "detail": detail, "ms": started.elapsed().as_millis() as u64})
        );
    }
    runner.cleanup().await;
    Ok(())
}

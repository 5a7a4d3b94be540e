//! `config_session`: takes over a sandbox's session with the SDK's
//! `ConfigSession` on the sandbox's own token (its real supervisor stopped
//! first), writes the step's settings one at a time and reports what the
//! session saw: its counters, when each write arrived, the last applied
//! settings.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use openshell_sdk::proto::sandbox::{SettingValue, setting_value};
use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSession, ConfigSessionStats,
    ConfigSnapshot, DeliveryMode, Error, Metadata,
};
use prost::Message;
use serde_json::{Value, json};

use crate::report::StepResult;
use crate::runner::{Runner, opts, secs};

/// How long one write may take to reach the session before the step stops.
const ARRIVAL_LIMIT: Duration = Duration::from_secs(15);

impl Runner {
    pub async fn config_session(&mut self, step: &Value) -> StepResult {
        let data_dir = self
            .data_dir
            .clone()
            .ok_or_else(|| anyhow!("no OPENSHELL_CONFORMANCE_DATA_DIR"))?;
        let name = self.target(step);
        let sandbox = self.client.sandboxes().get(&name, opts()).await?;
        let token = take_over(&data_dir, &sandbox.id).await?;

        // The apply function refuses the step's `reject` setting value.
        let reject = (
            step["reject"]["setting"].as_str().map(str::to_owned),
            step["reject"]["value"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        let last: Arc<Mutex<Option<ConfigSnapshot>>> = Arc::default();
        let apply = {
            let (last, reject) = (last.clone(), reject.clone());
            Arc::new(move |snapshot: ConfigSnapshot| {
                if let (Some(key), value) = &reject
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
        let mut bootstrap_answered = None;
        if session.stats().mode == Some(DeliveryMode::Push) {
            let answered = wait_for(Duration::from_secs(10), || {
                session.stats().last_update_id >= 1
            })
            .await;
            bootstrap_answered = Some(answered);
        }

        let mut writes = Vec::new();
        let mut globals = Vec::new();
        let planned = step["writes"].as_array().cloned().unwrap_or_default();
        for write in planned
            .iter()
            .take_while(|_| bootstrap_answered != Some(false))
        {
            let write = self.subst(write);
            let key = write["setting"].as_str().unwrap_or_default().to_owned();
            let value = write["value"].as_str().unwrap_or_default().to_owned();
            let global = write["global"].as_bool().unwrap_or(false);
            let refused = reject == (Some(key.clone()), value.clone());
            let rejected_before = session.stats().rejected;
            let started = Instant::now();
            self.update_setting(&name, global, &key, Some(&value))
                .await?;
            if global {
                globals.push(key.clone());
            }
            // A refused value arrives as a rejection, any other as applied.
            let arrived = wait_for(ARRIVAL_LIMIT, || {
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
            let seconds = started.elapsed().as_secs_f64();
            writes.push(
                json!({"setting": key, "value": value, "arrived": arrived, "seconds": seconds}),
            );
            if !arrived {
                break;
            }
        }
        // A write counts as arrived once applied; its answer to the gateway
        // follows. Observed once every update received is answered (bounded),
        // and before the clean-up below, whose deletions also arrive.
        wait_for(ARRIVAL_LIMIT, || {
            let stats = session.stats();
            stats.last_update_id == stats.updates_received
        })
        .await;
        let stats = session.stats();
        let applied: BTreeMap<String, String> = match last.lock().unwrap().as_ref() {
            Some(snapshot) => snapshot
                .sandbox_config
                .settings
                .keys()
                .filter_map(|k| string_setting(snapshot, k).map(|v| (k.clone(), v)))
                .collect(),
            None => BTreeMap::new(),
        };
        // Global settings would reach every later session: removed again.
        for key in globals {
            self.update_setting(&name, true, &key, None).await?;
        }
        cancel.cancel();
        let _ = running.await;
        Ok(json!({
            "stats": stats_json(&stats),
            "bootstrap_answered": bootstrap_answered,
            "writes": writes,
            "applied_settings": applied,
        }))
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
            sandbox: if global { "" } else { sandbox }.to_owned(),
            global,
            setting_key: key.to_owned(),
            setting_value: value.map(|v| SettingValue {
                value: Some(setting_value::Value::StringValue(v.to_owned())),
            }),
            delete_setting: value.is_none(),
            ..Default::default()
        };
        let path = format!("/{}/UpdateConfig", openshell_sdk::proto::SERVICE);
        let body = Bytes::from(request.encode_to_vec());
        self.client
            .raw_unary(&path, body, Metadata::new(), opts())
            .await?;
        Ok(())
    }
}

fn stats_json(stats: &ConfigSessionStats) -> Value {
    let mode = match stats.mode {
        Some(DeliveryMode::Push) => Some("push"),
        Some(DeliveryMode::Poll) => Some("poll"),
        None => None,
    };
    json!({
        "mode": mode,
        "sessions_accepted": stats.sessions_accepted,
        "updates_received": stats.updates_received,
        "last_update_id": stats.last_update_id,
        "rejected": stats.rejected,
        "polls": stats.polls,
        "served_by": stats.served_by,
    })
}

/// A string setting of a snapshot.
fn string_setting(snapshot: &ConfigSnapshot, key: &str) -> Option<String> {
    let value = snapshot.sandbox_config.settings.get(key)?.value.as_ref()?;
    match value.value.as_ref()? {
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
/// (`<data-dir>/sandboxes/<id>/supervisor.pid`) by its PID (SIGTERM, bounded
/// wait) so the step's session is the sandbox's only one.
async fn take_over(data_dir: &Path, sandbox_id: &str) -> anyhow::Result<String> {
    let dir = data_dir.join("sandboxes").join(sandbox_id);
    let pid_file = dir.join("supervisor.pid");
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
    let token_file = dir.join("token");
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

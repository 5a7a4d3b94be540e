//! Log and watch ops: `logs`, `watch_logs`, `watch_events`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use openshell_sdk::{LogQuery, WatchEvent, WatchOptions};
use serde_json::{Value, json};

use crate::report::StepResult;
use crate::runner::{Runner, opts, strings};

/// How long `wait_for` reads again, and `watch_logs` waits for its line.
const LOGS_WAIT: Duration = Duration::from_secs(15);
const WATCH_WAIT: Duration = Duration::from_secs(20);
/// Quiet time after the first event before `watch_logs` runs its command.
const SETTLE: Duration = Duration::from_secs(1);

fn query(step: &Value) -> LogQuery {
    let mut query = LogQuery::new();
    if let Some(source) = step["source"].as_str() {
        query = query.source(source);
    }
    if let Some(level) = step["min_level"].as_str() {
        query = query.min_level(level);
    }
    if let Some(tail) = step["tail"].as_u64() {
        query = query.tail(tail as u32);
    }
    query
}

impl Runner {
    pub async fn logs(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let wait_for = step["wait_for"].as_str();
        let deadline = Instant::now() + LOGS_WAIT;
        loop {
            let logs = self
                .client
                .sandboxes()
                .logs(&name, &query(step), opts())
                .await?;
            let messages: Vec<&str> = logs.lines.iter().map(|l| l.message.as_str()).collect();
            let done = wait_for.is_none_or(|want| messages.contains(&want));
            if done || Instant::now() > deadline {
                let sources: Vec<&str> = logs.lines.iter().map(|l| l.source.as_str()).collect();
                return Ok(json!({"messages": messages, "sources": sources}));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn watch_logs(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let sandboxes = self.client.sandboxes();
        let mut events = sandboxes.events(
            &name,
            WatchOptions::new()
                .status(false)
                .logs(LogQuery::new().source("sandbox")),
            opts(),
        );
        let first = tokio::time::timeout(WATCH_WAIT, events.next())
            .await
            .map_err(|_| anyhow::anyhow!("no first event in {WATCH_WAIT:?}"))?
            .ok_or_else(|| anyhow::anyhow!("the watch ended before its first event"))??;
        let mut last = first.cursor().to_owned();
        let mut ordered = true;
        // Lines of earlier steps still on their way arrive first.
        while let Ok(Some(event)) = tokio::time::timeout(SETTLE, events.next()).await {
            let event = event?;
            ordered &= event.cursor() >= last.as_str();
            last = event.cursor().to_owned();
        }
        let opened = last.clone();
        let program = strings(&step["command"])
            .into_iter()
            .next()
            .unwrap_or_default();
        let exec = openshell_sdk::ExecRequest::new(&name, strings(&step["command"]));
        self.client.exec(exec, opts()).await?;
        let deadline = Instant::now() + WATCH_WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let event = tokio::time::timeout(left, events.next())
                .await
                .map_err(|_| anyhow::anyhow!("no exec line within {WATCH_WAIT:?}"))?
                .ok_or_else(|| anyhow::anyhow!("the watch ended"))??;
            ordered &= event.cursor() >= last.as_str();
            last = event.cursor().to_owned();
            if let WatchEvent::Log { line, cursor } = &event
                && line.message == "exec finished"
                && line.fields.get("argv0") == Some(&program)
                && cursor.as_str() > opened.as_str()
            {
                let code: i64 = line
                    .fields
                    .get("exit_code")
                    .and_then(|c| c.parse().ok())
                    .ok_or_else(|| anyhow::anyhow!("an exec line without exit_code"))?;
                return Ok(json!({"finished_exit_code": code, "cursors_ordered": ordered}));
            }
        }
    }

    pub async fn watch_events(&mut self, step: &Value) -> StepResult {
        let name = self.target(step);
        let cursor = step["resume_after"].as_str().unwrap_or_default();
        let mut events =
            self.client
                .sandboxes()
                .events(&name, WatchOptions::new().resume_after(cursor), opts());
        let first = tokio::time::timeout(WATCH_WAIT, events.next())
            .await
            .map_err(|_| anyhow::anyhow!("no first event in {WATCH_WAIT:?}"))?
            .ok_or_else(|| anyhow::anyhow!("the watch ended before its first event"))??;
        let kind = match first {
            WatchEvent::Sandbox { .. } => "sandbox",
            WatchEvent::Log { .. } => "log",
        };
        Ok(json!({"first": kind}))
    }
}

//! Exec ops: buffered, streaming, repeated, interactive, and the routing
//! counters around a series of execs.

use anyhow::anyhow;
use bytes::Bytes;
use futures::StreamExt;
use openshell_sdk::{ExecEvent, ExecRequest, RoutingStats};
use serde_json::{Map, Value, json};

use crate::report::{StepResult, text};
use crate::runner::{Runner, opts, secs, string_map, strings};

impl Runner {
    pub async fn exec(&mut self, step: &Value) -> StepResult {
        let request = self.exec_request(step);
        let r = self.client.exec(request, opts()).await?;
        let mut out = Map::new();
        text(&mut out, "stdout", &r.stdout);
        text(&mut out, "stderr", &r.stderr);
        out.insert("exit_code".into(), json!(r.exit_code));
        Ok(out.into())
    }

    pub async fn exec_stream(&mut self, step: &Value) -> StepResult {
        let request = self.exec_request(step);
        let mut stream = self.client.exec_stream(request, opts()).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (mut events, mut exit_events) = (0, 0);
        let (mut last_event, mut exit_code) = (None, None);
        while let Some(event) = stream.next().await {
            events += 1;
            last_event = Some(match event? {
                ExecEvent::Stdout(d) => {
                    stdout.extend_from_slice(&d);
                    "stdout"
                }
                ExecEvent::Stderr(d) => {
                    stderr.extend_from_slice(&d);
                    "stderr"
                }
                ExecEvent::Exit(code) => {
                    exit_events += 1;
                    exit_code = Some(code);
                    "exit"
                }
            });
        }
        let mut out = Map::new();
        text(&mut out, "stdout", &stdout);
        text(&mut out, "stderr", &stderr);
        out.insert("exit_code".into(), json!(exit_code));
        out.insert("events".into(), json!(events));
        out.insert("exit_events".into(), json!(exit_events));
        out.insert("last_event".into(), json!(last_event));
        Ok(out.into())
    }

    pub async fn exec_repeat(&mut self, step: &Value) -> StepResult {
        let mut runs = Vec::new();
        for _ in 0..step["count"].as_u64().unwrap_or(1) {
            let request = self.exec_request(step);
            let r = self.client.exec(request, opts()).await?;
            let mut run = Map::new();
            text(&mut run, "stdout", &r.stdout);
            run.insert("exit_code".into(), json!(r.exit_code));
            runs.push(Value::from(run));
        }
        Ok(json!({"runs": runs}))
    }

    /// The client's routing counters before and after `count` execs.
    pub async fn routing_stats_delta(&mut self, step: &Value) -> StepResult {
        let before = self.client.routing_stats();
        for _ in 0..step["count"].as_u64().unwrap_or(1) {
            let request = self.exec_request(step);
            self.client.exec(request, opts()).await?;
        }
        let after = self.client.routing_stats();
        Ok(json!({"routing_before": counters(&before), "routing_after": counters(&after)}))
    }

    /// Runs the step's actions in order (`wait_output` reads until the text
    /// has appeared), then reads to the exit.
    pub async fn interactive(&mut self, step: &Value) -> StepResult {
        let request = self.exec_request(step);
        let mut session = self.client.exec_interactive(request, opts()).await?;
        let (mut output, mut stdout, mut exit_code) = (Vec::new(), Vec::new(), None);
        let mut record = |event: ExecEvent| match event {
            ExecEvent::Stdout(d) => {
                output.extend_from_slice(&d);
                stdout.extend_from_slice(&d);
            }
            ExecEvent::Stderr(d) => output.extend_from_slice(&d),
            ExecEvent::Exit(code) => exit_code = Some(code),
        };
        let mut seen = Vec::new();
        for action in step["actions"].as_array().into_iter().flatten() {
            if let Some(wanted) = action["wait_output"].as_str() {
                while !contains(&seen, wanted.as_bytes()) {
                    match session.next_event().await.transpose()? {
                        Some(ExecEvent::Exit(_)) | None => {
                            return Err(anyhow!("the process ended before {wanted:?}").into());
                        }
                        Some(event) => {
                            if let ExecEvent::Stdout(d) | ExecEvent::Stderr(d) = &event {
                                seen.extend_from_slice(d);
                            }
                            record(event);
                        }
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
            let event = event?;
            let exit = matches!(event, ExecEvent::Exit(_));
            record(event);
            if exit {
                break;
            }
        }
        let mut out = Map::new();
        text(&mut out, "stdout", &stdout);
        text(&mut out, "output", &output);
        out.insert("exit_code".into(), json!(exit_code));
        Ok(out.into())
    }

    pub fn exec_request(&mut self, step: &Value) -> ExecRequest {
        let mut request = ExecRequest::new(self.target(step), strings(&step["command"]));
        request.environment = string_map(&step["env"]);
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
}

pub(crate) fn counters(stats: &RoutingStats) -> Value {
    json!({"hinted": stats.hinted, "unrouted_retry": stats.unrouted_retries})
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

//! What commands print: aligned tables (kubectl style), JSON, and a
//! spinner on stderr while waiting (only when stderr is a terminal).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openshell_sdk::{Sandbox, SandboxPhase};
use serde_json::{Value, json};

/// Left-aligned columns separated by three spaces; the header in capitals.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        let last = cells.len() - 1;
        let mut text = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                text.push_str(&cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                text.push_str(&cell);
                text.push_str(&" ".repeat(pad + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
    out
}

/// `READY`, `PROVISIONING`, ... (the enum name without its prefix).
pub fn phase_name(phase: SandboxPhase) -> &'static str {
    phase
        .as_str_name()
        .strip_prefix("SANDBOX_PHASE_")
        .unwrap_or("UNKNOWN")
}

/// `5s`, `3m`, `2h`, `4d` since a creation time.
fn age(sandbox: &Sandbox) -> String {
    let Some(created) = sandbox
        .proto
        .metadata
        .as_ref()
        .and_then(|m| m.created_time.as_ref())
    else {
        return "-".into();
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    let secs = (now - created.seconds).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn labels_text(sandbox: &Sandbox) -> String {
    if sandbox.labels.is_empty() {
        return "-".into();
    }
    sandbox
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The sandbox table (`get`, `list`, `create`).
pub fn sandbox_table(sandboxes: &[Sandbox]) -> String {
    let rows: Vec<Vec<String>> = sandboxes
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                phase_name(s.phase).to_owned(),
                age(s),
                s.id.clone(),
                labels_text(s),
            ]
        })
        .collect();
    table(&["NAME", "PHASE", "AGE", "ID", "LABELS"], &rows)
}

/// A sandbox as JSON: the lifted fields, never the spec's environment
/// values (they may be secrets): only its keys.
pub fn sandbox_json(sandbox: &Sandbox) -> Value {
    let spec = sandbox.proto.spec.clone().unwrap_or_default();
    let mut env_keys: Vec<&String> = spec.environment.keys().collect();
    env_keys.sort();
    let created = sandbox
        .proto
        .metadata
        .as_ref()
        .and_then(|m| m.created_time.as_ref())
        .map(|t| t.seconds);
    let conditions: Vec<Value> = sandbox
        .proto
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| {
                    json!({
                        "type": c.r#type,
                        "status": c.status,
                        "reason": c.reason,
                        "message": c.message,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "name": sandbox.name,
        "id": sandbox.id,
        "phase": phase_name(sandbox.phase),
        "labels": sandbox.labels,
        "exit_code": sandbox.exit_code,
        "resource_version": sandbox.resource_version,
        "created_unix": created,
        "command": spec.command,
        "environment_keys": env_keys,
        "providers": spec.providers,
        "limits": limits_json(spec.template.as_ref()),
        "conditions": conditions,
    })
}

/// The template's `resources.limits` (what the gateway enforces), as JSON;
/// `{}` without any.
fn limits_json(template: Option<&openshell_sdk::proto::SandboxTemplate>) -> Value {
    use prost_types::value::Kind;
    let limits = template
        .and_then(|t| t.resources.as_ref())
        .and_then(|r| r.fields.get("limits"))
        .and_then(|v| match &v.kind {
            Some(Kind::StructValue(table)) => Some(table),
            _ => None,
        });
    let mut out = serde_json::Map::new();
    for (key, value) in limits.map(|t| t.fields.iter()).into_iter().flatten() {
        let value = match &value.kind {
            Some(Kind::StringValue(text)) => json!(text),
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 => json!(*n as u64),
            Some(Kind::NumberValue(n)) => json!(n),
            _ => continue,
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// Pretty JSON and a newline on stdout.
pub fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into())
    );
}

/// A spinner on stderr while something runs; a no-op when stderr is not a
/// terminal (scripts and tests see no control characters).
pub struct Spinner {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    pub fn start(message: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::io::stderr().is_terminal().then(|| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    eprint!("\r{} {message}", FRAMES[i % FRAMES.len()]);
                    let _ = std::io::stderr().flush();
                    i += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                // Erase the line.
                eprint!("\r\x1b[2K");
                let _ = std::io::stderr().flush();
            })
        });
        Self { stop, thread }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_and_trim() {
        let text = table(
            &["NAME", "PHASE"],
            &[
                vec!["a".into(), "READY".into()],
                vec!["longer".into(), "ERROR".into()],
            ],
        );
        assert_eq!(text, "NAME     PHASE\na        READY\nlonger   ERROR\n");
        assert_eq!(phase_name(SandboxPhase::Ready), "READY");
        assert_eq!(phase_name(SandboxPhase::Provisioning), "PROVISIONING");
    }
}

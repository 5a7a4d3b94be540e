//! `openshell-gateway status`: what the developer cluster's processes are
//! doing, read from the status file `up` keeps (`<data>/up/status.json`).
//! Exit code 0 when `up` runs and every process is running, 1 when some
//! process is not (or `up` is gone), 2 for a data directory without one.

use std::path::PathBuf;

use clap::Args;

use super::board::{STATUS_FILE, State, Status};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The data directory `up` was given.
    #[arg(long, default_value = ".run/data")]
    data_dir: PathBuf,
    /// Print the status file as it is (JSON).
    #[arg(long)]
    json: bool,
}

fn alive(pid: u32) -> bool {
    i32::try_from(pid).is_ok_and(crate::sandboxes::driver::is_running)
}

/// Prints the status; returns the exit code.
pub fn run(args: StatusArgs) -> anyhow::Result<i32> {
    let path = args.data_dir.join("up").join(STATUS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => {
            eprintln!(
                "no cluster status at {} ({err}): is `openshell-gateway up --data-dir {}` running?",
                path.display(),
                args.data_dir.display()
            );
            return Ok(2);
        }
    };
    let status: Status = serde_json::from_str(&text)
        .map_err(|err| anyhow::anyhow!("{} is not a status file: {err}", path.display()))?;
    let up_alive = alive(status.pid);
    let all_running = status
        .processes
        .iter()
        .all(|p| p.state == State::Running && p.pid.is_some_and(alive));
    if args.json {
        println!("{text}");
    } else {
        print!("{}", render(&status, up_alive));
    }
    Ok(if up_alive && all_running { 0 } else { 1 })
}

fn render(status: &Status, up_alive: bool) -> String {
    let mut out = String::new();
    let down = status
        .processes
        .iter()
        .filter(|p| p.state != State::Running)
        .count();
    match up_alive {
        true => out.push_str(&format!(
            "up (pid {}) serving {}: {} of {} processes running\n",
            status.pid,
            status.endpoint,
            status.processes.len() - down,
            status.processes.len()
        )),
        false => out.push_str(&format!(
            "up (pid {}) is not running; its last status:\n",
            status.pid
        )),
    }
    out.push_str(&format!(
        "{:<8} {:<8} {:<11} {:>8} {:>6} {:>9}  {}\n",
        "NAME", "KIND", "STATE", "PID", "EXITS", "RESTARTS", "LAST EXIT"
    ));
    for p in &status.processes {
        let pid = p.pid.map(|pid| pid.to_string()).unwrap_or("-".into());
        out.push_str(&format!(
            "{:<8} {:<8} {:<11} {:>8} {:>6} {:>9}  {}\n",
            p.name,
            p.kind.as_str(),
            p.state.as_str(),
            pid,
            p.exits,
            p.restarts,
            p.last_exit.as_deref().unwrap_or("-")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::up::board::Entry;
    use crate::up::process::Kind;

    #[test]
    fn the_table_names_what_is_down() {
        let status = Status {
            pid: 1,
            endpoint: "http://127.0.0.1:17670".into(),
            metrics: "127.0.0.1:1".into(),
            processes: vec![
                Entry {
                    name: "gw-0".into(),
                    kind: Kind::Replica,
                    state: State::Running,
                    pid: Some(42),
                    exits: 0,
                    restarts: 0,
                    last_exit: None,
                    log: "gw-0.log".into(),
                },
                Entry {
                    name: "h-1".into(),
                    kind: Kind::Host,
                    state: State::Down,
                    pid: None,
                    exits: 1,
                    restarts: 0,
                    last_exit: Some("signal: 9 (SIGKILL)".into()),
                    log: "h-1.log".into(),
                },
            ],
        };
        let text = render(&status, true);
        assert!(
            text.starts_with(
                "up (pid 1) serving http://127.0.0.1:17670: 1 of 2 processes running\n"
            ),
            "{text}"
        );
        let host = text.lines().find(|l| l.starts_with("h-1")).unwrap();
        assert!(host.contains("down") && host.contains("SIGKILL"), "{host}");
        assert!(render(&status, false).contains("is not running"));
    }
}

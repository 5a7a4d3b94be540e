//! `openshell-gateway up` as a test runs it: the developer cluster exactly
//! as a user starts it (its replicas, edge and hosts are `up`'s children,
//! not the test's), on a free port and a temporary data directory. Reads
//! `up`'s output and its status file; stops `up` with SIGINT by PID when
//! dropped (SIGKILL after 30 s), so a failed test leaves nothing running.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{bin, free_port, http_get, is_running, metric_value, signal};

pub struct Up {
    child: Option<Child>,
    /// `up`'s standard input with `--control stdin`.
    control: Option<std::process::ChildStdin>,
    dir: tempfile::TempDir,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Up {
    /// Starts `up` with `args` (besides `--listen` and `--data-dir`) and
    /// waits (at most 90 s) for its banner; panics with its output if it
    /// exits or does not print one. The edge's port is picked free just
    /// before; should another socket take it first, the start is tried
    /// again on another (at most three times).
    pub fn start(args: &[&str]) -> Up {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Up::try_start(args) {
                Ok(up) => return up,
                Err(why) if why.contains("in use") => failures.push(why),
                Err(why) => panic!("{why}"),
            }
        }
        panic!("up did not start: {failures:?}");
    }

    fn try_start(args: &[&str]) -> Result<Up, String> {
        let dir = tempfile::tempdir().unwrap();
        let control = args.windows(2).any(|w| w == ["--control", "stdin"]);
        let port = free_port();
        let mut child = Command::new(bin("openshell-gateway"))
            .arg("up")
            .args(args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(if control {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("up.stderr")).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let control = child.stdin.take();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut up = Up {
            child: Some(child),
            control,
            dir,
            port,
            lines,
        };
        let started = Instant::now();
        while !up.printed("serving") {
            let exited = up.child.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || started.elapsed() > Duration::from_secs(90) {
                let read = |name: &str| {
                    std::fs::read_to_string(up.dir.path().join(name)).unwrap_or_default()
                };
                return Err(format!(
                    "up did not start ({exited:?}): {:?}; stderr: {}; edge log: {}",
                    up.output(),
                    read("up.stderr"),
                    read("up/edge.log")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(up)
    }

    /// Sends one order line (`--control stdin`) and returns `up`'s answer
    /// line (`control: ok ...` or `control: error ...`), waiting at most 90 s.
    pub fn order(&mut self, line: &str) -> String {
        use std::io::Write;
        let seen = self.answers().len();
        let stdin = self.control.as_mut().expect("started with --control stdin");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        let started = Instant::now();
        loop {
            if let Some(answer) = self.answers().get(seen) {
                return answer.clone();
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "no answer to {line:?}: {:?}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers(&self) -> Vec<String> {
        self.output()
            .into_iter()
            .filter(|l| l.starts_with("control: "))
            .collect()
    }

    /// Closes `up`'s standard input (`--control stdin`): as if the process
    /// holding it had died.
    pub fn close_control(&mut self) {
        self.control = None;
    }

    /// Waits (at most `limit`) for `up` to exit; its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("up still running after {limit:?}");
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Every line `up` printed so far.
    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub fn printed(&self, text: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(text))
    }

    /// `<data>/up/status.json`.
    pub fn status(&self) -> serde_json::Value {
        let path = self.dir.path().join("up").join("status.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// One process's entry in the status file.
    pub fn process(&self, name: &str) -> serde_json::Value {
        self.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no process {name} in up's status"))
            .clone()
    }

    /// A process's PID, `None` while it is not running.
    pub fn pid_of(&self, name: &str) -> Option<i32> {
        self.process(name)["pid"].as_i64().map(|p| p as i32)
    }

    /// Waits (at most `limit`) until `name`'s state is `state`.
    pub fn wait_state(&self, name: &str, state: &str, limit: Duration) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let entry = self.process(name);
            if entry["state"] == state {
                return entry;
            }
            assert!(
                started.elapsed() < limit,
                "{name} not {state} after {limit:?}: {entry}; output {:?}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most `limit`) until `name` runs again under a PID other
    /// than `old` (after `up` restarted it).
    pub fn wait_restarted(&self, name: &str, old: i32, limit: Duration) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let entry = self.process(name);
            let pid = entry["pid"].as_i64().map(|p| p as i32);
            if entry["state"] == "running" && pid.is_some_and(|p| p != old) {
                return entry;
            }
            assert!(
                started.elapsed() < limit,
                "{name} not restarted after {limit:?}: {entry}; output {:?}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The replicas' metrics addresses, from the banner (`gw-N: ... (metrics
    /// http://ADDR/metrics)`), in replica order.
    pub fn replica_metrics(&self) -> Vec<String> {
        self.output()
            .iter()
            .filter(|l| l.trim_start().starts_with("gw-"))
            .filter_map(|l| {
                let rest = l.split("(metrics http://").nth(1)?;
                Some(rest.split('/').next()?.to_owned())
            })
            .collect()
    }

    /// One sample of every replica's metrics (0 where absent).
    pub fn replica_metric(&self, sample: &str) -> Vec<f64> {
        self.replica_metrics()
            .iter()
            .map(|addr| metric_value(&http_get(addr.parse().unwrap(), "/metrics"), sample))
            .map(|v| v.unwrap_or(0.0))
            .collect()
    }

    /// The sum over the replicas of every sample whose line starts with
    /// `prefix` (all label sets of a family, for example).
    pub fn replica_sum(&self, prefix: &str) -> f64 {
        self.replica_metrics()
            .iter()
            .map(|addr| {
                http_get(addr.parse().unwrap(), "/metrics")
                    .lines()
                    .filter(|l| l.starts_with(prefix))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            })
            .sum()
    }

    /// `up`'s own listener (`/status`, `/metrics`), from the status file.
    pub fn metrics_addr(&self) -> String {
        self.status()["metrics"].as_str().unwrap().to_owned()
    }

    /// Every supervisor PID named in `<data>/sandboxes/*/supervisor.pid`.
    pub fn supervisor_pids(&self) -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("sandboxes")) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("supervisor.pid")).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }

    /// Ctrl-C: SIGINT to `up`, then waits (at most 60 s) for it to exit.
    /// Returns its exit code.
    pub fn interrupt(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        signal(child.id() as i32, libc::SIGINT);
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("up did not stop within 60 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGINT);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// PIDs of `pids` still running.
pub fn left_running(pids: &[i32]) -> Vec<i32> {
    pids.iter().copied().filter(|p| is_running(*p)).collect()
}

/// Waits (at most `limit`) until none of `pids` runs; panics naming those
/// still running.
pub async fn assert_stopped(pids: &[i32], limit: Duration) {
    assert!(
        crate::eventually(limit, || left_running(pids).is_empty()).await,
        "left running after {limit:?}: {:?}",
        left_running(pids)
    );
}

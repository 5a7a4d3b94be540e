//! Helpers for the CLI tests: a real 3-replica cluster behind the built-in
//! edge (testkit), and the `openshell` binary run as a child process with a
//! private config directory, every run bounded in time and stopped by its
//! PID when it overstays.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{Edge, Gateway, bin, is_running, signal, wait_until};

/// The user token every replica accepts.
pub const TOKEN: &str = "cli-test-token-5d0e71c2";
/// A replica id the edge routes to a closed port: a replica that is gone.
pub const GONE: &str = "gw-9";

/// Three replicas; supervisors dial their own edge (as in a deployment), the
/// CLI another one whose routes also name [`GONE`].
pub struct Cluster {
    pub cluster: TestCluster,
    pub edge: Edge,
    _supervisor_edge: Edge,
    pub home: tempfile::TempDir,
}

impl Cluster {
    pub fn start() -> Self {
        let supervisor_edge = Edge::start(&[]);
        let cluster = TestCluster::start(ClusterOptions {
            replicas: 3,
            tokens: vec![TOKEN.into()],
            extra_args: ["--member-refresh-ms", "300", "--member-ttl-ms", "3000"]
                .map(String::from)
                .to_vec(),
            supervisor_url: Some(supervisor_edge.url.clone()),
            ..ClusterOptions::default()
        });
        let routes: Vec<(String, String)> = cluster
            .ids()
            .into_iter()
            .zip(cluster.replicas.iter().map(|gw| gw.url.clone()))
            .collect();
        let mut client_routes = routes.clone();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        client_routes.push((GONE.into(), closed));
        supervisor_edge.set_routes(&refs(&routes));
        let edge = Edge::start(&refs(&client_routes));
        for gw in &cluster.replicas {
            assert!(
                wait_until(Duration::from_secs(20), || {
                    gw.metric("openshell_server_ring_members") == Some(3.0)
                }),
                "ring incomplete"
            );
        }
        Self {
            cluster,
            edge,
            _supervisor_edge: supervisor_edge,
            home: tempfile::Builder::new()
                .prefix("openshell-cli-home-")
                .tempdir()
                .unwrap(),
        }
    }

    /// `openshell` with this cluster's edge and token in its environment.
    pub fn cli(&self) -> Cli {
        Cli::new(self.home.path())
            .env("OPENSHELL_ENDPOINT", &self.edge.url)
            .env("OPENSHELL_TOKEN", TOKEN)
    }

    pub fn replica(&self, id: &str) -> &Gateway {
        self.cluster.replica(id)
    }

    /// Sum of one sample over every replica.
    pub fn metric_sum(&self, sample: &str) -> f64 {
        self.cluster
            .replicas
            .iter()
            .map(|gw| gw.metric(sample).unwrap_or(0.0))
            .sum()
    }

    pub fn edge_requests(&self, route: &str, outcome: &str) -> f64 {
        self.edge
            .metric(&format!(
                r#"openshell_edge_requests_total{{route="{route}",outcome="{outcome}"}}"#
            ))
            .unwrap_or(0.0)
    }

    /// Creates a sandbox with the CLI and returns `(id, owner)` once the
    /// owner is known.
    pub fn create_ready(&self, name: &str) -> (String, String) {
        let out = self
            .cli()
            .args(["sandbox", "create", name, "--json"])
            .run(60);
        out.success();
        let created: serde_json::Value = serde_json::from_str(&out.stdout).expect("create --json");
        assert_eq!(created["phase"], "READY", "{}", out.stdout);
        let mut owner = None;
        assert!(
            wait_until(Duration::from_secs(20), || {
                let got = self.cli().args(["sandbox", "get", name, "--json"]).run(30);
                let v: serde_json::Value = serde_json::from_str(&got.stdout).unwrap_or_default();
                owner = v["owner"].as_str().map(str::to_owned);
                owner.is_some()
            }),
            "no owner reported for {name}"
        );
        (created["id"].as_str().unwrap().to_owned(), owner.unwrap())
    }
}

pub fn routed(route: &str, kind: &str) -> String {
    format!(
        r#"openshell_server_routed_request_attempts_total{{operation="relay",route="{route}",relay_kind="{kind}",outcome="success"}}"#
    )
}

pub const GET_SANDBOX_OK: &str =
    r#"openshell_server_requests_total{method="GetSandbox",code="ok"}"#;

/// The `openshell` binary, built by `cargo build --bins`.
pub fn openshell_bin() -> PathBuf {
    bin("openshell")
}

/// One run of `openshell`: a clean environment (no OPENSHELL_* from the
/// test's own), `HOME` and `XDG_CONFIG_HOME` in a private directory.
pub struct Cli {
    cmd: Command,
    stdin: Option<Vec<u8>>,
}

impl Cli {
    pub fn new(home: &Path) -> Self {
        let mut cmd = Command::new(openshell_bin());
        for (key, _) in std::env::vars() {
            if key.starts_with("OPENSHELL_") {
                cmd.env_remove(key);
            }
        }
        cmd.env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join("config"));
        Self { cmd, stdin: None }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd.args(args);
        self
    }

    pub fn arg_path(mut self, flag: &str, path: &Path) -> Self {
        self.cmd.arg(flag).arg(path);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    pub fn env_remove(mut self, key: &str) -> Self {
        self.cmd.env_remove(key);
        self
    }

    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    /// The command line this would run (for other programs' options).
    pub fn into_command(self) -> Command {
        self.cmd
    }

    /// Starts it in the background (stdout and stderr piped).
    pub fn spawn(mut self) -> Child {
        self.cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start openshell")
    }

    /// Runs it to the end, at most `secs` seconds (then SIGKILL by PID).
    pub fn run(mut self, secs: u64) -> Output {
        let mut child = self
            .cmd
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start openshell");
        wait_output(&mut child, self.stdin.take(), secs)
    }
}

/// Writes `stdin` (if any), collects stdout and stderr, waits at most
/// `secs`; a child that overstays is killed by its PID and the test fails.
pub fn wait_output(child: &mut Child, stdin: Option<Vec<u8>>, secs: u64) -> Output {
    let writer = child.stdin.take().map(|mut pipe| {
        let data = stdin.unwrap_or_default();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        })
    });
    // Pipes are read into shared buffers, so that output is available even
    // when a descendant (an ssh ProxyCommand) keeps a pipe open.
    let buffers: Vec<Arc<Mutex<Vec<u8>>>> = (0..2).map(|_| Arc::default()).collect();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .zip(buffers.iter().cloned())
    .map(|(pipe, buffer)| {
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            if let Some(mut pipe) = pipe {
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    buffer.lock().unwrap().extend_from_slice(&chunk[..n]);
                }
            }
        })
    })
    .collect();
    let started = Instant::now();
    let mut overstayed = None;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(secs) {
            let pid = child.id() as i32;
            signal(pid, libc::SIGKILL);
            overstayed = Some(pid);
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(writer) = writer {
        let _ = writer.join();
    }
    // The pipes end with the child, or soon after (bounded).
    let drained = Instant::now();
    while readers.iter().any(|r| !r.is_finished()) && drained.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stdout = buffers[0].lock().unwrap().clone();
    let stderr = buffers[1].lock().unwrap().clone();
    if let Some(pid) = overstayed {
        panic!(
            "child {pid} still running after {secs} s; stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        );
    }
    use std::os::unix::process::ExitStatusExt;
    Output {
        code: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        stdout_bytes: stdout.clone(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stdout_bytes: Vec<u8>,
    pub stderr: String,
}

impl Output {
    /// Exit 0, else a panic showing both streams.
    pub fn success(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// A failure: exit `code` and exactly one stderr line starting
    /// `error: <kind>: `.
    pub fn one_line_error(&self, code: i32, kind: &str) -> &Self {
        assert_eq!(
            self.code, code,
            "stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "not one line: {:?}", self.stderr);
        assert!(
            lines[0].starts_with(&format!("error: {kind}: ")),
            "expected error: {kind}: ..., got {:?}",
            lines[0]
        );
        self
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.stdout))
    }
}

/// A background child stopped (by its PID, as [`stop`] does) when dropped,
/// also when the test panics first.
pub struct Background(pub Child);

impl Drop for Background {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            stop(&mut self.0);
        }
    }
}

/// Stops a background child by its PID: SIGTERM, then SIGKILL after 5 s.
pub fn stop(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id() as i32;
    if is_running(pid) {
        signal(pid, libc::SIGTERM);
    }
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if started.elapsed() > Duration::from_secs(5) {
            signal(pid, libc::SIGKILL);
            return child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn refs(routes: &[(String, String)]) -> Vec<(&str, &str)> {
    routes
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect()
}

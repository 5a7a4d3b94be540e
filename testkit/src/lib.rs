//! Test support shared by the Rust test suites: starts the real
//! `openshell-gateway` binary on loopback, waits for its ready file, and
//! stops it and every supervisor it started by PID when dropped.
//!
//! Binaries are taken from the workspace target directory (build them with
//! `cargo build --bins` first; `make test` does). `OPENSHELL_BIN_DIR`
//! overrides the directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod edge;
pub mod host;
pub mod lab;
pub mod netns;
pub mod outside;
pub mod tls;
pub mod up;

pub use edge::{Edge, Nginx};
pub use host::{HostOptions, SupervisorHost};

/// Directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("OPENSHELL_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}

/// Path of a workspace binary; panics with a hint when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` (or `make build`) first",
        path.display()
    );
    path
}

/// How to start a gateway.
#[derive(Debug, Clone, Default)]
pub struct GatewayOptions {
    /// `--dev`: no user authentication.
    pub dev: bool,
    /// User tokens (`--token`).
    pub tokens: Vec<String>,
    /// `(cert, key)` PEM files: serve TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA file supervisors trust (defaults to the TLS cert on the gateway side).
    pub supervisor_ca: Option<PathBuf>,
    /// Any further arguments to `serve`.
    pub extra_args: Vec<String>,
    /// Replica id (default gw-0).
    pub replica_id: Option<String>,
    /// Store and sandbox directory shared with other replicas (default: a
    /// private one).
    pub data_dir: Option<PathBuf>,
    /// `--database-url` (default: SQLite in the data directory).
    pub database_url: Option<String>,
    /// `--peer-token`: makes the replica a cluster member.
    pub peer_token: Option<String>,
    /// URL the replica's supervisors dial (default: the replica itself).
    pub supervisor_url: Option<String>,
    /// A command the gateway is started through, for example
    /// `["faketime", "-f", "+600s"]` for a replica whose clock is off.
    pub launcher: Vec<String>,
    /// Extra environment variables of the gateway process.
    pub env: Vec<(String, String)>,
    /// `--listen` (default `127.0.0.1:0`); the metrics listener takes a
    /// free port on the same address.
    pub listen: Option<SocketAddr>,
}

impl GatewayOptions {
    pub fn dev() -> Self {
        Self {
            dev: true,
            ..Self::default()
        }
    }

    pub fn with_token(token: &str) -> Self {
        Self {
            tokens: vec![token.to_owned()],
            ..Self::default()
        }
    }
}

/// A running `openshell-gateway serve` with its own data directory.
pub struct Gateway {
    child: Option<Child>,
    options: GatewayOptions,
    /// `http://127.0.0.1:PORT` (or https).
    pub url: String,
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    data: tempfile::TempDir,
}

const READY_WAIT: Duration = Duration::from_secs(30);

impl Gateway {
    pub fn start(options: GatewayOptions) -> Self {
        let data = tempfile::Builder::new()
            .prefix("openshell-gw-")
            .tempdir()
            .expect("temp dir");
        let mut gateway = Self {
            child: None,
            options,
            url: String::new(),
            grpc_addr: "127.0.0.1:0".parse().unwrap(),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            data,
        };
        let listen = gateway
            .options
            .listen
            .unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
        gateway.spawn(listen);
        gateway
    }

    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The `--data-dir` of the gateway: store and sandbox directories.
    pub fn store_dir(&self) -> PathBuf {
        self.options
            .data_dir
            .clone()
            .unwrap_or_else(|| self.data.path().join("data"))
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn spawn(&mut self, listen: SocketAddr) {
        let ready = self.data.path().join("ready.json");
        let _ = std::fs::remove_file(&ready);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.path().join("gateway.log"))
            .expect("gateway log");
        let mut cmd = match self.options.launcher.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(bin("openshell-gateway"));
                cmd
            }
            None => Command::new(bin("openshell-gateway")),
        };
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--metrics-listen")
            .arg(SocketAddr::new(listen.ip(), 0).to_string())
            .arg("--data-dir")
            .arg(self.store_dir())
            .arg("--ready-file")
            .arg(&ready)
            .arg("--supervisor-bin")
            .arg(bin("openshell-supervisor"))
            // Tests act as supervisors with these tokens (a test-only flag).
            .arg("--expose-sandbox-tokens")
            .env_remove("OPENSHELL_GATEWAY_TOKENS")
            .env_remove("OPENSHELL_DATABASE_URL")
            .env_remove("OPENSHELL_PEER_TOKEN")
            .env_remove("OPENSHELL_CONFIG_DELIVERY_MODE")
            .env(
                "RUST_LOG",
                std::env::var("OPENSHELL_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if self.options.dev {
            cmd.arg("--dev");
        }
        for token in &self.options.tokens {
            cmd.arg("--token").arg(token);
        }
        if let Some((cert, key)) = &self.options.tls {
            cmd.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
        }
        if let Some(ca) = &self.options.supervisor_ca {
            cmd.arg("--supervisor-ca").arg(ca);
        }
        if let Some(id) = &self.options.replica_id {
            cmd.arg("--replica-id").arg(id);
        }
        if let Some(url) = &self.options.database_url {
            cmd.env("OPENSHELL_DATABASE_URL", url);
        }
        if let Some(token) = &self.options.peer_token {
            cmd.env("OPENSHELL_PEER_TOKEN", token);
        }
        cmd.envs(self.options.env.iter().map(|(k, v)| (k, v)));
        if let Some(url) = &self.options.supervisor_url {
            cmd.arg("--supervisor-url").arg(url);
        }
        if !self
            .options
            .extra_args
            .iter()
            .any(|a| a == "--allow-test-flags")
        {
            cmd.arg("--allow-test-flags");
        }
        cmd.args(&self.options.extra_args);
        let mut child = cmd.spawn().expect("start openshell-gateway");
        let started = Instant::now();
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let info: serde_json::Value = serde_json::from_str(&text).expect("ready file JSON");
                self.grpc_addr = info["grpc"].as_str().unwrap().parse().unwrap();
                self.metrics_addr = info["metrics"].as_str().unwrap().parse().unwrap();
                self.url = info["url"].as_str().unwrap().to_owned();
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "openshell-gateway exited early ({status}); log:\n{}",
                    self.log()
                );
            }
            assert!(
                started.elapsed() < READY_WAIT,
                "openshell-gateway not ready after {READY_WAIT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }

    /// The gateway's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("gateway.log")).unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL after 10 s. Supervisors keep running.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILL: a crash, no shutdown sequence.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Replaces the further `serve` arguments used by the next
    /// [`restart`](Self::restart) (for example another
    /// `--config-delivery-mode`).
    pub fn set_extra_args(&mut self, args: Vec<String>) {
        self.options.extra_args = args;
    }

    /// Starts the gateway again on the same address and data directory.
    pub fn restart(&mut self) {
        self.stop();
        let addr = self.grpc_addr;
        self.spawn(addr);
    }

    /// PIDs of the supervisors this gateway's driver started.
    pub fn supervisor_pids(&self) -> Vec<i32> {
        let dir = self.store_dir().join("sandboxes");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_to_string(e.path().join("supervisor.pid")).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        http_get(self.metrics_addr, "/metrics")
    }

    /// Value of one sample, for example
    /// `openshell_server_requests_total{method="Health",code="ok"}`.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        metric_value(&self.metrics(), sample)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let supervisors = self.supervisor_pids();
        self.kill();
        for pid in &supervisors {
            signal(*pid, libc::SIGTERM);
        }
        let started = Instant::now();
        while supervisors.iter().any(|p| is_running(*p))
            && started.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for pid in supervisors {
            if is_running(pid) {
                signal(-pid, libc::SIGKILL);
            }
        }
    }
}

/// Reads one sample's value from Prometheus text.
pub fn metric_value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}

/// A port free on loopback a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET path` on `addr` (HTTP/1.1, 5 s timeouts).
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("metrics connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("metrics read");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    // Chunked or not, the samples are plain lines.
    body.to_owned()
}

pub fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The threads of `pid` (`Threads:` of `/proc/PID/status`); 0 once it is
/// gone.
pub fn threads(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Alive and not a zombie.
pub fn is_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Waits up to `limit` for `check`, polling every 20 ms.
pub fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// The token of sandbox `sandbox_id`, from a gateway started with
/// `--expose-sandbox-tokens` (every gateway testkit starts is): tests use it
/// to act as the sandbox's supervisor.
pub fn sandbox_token(store_dir: &Path, sandbox_id: &str) -> Option<String> {
    let path = store_dir.join("sandboxes").join(sandbox_id).join("token");
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_owned())
}

/// Host pids of the processes whose environment holds `key=value`: how
/// tests find a sandbox's processes (give the exec a unique marker
/// variable), never by a pid the sandbox reports about itself, which is a
/// pid of its own namespace.
pub fn pids_with_env(key: &str, value: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| process_env(*pid, key).as_deref() == Some(value) && is_running(*pid))
        .collect()
}

/// A unique value for [`pids_with_env`].
pub fn marker() -> String {
    format!("m{:032x}", rand::random::<u128>())
}

/// A value from a process's environment.
pub fn process_env(pid: i32, key: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        entry
            .strip_prefix(key)?
            .strip_prefix('=')
            .map(str::to_owned)
    })
}

/// Async form of [`wait_until`], for tests on a tokio runtime: it yields
/// between checks so the runtime's connection tasks keep running.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// Issues the token of shared supervisor host `host_id` in the store under
/// `data_dir` with the real `openshell-gateway host-token` and returns it.
pub fn issue_host_token(data_dir: &Path, host_id: &str) -> String {
    run_host_token(data_dir, None, host_id)
}

/// [`issue_host_token`] for replicas on a database server (`database_url`,
/// passed in the environment as an operator would); the token file goes
/// into `dir`.
pub fn issue_host_token_in_database(database_url: &str, dir: &Path, host_id: &str) -> String {
    run_host_token(dir, Some(database_url), host_id)
}

fn run_host_token(dir: &Path, database_url: Option<&str>, host_id: &str) -> String {
    let out = dir.join(format!("{host_id}.host-token"));
    let mut command = std::process::Command::new(bin("openshell-gateway"));
    command.arg("host-token");
    match database_url {
        Some(url) => {
            command.env("OPENSHELL_DATABASE_URL", url);
        }
        None => {
            command
                .arg("--data-dir")
                .arg(dir)
                .env_remove("OPENSHELL_DATABASE_URL");
        }
    }
    let output = command
        .args(["--host-id", host_id])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run openshell-gateway host-token");
    assert!(
        output.status.success(),
        "host-token failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token = std::fs::read_to_string(&out).expect("host token file");
    let token = token.trim().to_owned();
    // What it prints names the file, never the token.
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(!printed.contains(&token), "host-token printed the token");
    token
}

//! Multi-replica test clusters: several `openshell-gateway serve` replicas
//! sharing one store (an SQLite file in a shared directory, or a real
//! PostgreSQL server started here), plus a mirror of the placement ring so
//! tests can say which replica should own a sandbox.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::{Gateway, GatewayOptions, is_running, signal};

/// The replica the ring places `key` on (PROTOCOL.md section 6), mirrored
/// here so tests do not depend on the gateway's private ring.
pub fn ring_owner(replicas: &[&str], key: &str) -> String {
    let point = |k: &str| {
        let digest = Sha256::digest(k.as_bytes());
        u64::from_be_bytes(digest[..8].try_into().unwrap())
    };
    let mut points: Vec<(u64, &str)> = replicas
        .iter()
        .flat_map(|r| (0..128).map(move |n| (point(&format!("{r}#{n}")), *r)))
        .collect();
    points.sort();
    let target = point(key);
    let index = points.partition_point(|(p, _)| *p < target) % points.len();
    points[index].1.to_owned()
}

/// Settings for a test cluster.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    pub replicas: usize,
    /// `None`: a shared SQLite file.
    pub database_url: Option<String>,
    pub tokens: Vec<String>,
    /// Extra `serve` arguments for every replica.
    pub extra_args: Vec<String>,
    /// URL supervisors dial (default: replica gw-0).
    pub supervisor_url: Option<String>,
    /// `(replica index, launcher)`: start that replica through a command
    /// (see [`GatewayOptions::launcher`]).
    pub launcher: Option<(usize, Vec<String>)>,
}

/// Replicas `gw-0..gw-N` of one cluster.
pub struct TestCluster {
    pub replicas: Vec<Gateway>,
    pub peer_token: String,
    options: ClusterOptions,
    shared: tempfile::TempDir,
}

impl TestCluster {
    pub fn start(options: ClusterOptions) -> Self {
        let shared = tempfile::Builder::new()
            .prefix("openshell-cluster-")
            .tempdir()
            .expect("temp dir");
        let peer_token = format!("peer-{}", std::process::id());
        let mut cluster = Self {
            replicas: Vec::new(),
            peer_token,
            options: options.clone(),
            shared,
        };
        for _ in 0..options.replicas {
            cluster.add_replica();
        }
        cluster
    }

    /// Starts one more replica, `gw-N` with N the number started so far,
    /// with the cluster's options (a rolling update with surge starts the
    /// new replica before it stops an old one). Returns its id.
    pub fn add_replica(&mut self) -> String {
        let index = self.replicas.len();
        let options = &self.options;
        let supervisor_url = options
            .supervisor_url
            .clone()
            .or_else(|| self.replicas.first().map(|g| g.url.clone()));
        let gateway = Gateway::start(GatewayOptions {
            tokens: options.tokens.clone(),
            replica_id: Some(format!("gw-{index}")),
            data_dir: Some(self.shared.path().join("data")),
            database_url: options.database_url.clone(),
            peer_token: Some(self.peer_token.clone()),
            supervisor_url,
            extra_args: options.extra_args.clone(),
            launcher: options
                .launcher
                .as_ref()
                .filter(|(i, _)| *i == index)
                .map(|(_, launcher)| launcher.clone())
                .unwrap_or_default(),
            ..GatewayOptions::default()
        });
        self.replicas.push(gateway);
        format!("gw-{index}")
    }

    /// Ids of the replicas that are running (not stopped or killed).
    pub fn live_ids(&self) -> Vec<String> {
        self.ids()
            .into_iter()
            .zip(&self.replicas)
            .filter(|(_, gw)| gw.pid().is_some())
            .map(|(id, _)| id)
            .collect()
    }

    pub fn replica(&self, id: &str) -> &Gateway {
        let index: usize = id
            .trim_start_matches("gw-")
            .parse()
            .expect("replica id gw-N");
        &self.replicas[index]
    }

    pub fn replica_mut(&mut self, id: &str) -> &mut Gateway {
        let index: usize = id
            .trim_start_matches("gw-")
            .parse()
            .expect("replica id gw-N");
        &mut self.replicas[index]
    }

    pub fn ids(&self) -> Vec<String> {
        (0..self.replicas.len())
            .map(|i| format!("gw-{i}"))
            .collect()
    }

    pub fn shared_dir(&self) -> &Path {
        self.shared.path()
    }
}

/// A real PostgreSQL server on a loopback port, in its own data directory,
/// stopped by its PID when dropped.
pub struct Postgres {
    child: Option<Child>,
    pub port: u16,
    /// The address it listens on (`listen_addresses`).
    host: std::net::Ipv4Addr,
    /// The command prefix it runs through (a lab host's launcher).
    launcher: Vec<String>,
    /// The `postgres` role's password: TCP connections authenticate with
    /// SCRAM, as in a real deployment (sandboxes share the host's loopback).
    password: String,
    dir: tempfile::TempDir,
}

fn postgres_bin(name: &str) -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql: install postgresql (make test does)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join(name).exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .unwrap_or_else(|| {
            panic!("no PostgreSQL `{name}` found: install postgresql (make test does)")
        })
        .join(name)
}

/// Runs a PostgreSQL tool as the `postgres` user when we are root (the
/// server refuses to run as root).
fn as_postgres(program: &Path) -> Command {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    if root {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
            .arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

impl Postgres {
    pub fn start() -> Self {
        Self::start_in(&[], std::net::Ipv4Addr::LOCALHOST)
    }

    /// A server listening on `host`, run through `launcher` (a lab host's,
    /// see [`crate::lab::Lab::launcher`]; empty: none).
    pub fn start_in(launcher: &[String], host: std::net::Ipv4Addr) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("openshell-pg-")
            .tempdir()
            .expect("temp dir");
        // The server runs as `postgres` and must own its directory.
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } == 0 {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success());
        }
        let data = dir.path().join("pgdata");
        let password = format!("pg{:032x}", rand::random::<u128>());
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, &password).unwrap();
        // SAFETY: getuid has no preconditions.
        if unsafe { libc::getuid() } == 0 {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&pwfile)
                .status()
                .expect("chown");
            assert!(status.success());
        }
        let init = as_postgres(&postgres_bin("initdb"))
            .arg("-D")
            .arg(&data)
            // Only the socket in the test's own directory trusts; loopback
            // TCP (what the gateway uses) needs the password.
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run initdb");
        assert!(
            init.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        std::fs::remove_file(&pwfile).unwrap();
        if !host.is_loopback() {
            // initdb admits loopback only; peers on the host's /24 (a lab's
            // other hosts) authenticate with the password too.
            let [a, b, c, _] = host.octets();
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))
                .expect("pg_hba.conf");
            use std::io::Write as _;
            writeln!(hba, "host all all {a}.{b}.{c}.0/24 scram-sha-256").unwrap();
        }
        let mut pg = Self {
            child: None,
            port: crate::free_port(),
            host,
            launcher: launcher.to_vec(),
            password,
            dir,
        };
        pg.spawn();
        pg
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("postgres.log"))
            .unwrap();
        let mut command = match self.launcher.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args);
                command
            }
            None => Command::new("env"),
        };
        // `setpriv` (as_postgres) runs inside the launcher, so the server's
        // pid is the child's.
        let server = as_postgres(&postgres_bin("postgres"));
        command
            .arg(server.get_program())
            .args(server.get_args())
            .arg("-D")
            .arg(self.dir.path().join("pgdata"))
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(self.dir.path())
            .args(["-c", &format!("listen_addresses={}", self.host)])
            .args(["-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(command.spawn().expect("start postgres"));
        self.wait_ready();
    }

    /// Stops the server at once (SIGQUIT: no checkpoint, as a crash of its
    /// host leaves it), on the next [`Postgres::start_again`] it recovers.
    pub fn stop_immediately(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id() as i32, libc::SIGQUIT);
            let _ = child.wait();
        }
    }

    /// Starts a stopped server again on the same data, address and port.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "postgres is still running");
        self.spawn();
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            let ready = as_postgres(&postgres_bin("pg_isready"))
                .arg("-h")
                .arg(self.dir.path())
                .args(["-p", &self.port.to_string(), "-q"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ready {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("postgres exited ({status}): {}", self.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "postgres not ready: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{}@{}:{}/postgres",
            self.password, self.host, self.port
        )
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// `psql` connected to this server as `postgres` over its private
    /// socket, quiet and unaligned (`-qtA`), stopping at the first error:
    /// tests use it to hold locks or look at `pg_stat_activity`. Add `-c SQL`
    /// or a script on stdin.
    pub fn psql(&self) -> Command {
        let mut cmd = as_postgres(&postgres_bin("psql"));
        cmd.arg("-h")
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-X", "-qtA"])
            .args(["-v", "ON_ERROR_STOP=1"]);
        cmd
    }

    /// The postmaster and its backends (each connection has its own process).
    fn server_processes(&self) -> Vec<i32> {
        let root = self.pid();
        let mut pids = vec![root];
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<i32>().ok());
                if ppid == Some(root) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// Freezes the whole server (SIGSTOP to the postmaster and every
    /// backend): calls hang instead of failing. The postmaster stops first,
    /// so no backend is forked after the list of its children is read (a
    /// backend forked between reading the list and stopping the postmaster
    /// kept answering, and the database never hung).
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
        for pid in self.server_processes() {
            signal(pid, libc::SIGSTOP);
        }
    }

    pub fn resume(&self) {
        for pid in self.server_processes() {
            signal(pid, libc::SIGCONT);
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            let pid = child.id() as i32;
            self.child = Some(child);
            self.resume();
            let mut child = self.child.take().unwrap();
            // SIGINT: fast shutdown.
            signal(pid, libc::SIGINT);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if is_running(pid) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

//! A real local cluster for a user's own tests (feature `testing`): the
//! reference gateway's developer cluster (`openshell-gateway up`) started
//! on a free port and a fresh data directory, and faults on demand.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use openshell_sdk::testing::{LocalCluster, LocalClusterOptions};
//!
//! let cluster = LocalCluster::start(LocalClusterOptions::new().replicas(3)).await?;
//! let client = cluster.client().await?;
//! // ... create sandboxes, run execs ...
//! cluster.kill_replica("gw-1").await?; // SIGKILL; down until start_replica
//! cluster.start_replica("gw-1").await?;
//! cluster.stop().await?;
//! # drop(client);
//! # Ok(())
//! # }
//! ```
//!
//! The cluster is `up`'s: its replicas, edge and (with `hosts`) supervisor
//! hosts are `up`'s children, and every fault is an order on `up`'s
//! standard input (`up --control stdin`), carried out by the same
//! supervision that keeps `make up` serving. When that input closes (a
//! clean [`LocalCluster::stop`], the drop, or the test process dying, even
//! by SIGKILL) `up` stops every process it started, by PID.
//!
//! The executable is found in `OPENSHELL_GATEWAY_BIN`, else as
//! `openshell-gateway` on `PATH` (its `openshell-supervisor` beside it);
//! [`LocalClusterOptions::gateway_bin`] overrides both. Logs are under the
//! data directory, removed after a clean stop and kept (their path in the
//! error, or printed on a drop while panicking) otherwise.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Mutex, mpsc};

use crate::client::{CallOptions, Client};
use crate::config::ClientConfig;

/// How long a cluster gets to print its banner.
const START_WITHIN: Duration = Duration::from_secs(120);
/// How long one fault order may take (a replica start waits until it
/// serves).
const ORDER_WITHIN: Duration = Duration::from_secs(90);
/// How long `up` gets to stop everything once its input closed.
const STOP_WITHIN: Duration = Duration::from_secs(60);
/// The variable naming the gateway executable.
pub const GATEWAY_BIN_ENV: &str = "OPENSHELL_GATEWAY_BIN";

/// A `cluster` error ([`crate::Error::Cluster`]), with the logs' directory
/// when it is kept.
fn failure(message: impl Into<String>, logs: Option<&Path>) -> crate::Error {
    crate::Error::Cluster {
        message: message.into(),
        logs: logs.map(Path::to_owned),
    }
}

/// How to start a [`LocalCluster`].
#[derive(Debug, Clone)]
pub struct LocalClusterOptions {
    replicas: usize,
    hosts: u32,
    config_delivery: String,
    isolation: String,
    restart: bool,
    gateway_bin: Option<PathBuf>,
}

impl Default for LocalClusterOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            hosts: 0,
            config_delivery: "push".into(),
            isolation: "auto".into(),
            restart: false,
            gateway_bin: None,
        }
    }
}

impl LocalClusterOptions {
    /// Three replicas, no shared hosts, push config delivery, isolation
    /// `auto`, and a process that dies unasked stays down.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of replicas (`gw-0`..), at least 1.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// Shared supervisor hosts (`h-0`..); 0 runs one supervisor process per
    /// sandbox.
    pub fn hosts(mut self, hosts: u32) -> Self {
        self.hosts = hosts;
        self
    }

    /// `push` or `poll`.
    pub fn config_delivery(mut self, mode: impl Into<String>) -> Self {
        self.config_delivery = mode.into();
        self
    }

    /// `auto`, `namespaces` or `none` (see the gateway's `--isolation`).
    pub fn isolation(mut self, isolation: impl Into<String>) -> Self {
        self.isolation = isolation.into();
        self
    }

    /// Whether a process that dies without being told to is started again
    /// (`up --restart always`); off by default, so a test sees a crash.
    pub fn restart_crashed(mut self, restart: bool) -> Self {
        self.restart = restart;
        self
    }

    /// The `openshell-gateway` executable to run.
    pub fn gateway_bin(mut self, path: impl Into<PathBuf>) -> Self {
        self.gateway_bin = Some(path.into());
        self
    }
}

/// One fault order, for callers that choose the fault at run time (the
/// bindings); [`LocalCluster::fault`] carries it out. Each is also a method
/// of its own ([`LocalCluster::kill_replica`], ...).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// [`LocalCluster::stop_replica`].
    StopReplica(String),
    /// [`LocalCluster::kill_replica`].
    KillReplica(String),
    /// [`LocalCluster::start_replica`].
    StartReplica(String),
    /// [`LocalCluster::cut_route`].
    CutRoute(String),
    /// [`LocalCluster::restore_route`].
    RestoreRoute(String),
    /// [`LocalCluster::restart_edge`].
    RestartEdge,
    /// [`LocalCluster::kill_host`].
    KillHost(String),
    /// [`LocalCluster::start_host`].
    StartHost(String),
    /// [`LocalCluster::slow_store`].
    SlowStore(Duration),
    /// [`LocalCluster::cut_store`].
    CutStore,
    /// [`LocalCluster::restore_store`].
    RestoreStore,
}

/// The gateway executable: the option, `OPENSHELL_GATEWAY_BIN`, then `PATH`.
pub fn find_gateway(explicit: Option<&Path>) -> crate::Result<PathBuf> {
    let named = explicit
        .map(Path::to_owned)
        .or_else(|| std::env::var_os(GATEWAY_BIN_ENV).map(PathBuf::from));
    if let Some(path) = named {
        return match path.is_file() {
            true => Ok(path),
            false => Err(failure(
                format!("the gateway executable {} does not exist", path.display()),
                None,
            )),
        };
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("openshell-gateway"))
            .find(|candidate| candidate.is_file())
    });
    found.ok_or_else(|| {
        failure(
            format!(
                "openshell-gateway not found: set {GATEWAY_BIN_ENV} to its path or put it on \
                 PATH (it ships with the SDK packages; in a checkout, `cargo build --bins` \
                 builds it under target/debug)"
            ),
            None,
        )
    })
}

/// The orders' side of `up`: its input, and the lines it prints.
struct Control {
    input: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// `up` itself; `None` once stopped.
    child: Option<Child>,
}

/// A running local cluster; see the module docs.
pub struct LocalCluster {
    endpoint: String,
    data_dir: PathBuf,
    replicas: Vec<String>,
    hosts: Vec<String>,
    control: Mutex<Control>,
}

impl LocalCluster {
    /// Starts the cluster and waits until it serves (every host holding
    /// its session, with `hosts`).
    pub async fn start(options: LocalClusterOptions) -> crate::Result<LocalCluster> {
        if options.replicas == 0 {
            return Err(crate::Error::invalid_config("replicas must be at least 1"));
        }
        if !matches!(options.config_delivery.as_str(), "push" | "poll") {
            return Err(crate::Error::invalid_config(format!(
                "config_delivery must be \"push\" or \"poll\", not {:?}",
                options.config_delivery
            )));
        }
        if !matches!(options.isolation.as_str(), "auto" | "namespaces" | "none") {
            return Err(crate::Error::invalid_config(format!(
                "isolation must be \"auto\", \"namespaces\" or \"none\", not {:?}",
                options.isolation
            )));
        }
        let bin = find_gateway(options.gateway_bin.as_deref())?;
        // The edge's port is picked free a moment before `up` binds it;
        // another socket taking it meanwhile is tried again elsewhere.
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(&bin, &options).await {
                Ok(cluster) => return Ok(cluster),
                Err(err) if err.message().contains("a port was in use") => {
                    if let Some(dir) = err.logs() {
                        let _ = std::fs::remove_dir_all(dir);
                    }
                    last = Some(err);
                }
                Err(err) => return Err(err),
            }
        }
        Err(last.expect("three tries"))
    }

    async fn try_start(bin: &Path, options: &LocalClusterOptions) -> crate::Result<LocalCluster> {
        let data_dir =
            std::env::temp_dir().join(format!("openshell-cluster-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&data_dir)
            .map_err(|err| failure(format!("creating {}: {err}", data_dir.display()), None))?;
        let port =
            free_port().map_err(|err| failure(format!("finding a free port: {err}"), None))?;
        let up_log = std::fs::File::create(data_dir.join("up.log"))
            .map_err(|err| failure(format!("creating up.log: {err}"), None))?;
        let mut child = Command::new(bin)
            .arg("up")
            .args(["--replicas", &options.replicas.to_string()])
            .args(["--hosts", &options.hosts.to_string()])
            .args(["--config-delivery-mode", &options.config_delivery])
            .args(["--isolation", &options.isolation])
            .args([
                "--restart",
                if options.restart { "always" } else { "never" },
            ])
            .args(["--control", "stdin"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(up_log)
            .kill_on_drop(false)
            .spawn()
            .map_err(|err| failure(format!("starting {}: {err}", bin.display()), None))?;
        let (tx, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("piped");
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut control = Control {
            input: child.stdin.take(),
            lines,
            child: None,
        };
        let banner = match wait_banner(&mut child, &mut control).await {
            Ok(banner) => banner,
            Err(why) => {
                // Closing the input stops whatever did start.
                drop(control);
                let _ = tokio::time::timeout(STOP_WITHIN, child.wait()).await;
                let _ = child.start_kill();
                let log = std::fs::read_to_string(data_dir.join("up.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                let taken = match port_taken(&data_dir) {
                    true => "; a port was in use",
                    false => "",
                };
                return Err(failure(
                    format!(
                        "the local cluster did not start: {why}{taken}; logs in {} ({})",
                        data_dir.display(),
                        tail.join(" | ")
                    ),
                    Some(&data_dir),
                ));
            }
        };
        let named = |prefix: &str| -> Vec<String> {
            banner
                .iter()
                .filter_map(|l| l.trim_start().split(':').next())
                .filter(|name| name.starts_with(prefix))
                .map(str::to_owned)
                .collect()
        };
        control.child = Some(child);
        Ok(LocalCluster {
            endpoint: format!("http://127.0.0.1:{port}"),
            replicas: named("gw-"),
            hosts: named("h-"),
            data_dir,
            control: Mutex::new(control),
        })
    }

    /// The edge's URL: what clients and supervisors dial.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The cluster's data directory (store, sandboxes, logs under `up/`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The replica ids, `gw-0`.. in order.
    pub fn replica_ids(&self) -> &[String] {
        &self.replicas
    }

    /// The shared host ids, `h-0`.. in order (empty without hosts).
    pub fn host_ids(&self) -> &[String] {
        &self.hosts
    }

    /// A client of the edge with owner routing (the defaults), no token.
    pub async fn client(&self) -> crate::Result<Client> {
        Client::connect(ClientConfig::builder(self.endpoint.clone()).build()?).await
    }

    /// The replica holding `sandbox`'s supervisor session, as the gateway
    /// reports it (`None`: no replica holds it now, or one replica).
    pub async fn owner_of(&self, sandbox: &str) -> crate::Result<Option<String>> {
        let client = self.client().await?;
        let (_, owner) = client
            .sandboxes()
            .get_with_owner(sandbox, CallOptions::new())
            .await?;
        Ok(owner)
    }

    /// SIGTERM to a replica (its sessions are redirected to the others);
    /// it stays down until [`LocalCluster::start_replica`].
    pub async fn stop_replica(&self, id: &str) -> crate::Result<()> {
        self.order("stop", self.replica(id)?).await
    }

    /// SIGKILL to a replica; it stays down until
    /// [`LocalCluster::start_replica`].
    pub async fn kill_replica(&self, id: &str) -> crate::Result<()> {
        self.order("kill", self.replica(id)?).await
    }

    /// Starts a stopped or killed replica again, on its old ports; returns
    /// once it serves.
    pub async fn start_replica(&self, id: &str) -> crate::Result<()> {
        self.order("start", self.replica(id)?).await
    }

    /// Stops the edge and starts it again: every connection through it
    /// (clients', supervisors', hosts') breaks and is dialled anew.
    pub async fn restart_edge(&self) -> crate::Result<()> {
        self.order("restart", "edge").await
    }

    /// The edge loses its route to replica `id`: a call hinted to it is
    /// answered "not forwarded" (the SDK retries it once unhinted), and
    /// unhinted calls go to the other replicas. Streams already open keep
    /// running. Supervisors reach their replica through the edge too, so
    /// the sandboxes `id` owns get no new relays until the route is back.
    pub async fn cut_route(&self, id: &str) -> crate::Result<()> {
        self.order("cut-route", self.replica(id)?).await
    }

    /// Gives the edge its route to replica `id` back.
    pub async fn restore_route(&self, id: &str) -> crate::Result<()> {
        self.order("restore-route", self.replica(id)?).await
    }

    /// SIGKILL to a shared host (its sandboxes lose their supervisor); it
    /// stays down until [`LocalCluster::start_host`].
    pub async fn kill_host(&self, id: &str) -> crate::Result<()> {
        self.order("kill", self.host(id)?).await
    }

    /// Starts a killed host again.
    pub async fn start_host(&self, id: &str) -> crate::Result<()> {
        self.order("start", self.host(id)?).await
    }

    /// Every replica's store calls wait `delay` first (a slow database),
    /// until [`LocalCluster::restore_store`]; a delay past a call's
    /// deadline (5 s) makes it fail `unavailable`.
    pub async fn slow_store(&self, delay: Duration) -> crate::Result<()> {
        self.order("slow-store", &delay.as_millis().to_string())
            .await
    }

    /// The store stops answering (a frozen or unreachable database): every
    /// call that needs it fails `unavailable` after its deadline (5 s),
    /// naming the store, until [`LocalCluster::restore_store`].
    pub async fn cut_store(&self) -> crate::Result<()> {
        self.order("cut-store", "").await
    }

    /// Ends [`LocalCluster::slow_store`] and [`LocalCluster::cut_store`].
    pub async fn restore_store(&self) -> crate::Result<()> {
        self.order("restore-store", "").await
    }

    /// Carries out one [`Fault`].
    pub async fn fault(&self, fault: Fault) -> crate::Result<()> {
        match fault {
            Fault::StopReplica(id) => self.stop_replica(&id).await,
            Fault::KillReplica(id) => self.kill_replica(&id).await,
            Fault::StartReplica(id) => self.start_replica(&id).await,
            Fault::CutRoute(id) => self.cut_route(&id).await,
            Fault::RestoreRoute(id) => self.restore_route(&id).await,
            Fault::RestartEdge => self.restart_edge().await,
            Fault::KillHost(id) => self.kill_host(&id).await,
            Fault::StartHost(id) => self.start_host(&id).await,
            Fault::SlowStore(delay) => self.slow_store(delay).await,
            Fault::CutStore => self.cut_store().await,
            Fault::RestoreStore => self.restore_store().await,
        }
    }

    fn replica<'a>(&self, id: &'a str) -> crate::Result<&'a str> {
        match self.replicas.iter().any(|r| r == id) {
            true => Ok(id),
            false => Err(crate::Error::invalid_config(format!(
                "no replica {id:?}: the replicas are {:?}",
                self.replicas
            ))),
        }
    }

    fn host<'a>(&self, id: &'a str) -> crate::Result<&'a str> {
        match self.hosts.iter().any(|h| h == id) {
            true => Ok(id),
            false => Err(crate::Error::invalid_config(format!(
                "no host {id:?}: the hosts are {:?}",
                self.hosts
            ))),
        }
    }

    /// One order to `up`, answered once it is carried out.
    async fn order(&self, verb: &str, name: &str) -> crate::Result<()> {
        let mut control = self.control.lock().await;
        let logs = Some(self.data_dir.as_path());
        let Some(input) = control.input.as_mut() else {
            return Err(failure("the cluster is stopped", None));
        };
        let line = format!("{verb} {name}").trim_end().to_owned() + "\n";
        let sent = async {
            input.write_all(line.as_bytes()).await?;
            input.flush().await
        };
        sent.await
            .map_err(|err| failure(format!("the cluster is gone: {err}"), logs))?;
        let deadline = Instant::now() + ORDER_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = match tokio::time::timeout(left, control.lines.recv()).await {
                Ok(Some(line)) => line,
                Ok(None) => return Err(failure("the cluster exited", logs)),
                Err(_) => {
                    return Err(failure(
                        format!("{verb} {name}: no answer within {ORDER_WITHIN:?}"),
                        logs,
                    ));
                }
            };
            if line.starts_with("control: ok ") {
                return Ok(());
            }
            if let Some(why) = line.strip_prefix("control: error ") {
                return Err(failure(format!("{verb} {name}: {why}"), None));
            }
        }
    }

    /// Stops every process of the cluster (hosts, then the edge and the
    /// replicas, then the sandbox supervisors) and removes the data
    /// directory. Fails, keeping the directory, if `up` did not stop
    /// cleanly.
    pub async fn stop(self) -> crate::Result<()> {
        self.close().await
    }

    /// [`LocalCluster::stop`] through a shared reference, for holders that
    /// cannot give the cluster up (a binding's handle): later orders fail
    /// with "the cluster is stopped", a second close does nothing.
    pub async fn close(&self) -> crate::Result<()> {
        let mut control = self.control.lock().await;
        control.input = None;
        let Some(mut child) = control.child.take() else {
            return Ok(());
        };
        let status = tokio::time::timeout(STOP_WITHIN, child.wait()).await;
        match status {
            Ok(Ok(status)) if status.success() => {
                let _ = std::fs::remove_dir_all(&self.data_dir);
                Ok(())
            }
            Ok(Ok(status)) => Err(failure(
                format!(
                    "the cluster ended {status}; logs in {}",
                    self.data_dir.display()
                ),
                Some(&self.data_dir),
            )),
            Ok(Err(err)) => Err(failure(format!("waiting for up: {err}"), None)),
            Err(_) => {
                let _ = child.start_kill();
                Err(failure(
                    format!(
                        "the cluster did not stop within {STOP_WITHIN:?}; logs in {}",
                        self.data_dir.display()
                    ),
                    Some(&self.data_dir),
                ))
            }
        }
    }
}

impl Drop for LocalCluster {
    /// Closes `up`'s input (it stops everything) and waits for it, at most
    /// 60 s, on this thread: a test that ends leaves nothing running. The
    /// data directory goes unless the thread is panicking.
    fn drop(&mut self) {
        let control = self.control.get_mut();
        control.input = None;
        let Some(mut child) = control.child.take() else {
            return;
        };
        let started = Instant::now();
        let mut clean = false;
        while started.elapsed() < STOP_WITHIN {
            match child.try_wait() {
                Ok(Some(status)) => {
                    clean = status.success();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(_) => break,
            }
        }
        if std::thread::panicking() || !clean {
            eprintln!(
                "openshell local cluster logs kept in {}",
                self.data_dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

/// Reads `up`'s output until its banner; the banner's lines.
async fn wait_banner(child: &mut Child, control: &mut Control) -> Result<Vec<String>, String> {
    let deadline = Instant::now() + START_WITHIN;
    let mut banner = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, control.lines.recv()).await {
            Ok(Some(line)) => {
                let done = line.contains(" serving http://");
                banner.push(line);
                if done {
                    return Ok(banner);
                }
            }
            Ok(None) => {
                let status = child
                    .wait()
                    .await
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                return Err(format!("up exited ({status})"));
            }
            Err(_) => return Err(format!("no banner within {START_WITHIN:?}")),
        }
    }
}

/// Whether a process of a failed start could not bind its port.
fn port_taken(data_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(data_dir.join("up")) else {
        return false;
    };
    entries.flatten().any(|entry| {
        entry.path().extension().is_some_and(|e| e == "log")
            && std::fs::read_to_string(entry.path())
                .is_ok_and(|text| text.contains("Address already in use"))
    })
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

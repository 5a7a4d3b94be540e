//! `openshell-bench hosts`: what 100 sandboxes cost on the supervisor side,
//! one supervisor per sandbox against a few shared supervisor hosts.
//!
//! Two `openshell-gateway up` clusters, one after the other in one run, each
//! with one replica behind the edge and `--isolation namespaces` (every
//! sandbox gets its own user, mount and PID namespaces, so its init helper
//! and PID 1 are part of the bill):
//!
//! 1. per-sandbox mode (the default): N sandboxes, N supervisor processes;
//! 2. `up --hosts H`: the same N sandboxes served by H host processes.
//!
//! With every sandbox ready, one `true` exec proven in each and 12 s idle, the
//! proportional set size (`Pss:` of `/proc/PID/smaps_rollup`, shared pages
//! split between the processes that map them) of every process `up`
//! started, directly or not, is summed per role: replicas and the edge on
//! one side, everything else (supervisors or hosts, sandbox inits, sandbox
//! PID 1s) on the other. Prints both totals and their ratio; the target of
//! shared hosts is under a tenth. N: `OPENSHELL_BENCH_HOSTS_SANDBOXES`
//! (default 100); H: `OPENSHELL_BENCH_HOSTS` (default 4);
//! `OPENSHELL_BENCH_HOST_THREADS` gives those hosts that many runtime
//! threads (`up --host-threads`; default: the host's own, one). Needs root
//! (the namespaces).
//!
//! Then a host's runtime threads: two one-host clusters side by side, one
//! with `up --host-threads 1` (the default) and one with 2, N/H sandboxes
//! each: each host's PSS, and iperf3 through the SDK's forward into one
//! sandbox of each (one stream and four; `iperf3 -s` in that sandbox's
//! network), in `OPENSHELL_BENCH_ROUNDS`
//! (default 5) interleaved rounds of `OPENSHELL_BENCH_FORWARD_SECONDS`
//! (default 3): medians and their ratio. Needs iperf3 too (`make bench`
//! installs it).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};
use openshell_testkit::{bin, threads};

use crate::scale::memory;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Summed PSS per role, in KiB, and the process counts.
#[derive(Debug, Default)]
struct Bill {
    gateway_kib: f64,
    gateway_processes: usize,
    sandbox_side_kib: f64,
    sandbox_side_processes: usize,
    /// Supervisor-side PSS by program and role (its first argument).
    kinds: std::collections::BTreeMap<String, (usize, f64, usize)>,
}

pub async fn run() {
    let sandboxes = env_count("OPENSHELL_BENCH_HOSTS_SANDBOXES", 100);
    let hosts = env_count("OPENSHELL_BENCH_HOSTS", 4);
    println!(
        "hosts benchmark: {sandboxes} idle sandboxes, --isolation namespaces, one replica behind the edge, PSS of every process the cluster started"
    );
    let per_sandbox = measure(sandboxes, None).await;
    report("one supervisor per sandbox", &per_sandbox, sandboxes);
    let shared = measure(sandboxes, Some(hosts)).await;
    report(&format!("{hosts} shared hosts"), &shared, sandboxes);
    println!(
        "  ratio hosts / per-sandbox (supervisor side, PSS): {:.3} (target < 0.100)",
        shared.sandbox_side_kib / per_sandbox.sandbox_side_kib
    );
    println!(
        "  ratio hosts / per-sandbox (every process, PSS): {:.3}",
        (shared.sandbox_side_kib + shared.gateway_kib)
            / (per_sandbox.sandbox_side_kib + per_sandbox.gateway_kib)
    );
    threads_comparison(sandboxes.div_ceil(hosts)).await;
}

fn report(label: &str, bill: &Bill, sandboxes: usize) {
    println!(
        "  {label}: supervisor side {:.1} MiB PSS in {} processes ({:.0} KiB per sandbox); replicas and edge {:.1} MiB in {} processes",
        bill.sandbox_side_kib / 1024.0,
        bill.sandbox_side_processes,
        bill.sandbox_side_kib / sandboxes as f64,
        bill.gateway_kib / 1024.0,
        bill.gateway_processes,
    );
    for (kind, (count, kib, threads)) in &bill.kinds {
        println!(
            "    {kind}: {count} processes ({threads} threads), {:.1} MiB PSS ({:.0} KiB each)",
            kib / 1024.0,
            kib / *count as f64
        );
    }
}

/// One `openshell-gateway up` cluster filled with idle sandboxes
/// (`mem-0`, `mem-1`, ...), each ready with one `true` exec proven in it.
struct Cluster {
    up: UpProcess,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start(sandboxes: usize, hosts: Option<usize>, host_threads: Option<u16>) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = crate::iperf::free_port();
        let mut up = Command::new(bin("openshell-gateway"));
        up.args(["up", "--replicas", "1", "--isolation", "namespaces"])
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        if let Some(hosts) = hosts {
            up.arg("--hosts").arg(hosts.to_string());
        }
        if let Some(threads) = host_threads {
            up.arg("--host-threads").arg(threads.to_string());
        }
        let log = std::fs::File::create(dir.path().join("up.log")).expect("up log");
        let mut up = UpProcess(
            up.stdin(Stdio::null())
                .stdout(log.try_clone().expect("up log"))
                .stderr(log)
                .spawn()
                .expect("starting openshell-gateway up"),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = connect(&url, &mut up.0, dir.path()).await;
        if hosts.is_some() {
            wait_for_hosts(&client).await;
        }
        fill(&client, sandboxes).await;
        Self {
            up,
            client,
            _dir: dir,
        }
    }
}

async fn fill(client: &Client, sandboxes: usize) {
    let permits = Arc::new(tokio::sync::Semaphore::new(8));
    let mut work = Vec::new();
    for i in 0..sandboxes {
        let (client, permits) = (client.clone(), permits.clone());
        work.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let name = format!("mem-{i}");
            client
                .sandboxes()
                .create(CreateSandbox::new().name(&name), CallOptions::new())
                .await
                .unwrap_or_else(|e| panic!("create {name}: {e}"));
            client
                .sandboxes()
                .wait_ready(&name, CallOptions::new().deadline(Duration::from_secs(120)))
                .await
                .unwrap_or_else(|e| panic!("{name} not ready: {e}"));
            let done = client
                .exec(ExecRequest::new(&name, ["true"]), CallOptions::new())
                .await
                .unwrap_or_else(|e| panic!("exec in {name}: {e}"));
            assert_eq!(done.exit_code, 0, "`true` in {name}");
        }));
    }
    for task in work {
        task.await.expect("sandbox task");
    }
}

/// Idle: start-up work done, tokio's blocking threads (config applies) gone
/// after their 10 s keep-alive, and freed heap pages given back.
const SETTLE: Duration = Duration::from_secs(12);

/// Starts a cluster, fills it, measures it, stops it.
async fn measure(sandboxes: usize, hosts: Option<usize>) -> Bill {
    let threads = hosts.and_then(|_| {
        std::env::var("OPENSHELL_BENCH_HOST_THREADS")
            .ok()?
            .parse()
            .ok()
    });
    let mut cluster = Cluster::start(sandboxes, hosts, threads).await;
    tokio::time::sleep(SETTLE).await;
    let bill = bill(cluster.up.0.id() as i32);
    cluster.up.stop();
    bill
}

/// A host's runtime threads: one (the default) against two workers. Two
/// one-host clusters run side by side with the same sandboxes; each host's
/// PSS, then forwards into one sandbox of each (the SDK's `forward` to an
/// `iperf3 -s`, one stream and four), in interleaved rounds.
async fn threads_comparison(sandboxes: usize) {
    const ARMS: [u16; 2] = [1, 2];
    let rounds = env_count("OPENSHELL_BENCH_ROUNDS", 5);
    let seconds = env_count("OPENSHELL_BENCH_FORWARD_SECONDS", 3) as u64;
    println!(
        "host runtime threads: two clusters side by side, one host each ({} and {} threads), {sandboxes} sandboxes each; forward: iperf3 through the SDK's forward (edge, replica, host), {rounds} rounds of {seconds} s, arms in random order",
        ARMS[0], ARMS[1]
    );
    let mut clusters = Vec::new();
    for threads in ARMS {
        clusters.push(Cluster::start(sandboxes, Some(1), Some(threads)).await);
    }
    tokio::time::sleep(SETTLE).await;
    for (cluster, threads) in clusters.iter().zip(ARMS) {
        let host = bill(cluster.up.0.id() as i32)
            .kinds
            .get("openshell-supervisor host")
            .map(|(_, kib, threads)| (*kib, *threads))
            .unwrap_or_default();
        println!(
            "  --worker-threads {threads}: host {:.0} KiB PSS in {} threads",
            host.0, host.1
        );
    }
    // An `iperf3 -s` in each cluster's mem-0 (its own network): started by
    // this process, so it is in no cluster's bill.
    let mut servers = Vec::new();
    let mut forwards = Vec::new();
    for cluster in &clusters {
        let net = crate::loopback::sandbox_net(&cluster.client, "mem-0").await;
        let port = crate::iperf::free_port();
        servers.push(crate::iperf::iperf3_server_in(&net, port));
        forwards.push(
            cluster
                .client
                .forward("mem-0", port, "127.0.0.1:0", CallOptions::new())
                .await
                .expect("forward into mem-0"),
        );
    }
    let mut figures = vec![[Vec::new(), Vec::new()]; ARMS.len()];
    for arm in crate::measure::interleaved(ARMS.len(), rounds) {
        let port = forwards[arm].local_addr().port();
        for (figure, streams) in figures[arm].iter_mut().zip([1, 4]) {
            let gbit = crate::iperf::iperf3_gbit_s_streams(port, seconds, streams)
                .unwrap_or_else(|e| panic!("forward through the {}-thread host: {e}", ARMS[arm]));
            figure.push(gbit);
        }
    }
    let median = |values: &[f64]| crate::contract::median(values).unwrap_or(f64::NAN);
    let medians: Vec<[f64; 2]> = figures
        .iter()
        .map(|[one, four]| [median(one), median(four)])
        .collect();
    for (threads, [one, four]) in ARMS.iter().zip(&medians) {
        println!(
            "  --worker-threads {threads}: forward {one:.2} Gbit/s (1 stream), {four:.2} Gbit/s (4 streams), medians"
        );
    }
    println!(
        "  ratio 1 thread / 2 workers: forward {:.2} (1 stream), {:.2} (4 streams)",
        medians[0][0] / medians[1][0],
        medians[0][1] / medians[1][1]
    );
    for forward in forwards {
        forward.close();
    }
    drop(servers);
    for mut cluster in clusters {
        cluster.up.stop();
    }
}

/// The edge's client once the cluster answers (at most 60 s).
async fn connect(url: &str, up: &mut Child, dir: &Path) -> Client {
    let config = ClientConfig::builder(url).build().expect("client config");
    let started = Instant::now();
    loop {
        if let Ok(client) = Client::connect(config.clone()).await
            && client.health(CallOptions::new()).await.is_ok()
        {
            return client;
        }
        if let Ok(Some(status)) = up.try_wait() {
            panic!(
                "openshell-gateway up exited ({status}): {}",
                std::fs::read_to_string(dir.join("up.log")).unwrap_or_default()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the cluster did not answer within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Until a host holds its session, creating a sandbox answers
/// `UNAVAILABLE`: one probe sandbox, created as soon as one does (at most
/// 60 s), then deleted.
async fn wait_for_hosts(client: &Client) {
    let started = Instant::now();
    loop {
        match client
            .sandboxes()
            .create(CreateSandbox::new().name("probe"), CallOptions::new())
            .await
        {
            Ok(_) => break,
            Err(err)
                if err.code() == "unavailable" && started.elapsed() < Duration::from_secs(60) =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("no host took a sandbox: {err}"),
        }
    }
    client
        .sandboxes()
        .delete("probe", CallOptions::new())
        .await
        .expect("delete the probe sandbox");
}

/// PSS of every descendant of `root`, by role.
fn bill(root: i32) -> Bill {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some(parent) = parent_of(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut bill = Bill::default();
    let mut stack = children.get(&root).cloned().unwrap_or_default();
    let mut visited = 0usize;
    while let Some(pid) = stack.pop() {
        visited += 1;
        assert!(visited < 100_000, "process tree walk did not end");
        stack.extend(children.get(&pid).into_iter().flatten().copied());
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}/smaps_rollup")).exists() {
            continue;
        }
        let pss = memory(pid).pss_kib;
        let mut args = cmdline.split(|b| *b == 0);
        let _program = args.next();
        let role = args.next().unwrap_or_default();
        if role == b"serve" || role == b"edge" {
            bill.gateway_kib += pss;
            bill.gateway_processes += 1;
        } else {
            bill.sandbox_side_kib += pss;
            bill.sandbox_side_processes += 1;
            let program = Path::new(std::ffi::OsStr::from_bytes(_program.unwrap_or_default()))
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let role = String::from_utf8_lossy(role);
            let role = if role.starts_with('-') || role.is_empty() {
                String::new()
            } else {
                format!(" {role}")
            };
            let kind = bill.kinds.entry(format!("{program}{role}")).or_default();
            kind.0 += 1;
            kind.1 += pss;
            kind.2 += threads(pid);
        }
    }
    bill
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `up`, stopped by its PID (SIGTERM, then SIGKILL after 30 s) whatever
/// happens to the benchmark.
struct UpProcess(Child);

impl UpProcess {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        openshell_testkit::signal(self.0.id() as i32, libc::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for UpProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

//! `openshell-gateway up`: the developer cluster starts replicas and the
//! edge, serves sandboxes through the edge with placement, and Ctrl-C stops
//! every process it started.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_testkit::{bin, eventually, is_running, signal, threads};
use tonic::transport::Channel;

/// Stops `up` (and through it everything it started) even when the test
/// fails half way: SIGINT by PID, then SIGKILL after 20 s.
struct UpGuard(Option<std::process::Child>);

impl Drop for UpGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            signal(child.id() as i32, libc::SIGINT);
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
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

#[tokio::test]
async fn up_serves_through_the_edge_and_stops_everything_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut up = Command::new(bin("openshell-gateway"))
        .args([
            "up",
            "--replicas",
            "3",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up_pid = up.id() as i32;
    let stdout = up.stdout.take().unwrap();
    let mut guard = UpGuard(Some(up));
    let banner = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let done = line.contains("serving");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    })
    .join()
    .unwrap();
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("serving http://127.0.0.1:{port}"))),
        "{banner:?}"
    );
    assert_eq!(
        banner
            .iter()
            .filter(|l| l.trim_start().starts_with("gw-"))
            .count(),
        3
    );

    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = OpenShellClient::with_interceptor(channel, Bearer(None));
    create_ready(&mut client, "via-edge").await;
    assert_eq!(
        sh(&mut client, "via-edge", "echo hi").await.stdout_text(),
        "hi\n"
    );

    let run_dir = dir.path().join("up");
    let mut pids: Vec<i32> = std::fs::read_dir(&run_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".ready.json"))
        .map(|e| {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
            v["pid"].as_i64().unwrap() as i32
        })
        .collect();
    assert_eq!(pids.len(), 4, "three replicas and the edge");
    let supervisor: i32 = std::fs::read_dir(dir.path().join("sandboxes"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("supervisor.pid")).ok())
        .map(|s| s.trim().parse().unwrap())
        .next()
        .expect("a supervisor");
    pids.push(supervisor);
    assert!(pids.iter().all(|p| is_running(*p)));

    signal(up_pid, libc::SIGINT);
    let started = Instant::now();
    let up = guard.0.as_mut().unwrap();
    loop {
        if up.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "up did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || pids
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes left running: {:?}",
        pids.iter().filter(|p| is_running(**p)).collect::<Vec<_>>()
    );
}

/// `up --hosts 2`: the replicas run `--driver hosts`, two real
/// `openshell-supervisor host` processes (one per replica after placement)
/// serve every sandbox, exec works through the edge and a host's relay, no
/// supervisor process is started per sandbox, and Ctrl-C stops the hosts
/// by their PIDs.
#[tokio::test]
async fn up_with_hosts_runs_sandboxes_on_shared_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut up = Command::new(bin("openshell-gateway"))
        .args([
            "up",
            "--replicas",
            "2",
            "--hosts",
            "2",
            "--host-threads",
            "2",
            "--isolation",
            "none",
        ])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up_pid = up.id() as i32;
    let stdout = up.stdout.take().unwrap();
    let mut guard = UpGuard(Some(up));
    let banner = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let done = line.contains("serving");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    })
    .join()
    .unwrap();
    assert!(
        banner.iter().any(|l| l.contains("on 2 supervisor hosts")),
        "{banner:?}"
    );
    let hosts: Vec<i32> = banner
        .iter()
        .filter(|l| l.trim_start().starts_with("h-"))
        .filter_map(|l| l.rsplit("pid ").next()?.trim_end_matches(')').parse().ok())
        .collect();
    assert_eq!(hosts.len(), 2, "{banner:?}");
    assert!(hosts.iter().all(|p| is_running(*p)));
    // --host-threads 2 reached the hosts: two workers beside the main
    // thread (a default host runs on its main thread alone).
    for pid in &hosts {
        let threads = threads(*pid);
        assert!(threads >= 3, "host {pid} runs {threads} threads");
    }
    // The host tokens: files only the owner reads, never printed.
    for id in ["h-0", "h-1"] {
        let path = dir.path().join("up").join(format!("{id}.token"));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{id}");
        let token = std::fs::read_to_string(&path).unwrap();
        assert!(banner.iter().all(|l| !l.contains(token.trim())));
    }

    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = OpenShellClient::with_interceptor(channel, Bearer(None));
    let mut ids = Vec::new();
    for name in ["pooled-a", "pooled-b"] {
        ids.push(create_ready(&mut client, name).await.metadata.unwrap().id);
        assert_eq!(
            sh(&mut client, name, "echo from-a-host")
                .await
                .stdout_text(),
            "from-a-host\n"
        );
    }
    // Each sandbox lives under a host's root; none has a supervisor of its own.
    for id in &ids {
        let on_host = ["h-0", "h-1"]
            .iter()
            .any(|h| dir.path().join("hosts").join(h).join(id).exists());
        assert!(on_host, "{id} is under no host's root");
        assert!(
            !dir.path()
                .join("sandboxes")
                .join(id)
                .join("supervisor.pid")
                .exists(),
            "{id} got a supervisor process"
        );
    }

    signal(up_pid, libc::SIGINT);
    let started = Instant::now();
    let up = guard.0.as_mut().unwrap();
    loop {
        if up.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "up did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        eventually(Duration::from_secs(10), || hosts
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "hosts left running"
    );
}

/// `--host-threads` needs `--hosts` and a count the host accepts; a refused
/// command line starts nothing and says which flag is wrong.
#[test]
fn up_refuses_bad_host_threads_before_starting_anything() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 2] = [
        (&["--host-threads", "2"], "--hosts"),
        (
            &["--hosts", "1", "--host-threads", "0"],
            "0 is not in 1..=256",
        ),
    ];
    for (args, says) in cases {
        let out = Command::new(bin("openshell-gateway"))
            .arg("up")
            .args(args)
            .arg("--data-dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.contains("--host-threads"), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

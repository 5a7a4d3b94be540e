//! The supervisor's one budget for SSH input that no program has read yet
//! (`openshell-supervisor --ssh-input-budget`), against a real gateway, its
//! supervisor and OpenSSH clients that hold only an SSH session token.
//!
//! The gateway starts its supervisors through a small script that adds
//! `--ssh-input-budget 8 MiB` (the default, 64 MiB, works the same but
//! would make these tests slow and hungry). Clients feed programs that do
//! not read (`sleep`): the supervisor's resident memory must stay near the
//! budget, and input held back meanwhile must reach a program that reads
//! it later, whole, while a program that reads at once is not starved.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::*;
use openshell_sdk::{CallOptions, ClientConfig, ForwardTarget};
use openshell_testkit::{Gateway, GatewayOptions};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

const MIB: usize = 1 << 20;
const BUDGET: usize = 8 * MIB;
const LIMIT: Duration = Duration::from_secs(90);

fn script(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A launcher for the gateway (testkit's `launcher`) that hands it, as its
/// `--supervisor-bin`, the real supervisor with the test's budget. Both
/// scripts `exec`, so PIDs are the programs' own.
fn launcher_with_budget(dir: &Path) -> PathBuf {
    let real = openshell_testkit::bin("openshell-supervisor");
    let supervisor = dir.join("supervisor-with-budget");
    // Helper modes (`__isolation-check`, ...) take no flags of the main mode.
    script(
        &supervisor,
        &format!(
            "#!/bin/sh\ncase \"$1\" in __*) exec '{real}' \"$@\";; esac\n\
             exec '{real}' \"$@\" --ssh-input-budget {BUDGET}\n",
            real = real.display()
        ),
    );
    let launcher = dir.join("gateway-launcher");
    script(
        &launcher,
        &format!(
            "#!/bin/sh\ngateway=\"$1\"; shift; prev=\n\
             for arg; do shift\n\
             if [ \"$prev\" = --supervisor-bin ]; then set -- \"$@\" '{supervisor}'; \
             else set -- \"$@\" \"$arg\"; fi\n\
             prev=\"$arg\"; done\nexec \"$gateway\" \"$@\"\n",
            supervisor = supervisor.display()
        ),
    );
    launcher
}

struct Setup {
    gw: Gateway,
    _dir: tempfile::TempDir,
    forwards: Vec<openshell_sdk::ForwardHandle>,
    /// Local ports of the forwards: each takes 3 connections at once (the
    /// cap per SSH session token).
    ports: Vec<u16>,
}

/// A gateway whose supervisors have the test's budget, one sandbox, and
/// `forwards` forwards to its SSH server, each opened with a session token
/// of its own and nothing else.
async fn setup(name: &str, forwards: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut options = GatewayOptions::with_token(TOKEN);
    options.launcher = vec![launcher_with_budget(dir.path()).display().to_string()];
    let gw = Gateway::start(options);
    let mut user = client(&gw).await;
    create_ready(&mut user, name).await;
    let config = ClientConfig::builder(&gw.url).build().unwrap();
    let sdk = openshell_sdk::Client::connect_lazy(config).await.unwrap();
    let (mut handles, mut ports) = (Vec::new(), Vec::new());
    for _ in 0..forwards {
        let session = user
            .create_ssh_session(CreateSshSessionRequest {
                sandbox: name.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let forward = sdk
            .forward_to(
                name,
                ForwardTarget::Ssh,
                Some(&session.token),
                "127.0.0.1:0",
                CallOptions::default(),
            )
            .await
            .unwrap();
        ports.push(forward.local_addr().port());
        handles.push(forward);
    }
    Setup {
        gw,
        _dir: dir,
        forwards: handles,
        ports,
    }
}

impl Setup {
    async fn close(self) {
        for forward in &self.forwards {
            forward.close();
            forward.closed().await;
        }
    }
}

/// One OpenSSH connection running `command`, its stdin and output piped.
fn ssh(port: u16, command: &str) -> tokio::process::Child {
    tokio::process::Command::new("ssh")
        .args(["-F", "/dev/null", "-p", &port.to_string()])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=30",
            "-o",
            "LogLevel=ERROR",
        ])
        .arg("sandbox@127.0.0.1")
        .arg(command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ssh")
}

/// Writes `data` to the child's stdin in 64 KiB pieces, counting what went
/// out in `written`; closes stdin at the end.
fn feed(
    child: &mut tokio::process::Child,
    data: Arc<Vec<u8>>,
    written: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let mut stdin = child.stdin.take().unwrap();
    tokio::spawn(async move {
        for piece in data.chunks(64 * 1024) {
            if stdin.write_all(piece).await.is_err() {
                return;
            }
            written.fetch_add(piece.len(), Ordering::SeqCst);
        }
    })
}

/// Bytes that do not compress or repeat (xorshift).
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn rss_bytes(pid: i32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// Processes on this machine whose command line is `sleep <tag>`.
fn sleeping(tag: &str) -> usize {
    let want = format!("sleep\0{tag}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| cmdline == want.as_bytes())
        .count()
}

/// Waits (bounded) until `written` stops growing for `quiet`, or every
/// feeder is done. Returns the largest `sample()` seen meanwhile.
async fn until_settled(
    written: &[Arc<AtomicUsize>],
    feeders: &[tokio::task::JoinHandle<()>],
    quiet: Duration,
    mut sample: impl FnMut() -> usize,
) -> usize {
    let total = || {
        written
            .iter()
            .map(|w| w.load(Ordering::SeqCst))
            .sum::<usize>()
    };
    let started = Instant::now();
    let (mut last, mut since) = (total(), Instant::now());
    let mut most = sample();
    while started.elapsed() < LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
        most = most.max(sample());
        let now = total();
        if now != last {
            (last, since) = (now, Instant::now());
        }
        if feeders.iter().all(|f| f.is_finished()) || since.elapsed() >= quiet {
            // The last bytes written may still be on their way in.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return most.max(sample());
        }
    }
    panic!("the feeders neither finished nor stopped within {LIMIT:?}");
}

/// Six connections feed 15 MiB each to `sleep`: 90 MiB nobody reads.
/// Without a budget the supervisor holds all of it; with one it holds the
/// budget and stops reading the connections (plus their fixed buffers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_holds_no_more_unread_ssh_input_than_its_budget() {
    let setup = setup("budgetbox", 2).await;
    let pid = setup.gw.supervisor_pids()[0];
    let data = Arc::new(vec![b'x'; 15 * MIB]);
    // The connections are up and their programs run before the count.
    let mut clients: Vec<_> = (0..6)
        .map(|i| ssh(setup.ports[i % 2], "echo up; exec sleep 317"))
        .collect();
    for child in &mut clients {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        let stdout = child.stdout.as_mut().unwrap();
        tokio::time::timeout(
            LIMIT,
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("a connection came up")
        .unwrap();
        assert_eq!(line, "up\n");
    }
    let before = rss_bytes(pid);
    let written: Vec<_> = (0..clients.len())
        .map(|_| Arc::new(AtomicUsize::new(0)))
        .collect();
    let feeders: Vec<_> = clients
        .iter_mut()
        .zip(&written)
        .map(|(child, w)| feed(child, data.clone(), w.clone()))
        .collect();
    let most = until_settled(&written, &feeders, Duration::from_secs(3), || {
        rss_bytes(pid)
    })
    .await;
    let fed: usize = written.iter().map(|w| w.load(Ordering::SeqCst)).sum();
    let grown = most.saturating_sub(before);
    eprintln!(
        "supervisor VmRSS {} MiB before, at most {} MiB while {} MiB were fed (budget {} MiB)",
        before / MIB,
        most / MIB,
        fed / MIB,
        BUDGET / MIB
    );
    assert!(fed > 2 * BUDGET, "only {} MiB fed", fed / MIB);
    // The budget, and per connection its reserve, one packet, the relay's
    // pipe and the HTTP/2 stream's window (2 MiB), with room to spare.
    let allowed = BUDGET + 6 * 3 * MIB + 8 * MIB;
    assert!(
        grown <= allowed,
        "the supervisor grew by {} MiB holding unread SSH input (allowed {} MiB)",
        grown / MIB,
        allowed / MIB
    );

    // Stopped connections still end with their relays (here: the forwards
    // close), and their programs with them, though the supervisor is not
    // reading them.
    for feeder in &feeders {
        feeder.abort();
    }
    for mut child in clients {
        child.kill().await.unwrap();
    }
    setup.close().await;
    let started = Instant::now();
    while sleeping("317") > 0 && started.elapsed() < LIMIT {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(sleeping("317"), 0, "programs of ended connections live on");
}

/// While one connection's unread input has used up the budget, a program
/// that reads at once still gets all its input, and one that starts
/// reading late gets everything sent to it meanwhile, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_held_back_by_the_budget_arrives_whole_and_readers_go_on() {
    let setup = setup("wholebox", 1).await;
    // The hog: 24 MiB for a program that never reads.
    let port = setup.ports[0];
    let mut hog = ssh(port, "exec sleep 318");
    let hog_written = Arc::new(AtomicUsize::new(0));
    let hog_feeder = feed(
        &mut hog,
        Arc::new(vec![b'h'; 24 * MIB]),
        hog_written.clone(),
    );
    until_settled(
        std::slice::from_ref(&hog_written),
        std::slice::from_ref(&hog_feeder),
        Duration::from_secs(3),
        || 0,
    )
    .await;
    assert!(
        !hog_feeder.is_finished(),
        "the hog's 24 MiB all went through ({} MiB): the budget held nothing back",
        hog_written.load(Ordering::SeqCst) / MIB
    );

    // A reader at once, and a reader that sleeps first: each sha256sum must
    // print the digest of what was sent.
    let check = |command: &'static str, len: usize, seed: u64| async move {
        let data = noise(len, seed);
        let want = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>();
        let mut child = ssh(port, command);
        let written = Arc::new(AtomicUsize::new(0));
        let feeder = feed(&mut child, Arc::new(data), written);
        let output = tokio::time::timeout(LIMIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{command}: no answer within {LIMIT:?}"))
            .unwrap();
        feeder.await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            stdout.starts_with(&want),
            "{command}: got {stdout:?}, want {want} (stderr: {})",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    let started = Instant::now();
    tokio::join!(
        check("sha256sum", 6 * MIB, 1),
        check("sleep 8; sha256sum", 20 * MIB, 2),
    );
    eprintln!("both digests right after {:?}", started.elapsed());

    hog_feeder.abort();
    hog.kill().await.unwrap();
    setup.close().await;
}

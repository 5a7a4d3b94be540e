//! Runs `openshell-supervisor host` against a real gateway (`serve --driver
//! hosts`, started by testkit) and checks the host's side through the
//! gateway's API: sandboxes started on assignment (directories, SSH host
//! keys, capacity), their processes going on while the host's session is
//! lost and comes back, a deleted sandbox's processes (a setsid daemon
//! included) killed and its directory removed, namespace isolation, a
//! sandbox init that dies restarted, SIGTERM, and the memory a host saves.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use openshell_sdk::CallOptions;
use openshell_testkit::{marker, pids_with_env};
use tokio::process::{Child, Command};
use tokio::time::timeout;

struct Host {
    child: Child,
    log: std::path::PathBuf,
    token: String,
}

impl Host {
    /// `openshell-supervisor host` as `h-1` with the token the real
    /// `openshell-gateway host-token` issued in `store`.
    fn start(gateway: &str, store: &Path, dir: &Path, root: &Path, extra: &[&str]) -> Self {
        let token = issue_host_token(store, "h-1");
        let log = dir.join("host.log");
        let token_file = dir.join(".token");
        write_private(&token_file, &token);
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args(["host", "--gateway", gateway, "--host-id", "h-1"])
            .arg("--token-file")
            .arg(&token_file)
            .arg("--root")
            .arg(root)
            .args(extra)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self { child, log, token }
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// SIGTERM; the exit status must be success.
    async fn terminate(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = timeout(WAIT, self.child.wait())
            .await
            .expect("host exits in time")
            .unwrap();
        assert!(status.success(), "{status}: {}", self.log());
    }
}

/// Writes `text` to `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Waits until `gw` holds the host's session.
async fn wait_held(gw: &openshell_testkit::Gateway, host: &Host) {
    let held = eventually(Duration::from_secs(15), || {
        gw.metric("openshell_server_supervisor_hosts") == Some(1.0)
    })
    .await;
    assert!(held, "the host has no session:\n{}", host.log());
}

async fn wait_missing(path: &Path) {
    let missing = eventually(Duration::from_secs(5), || !path.exists()).await;
    assert!(missing, "{} is still there", path.display());
}

/// Pids of the processes an exec with `OPENSHELL_TEST_MARK=mark` started.
async fn marked(mark: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    eventually(Duration::from_secs(5), || {
        pids = pids_with_env("OPENSHELL_TEST_MARK", mark);
        !pids.is_empty()
    })
    .await;
    assert!(!pids.is_empty(), "no process carries mark {mark}");
    pids
}

/// Runs `script` in `sandbox` in the background (it returns at once) with
/// a fresh mark; the pids of what it left running.
async fn background(client: &openshell_sdk::Client, sandbox: &str, script: &str) -> Vec<i32> {
    let mark = marker();
    let out = client
        .exec(
            openshell_sdk::ExecRequest::new(sandbox, ["sh", "-c", script])
                .env("OPENSHELL_TEST_MARK", &mark),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "{out:?}");
    marked(&mark).await
}

#[tokio::test]
async fn host_serves_its_sandboxes_across_a_lost_session_and_stops_them() {
    let mut gw = gateway("hosts");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    // Left by an earlier life of the host: a sandbox deleted meanwhile, and
    // something that is not a sandbox.
    std::fs::create_dir_all(root.join("sb-gone").join("work")).unwrap();
    std::fs::create_dir_all(root.join("not-a-sandbox")).unwrap();
    let mut host = Host::start(
        &gw.url,
        &gw.store_dir(),
        dir.path(),
        &root,
        // A multi-threaded host here; the other tests run the default,
        // the whole host on one thread.
        &[
            "--capacity",
            "2",
            "--isolation",
            "none",
            "--worker-threads",
            "2",
        ],
    );
    wait_held(&gw, &host).await;
    let client = client(&gw.url).await;

    // Two sandboxes, each with its directory and SSH host key on the host.
    let a = create(&client, "a").await;
    let b = create(&client, "b").await;
    wait_ready(&client, "a").await;
    wait_ready(&client, "b").await;
    for id in [&a, &b] {
        assert!(root.join(id).join("work").is_dir());
        assert!(root.join(id).join("ssh_host_ed25519_key").is_file());
    }
    wait_missing(&root.join("sb-gone")).await;
    assert!(root.join("not-a-sandbox").is_dir());
    // The host said capacity 2: a third sandbox finds no room and is not
    // created.
    let err = client
        .sandboxes()
        .create(
            openshell_sdk::CreateSandbox::new().name("c"),
            CallOptions::new(),
        )
        .await
        .expect_err("a third sandbox on a host of capacity 2");
    assert_eq!(err.code(), "resource_exhausted", "{err}");
    let err = client
        .sandboxes()
        .get("c", CallOptions::new())
        .await
        .expect_err("c was not created");
    assert_eq!(err.code(), "not_found", "{err}");

    // Processes run in the sandbox's working directory under the root.
    let (out, code) = sh(&client, "a", "echo $HOME; pwd").await;
    let home = root.join(&a).join("work");
    assert_eq!((out, code), (format!("{0}\n{0}\n", home.display()), 0));
    let in_a = background(
        &client,
        "a",
        "setsid sleep 1000 </dev/null >/dev/null 2>&1 &",
    )
    .await;
    let in_b = background(&client, "b", "sleep 1000 </dev/null >/dev/null 2>&1 &").await;
    // An orphan (its exec is gone) is the host's child now; once it ends
    // it is reaped, not left a zombie.
    let orphan = background(&client, "a", "sleep 2 </dev/null >/dev/null 2>&1 &").await;
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    assert_eq!(parent(orphan[0]), Some(host.pid()), "the orphan's parent");
    let reaped = eventually(Duration::from_secs(15), || {
        !Path::new(&format!("/proc/{}", orphan[0])).exists()
    })
    .await;
    assert!(reaped, "the orphan {} was not reaped", orphan[0]);

    // The host's session is lost (the gateway restarts): the host dials
    // again, its sandboxes come back, and their processes went on.
    gw.restart();
    wait_held(&gw, &host).await;
    wait_ready(&client, "a").await;
    wait_ready(&client, "b").await;
    assert!(in_a.iter().chain(&in_b).all(|pid| is_running(*pid)));
    assert_eq!(
        sh_eventually(&client, "a", "echo again").await,
        ("again\n".into(), 0)
    );
    // It redialled the replica that had held its session (sticky); that
    // replica was down then, so it went through placement again (no
    // `stay`), as after a crash.
    let log = host.log();
    let accepted: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("host_loop: host session accepted"))
        .collect();
    assert_eq!(accepted.len(), 2, "{log}");
    assert!(
        accepted.iter().all(|line| line.contains("stay=false")),
        "{log}"
    );
    assert!(log.contains("dial=Sticky"), "{log}");
    assert!(
        log.contains(
            "the replica that held the session is gone; placement through the shared address"
        ),
        "{log}"
    );

    // b is deleted: it leaves the host's assignment, its processes die and
    // its directory goes; a goes on.
    client
        .sandboxes()
        .delete("b", CallOptions::new())
        .await
        .expect("delete");
    for pid in &in_b {
        wait_gone(*pid).await;
    }
    wait_missing(&root.join(&b)).await;
    assert!(in_a.iter().all(|pid| is_running(*pid)));

    // SIGTERM: every sandbox's processes die (a setsid daemon too), files
    // stay, exit 0.
    host.terminate().await;
    for pid in &in_a {
        wait_gone(*pid).await;
    }
    assert!(root.join(&a).join("ssh_host_ed25519_key").is_file());
    let log = host.log();
    assert!(!log.contains(&host.token), "the token leaked into the log");
    // The host token file stays for the next start.
    assert!(dir.path().join(".token").is_file());
    assert!(log.contains("sandbox unassigned"), "{log}");
}

#[tokio::test]
async fn isolated_sandboxes_get_inits_of_their_own_and_lose_them_when_deleted() {
    let gw = gateway("hosts");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut host = Host::start(
        &gw.url,
        &gw.store_dir(),
        dir.path(),
        &root,
        &["--isolation", "namespaces"],
    );
    let host_pid = host.pid() as u32;
    wait_held(&gw, &host).await;
    let client = client(&gw.url).await;
    let one = create(&client, "one").await;
    let two = create(&client, "two").await;
    wait_ready(&client, "one").await;
    wait_ready(&client, "two").await;
    assert_eq!(sandbox_inits(host_pid).len(), 2, "{}", host.log());

    // Inside: the sandbox uid, its own PID 1, and of the root only its own
    // working directory.
    let script = format!(
        "id -u; echo $$; ls -a {root}; ls -a {root}/{one}; cat {root}/{one}/ssh_host_ed25519_key",
        root = root.display()
    );
    let (output, code) = sh(&client, "one", &script).await;
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines[0], "1000", "{output}");
    assert!(lines[1].parse::<i32>().unwrap() < 10, "{output}");
    assert!(!output.contains(&two), "{output}");
    assert!(!output.contains("OPENSSH PRIVATE KEY"), "{output}");
    assert_ne!(code, 0, "the key must not be readable: {output}");

    // PID 1 reaps orphans: a detached child that ended leaves no zombie.
    let (_, code) = sh(&client, "one", "(sleep 0.2 &); true").await;
    assert_eq!(code, 0);
    let mut zombies = String::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (stats, _) = sh(&client, "one", "cat /proc/[0-9]*/stat").await;
        zombies = stats.lines().filter(|l| l.contains(") Z ")).collect();
        if zombies.is_empty() {
            break;
        }
    }
    assert!(zombies.is_empty(), "{zombies}");
    // An idle sandbox's PID 1 sleeps until a process of it ends: it does
    // not wake on a timer.
    let switches = |pid: i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let first_init = sandbox_inits(host_pid)[0];
    let before = switches(first_init);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(switches(first_init), before, "PID 1 woke while idle");
    // Set up, PID 1 is the reaper program (x86-64): a page or two of its own
    // rather than a copy of the setup's memory.
    if cfg!(target_arch = "x86_64") {
        let (cmdline, _) = sh(&client, "one", "tr '\\0' ' ' < /proc/1/cmdline").await;
        assert_eq!(cmdline.trim(), "openshell-sandbox-reaper");
        let pss = pss_kib(&sandbox_inits(host_pid));
        assert!(pss < 2 * 32, "two PID 1s: {pss} KiB PSS");
    }

    // A daemon in `two` dies with its init when `two` is deleted.
    let (_, code) = sh(&client, "two", "sleep 1000 >/dev/null 2>&1 &").await;
    assert_eq!(code, 0);
    let inits = sandbox_inits(host_pid);
    let below: Vec<i32> = inits.iter().flat_map(|pid| descendants(*pid)).collect();
    client
        .sandboxes()
        .delete("two", CallOptions::new())
        .await
        .expect("delete");
    let one_left = eventually(Duration::from_secs(5), || {
        sandbox_inits(host_pid).len() == 1
    })
    .await;
    assert!(one_left, "{:?}", sandbox_inits(host_pid));
    let left = descendants(host_pid as i32);
    let survivors: Vec<&i32> = below
        .iter()
        .filter(|pid| !process_gone(**pid) && !left.contains(pid))
        .collect();
    assert!(survivors.is_empty(), "{survivors:?}");
    wait_missing(&root.join(&two)).await;

    // `one`'s init dies: the sandbox starts again with a new one (a sandbox
    // without its PID 1 could run nothing) and serves again.
    let old_init = sandbox_inits(host_pid)[0];
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_init),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = eventually(Duration::from_secs(10), || {
        let inits = sandbox_inits(host_pid);
        inits.len() == 1 && inits[0] != old_init
    })
    .await;
    assert!(restarted, "no new init:\n{}", host.log());
    assert_eq!(
        sh_eventually(&client, "one", "id -u").await,
        ("1000\n".into(), 0)
    );
    let below: Vec<i32> = sandbox_inits(host_pid)
        .iter()
        .flat_map(|pid| descendants(*pid))
        .collect();

    host.terminate().await;
    for pid in below {
        wait_gone(pid).await;
    }
}

/// Runs `openshell-supervisor host` against an unreachable gateway with
/// `--root root` and `extra`; returns its exit code and stderr.
async fn host_refusal(
    root: &Path,
    host_id: &str,
    extra: &[&std::ffi::OsStr],
) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
        .args([
            "host",
            "--gateway",
            "http://127.0.0.1:1",
            "--host-id",
            host_id,
        ])
        .args(extra)
        .arg("--root")
        .arg(root)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn host_refuses_bad_arguments_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (_, stderr) = host_refusal(dir.path(), "h-1", &[]).await;
    assert!(stderr.contains("the host token is required"), "{stderr}");

    // A token file others may read is refused, naming the file, not the
    // token.
    let token_file = dir.path().join(".token");
    write_private(&token_file, TOKEN);
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o640),
    )
    .unwrap();
    let with_token = ["--token-file".as_ref(), token_file.as_os_str()];
    let (_, stderr) = host_refusal(dir.path(), "h-1", &with_token).await;
    assert!(
        stderr.contains("may be read by group or others"),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");

    write_private(&token_file, "");
    let (_, stderr) = host_refusal(dir.path(), "", &with_token).await;
    assert!(
        stderr.contains("the host token is invalid: it is empty"),
        "{stderr}"
    );

    // A runtime needs a worker thread; the count is checked before the
    // token is read.
    let zero_workers = [
        "--worker-threads".as_ref(),
        "0".as_ref(),
        "--token-file".as_ref(),
        token_file.as_os_str(),
    ];
    let (code, stderr) = host_refusal(dir.path(), "h-1", &zero_workers).await;
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--worker-threads") && stderr.contains("0 is not in 1..=256"),
        "{stderr}"
    );
}

/// Host pids of the host's sandbox inits (the sandboxes' PID 1s): the
/// children of its init fork server.
fn sandbox_inits(host_pid: u32) -> Vec<i32> {
    let servers: Vec<i32> = descendants(host_pid as i32)
        .into_iter()
        .filter(|pid| {
            parent(*pid) == Some(host_pid as i32)
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline
                        .split(|b| *b == 0)
                        .any(|arg| arg == b"--zygote" || arg == b"__sandbox-zygote")
                })
        })
        .collect();
    descendants(host_pid as i32)
        .into_iter()
        .filter(|pid| parent(*pid).is_some_and(|ppid| servers.contains(&ppid)))
        .collect()
}

fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `root` and every process below it.
fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, parent(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let pid = found[i];
        found.extend(all.iter().filter(|(_, ppid)| *ppid == pid).map(|(p, _)| *p));
        i += 1;
    }
    found
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Summed `Pss:` of `pids`, in KiB.
fn pss_kib(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok())
        .filter_map(|rollup| {
            rollup
                .lines()
                .find_map(|line| line.strip_prefix("Pss:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .sum()
}

/// Sandboxes per host in the memory comparison: 100 sandboxes on 4 hosts.
const SANDBOXES_PER_HOST: usize = 25;

/// One host serving 25 idle isolated sandboxes against 25 per-sandbox
/// supervisors serving one each, side by side, each side on a real gateway
/// of its own (`--driver hosts`; `--driver none` with the supervisors
/// started here): the PSS of every process involved (supervisors or host,
/// sandbox inits and PID 1s). The issue's figure (100 sandboxes on 4 hosts)
/// is `openshell-bench hosts`; here, debug builds, a host measures about
/// 0.08.
#[tokio::test]
async fn a_host_costs_under_a_tenth_of_per_sandbox_supervisors() {
    // More for a measurement by hand: OPENSHELL_TEST_HOST_SANDBOXES=100.
    let count = std::env::var("OPENSHELL_TEST_HOST_SANDBOXES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(SANDBOXES_PER_HOST);
    let names: Vec<String> = (0..count).map(|i| format!("mem-{i}")).collect();
    let dir = tempfile::tempdir().unwrap();

    // Per-sandbox supervisors, each with its session accepted.
    let per_gw = gateway("none");
    let per_client = client(&per_gw.url).await;
    let mut supervisors = Vec::new();
    for name in &names {
        let id = create(&per_client, name).await;
        let token = sandbox_token(&per_gw.store_dir(), &id).expect("sandbox token");
        let token_file = dir.path().join(format!(".token-{id}"));
        std::fs::write(&token_file, token).unwrap();
        let workdir = dir.path().join("per-sandbox").join(&id);
        std::fs::create_dir_all(&workdir).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"))
            .args(["--gateway", &per_gw.url, "--sandbox-id", &id, "--workdir"])
            .arg(&workdir)
            .arg("--token-file")
            .arg(&token_file)
            .args(["--isolation", "namespaces"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        supervisors.push(child);
    }
    for name in &names {
        wait_ready(&per_client, name).await;
    }

    // One host with as many.
    let host_gw = gateway("hosts");
    let root = dir.path().join("root");
    let mut host = Host::start(
        &host_gw.url,
        &host_gw.store_dir(),
        dir.path(),
        &root,
        &["--isolation", "namespaces"],
    );
    let host_pid = host.pid() as u32;
    wait_held(&host_gw, &host).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = (rss_kib(host_pid as i32), pss_kib(&[host_pid as i32]));
    let host_client = client(&host_gw.url).await;
    for name in &names {
        create(&host_client, name).await;
    }
    for name in &names {
        wait_ready(&host_client, name).await;
    }
    assert_eq!(sandbox_inits(host_pid).len(), names.len(), "{}", host.log());

    // Idle for a moment: heartbeats flow, allocations settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_sandbox_pids: Vec<i32> = supervisors
        .iter()
        .flat_map(|child| descendants(child.id().unwrap() as i32))
        .collect();
    let host_pids = descendants(host_pid as i32);
    let per_sandbox = pss_kib(&per_sandbox_pids);
    let hosted = pss_kib(&host_pids);
    let host_alone = pss_kib(&[host_pid as i32]);
    let ratio = hosted as f64 / per_sandbox as f64;
    println!(
        "host serving 0 sandboxes: {} KiB RSS, {} KiB PSS; serving {}: {} KiB RSS",
        idle.0,
        idle.1,
        names.len(),
        rss_kib(host_pid as i32)
    );
    println!(
        "{n} isolated sandboxes: per-sandbox supervisors {per_sandbox} KiB PSS in {pp} processes; \
         one host {hosted} KiB PSS in {hp} processes (host process {host_alone} KiB); ratio {ratio:.3}",
        n = names.len(),
        pp = per_sandbox_pids.len(),
        hp = host_pids.len(),
    );
    // The host, its init fork server, and one process per sandbox (its
    // PID 1).
    assert_eq!(host_pids.len(), 2 + names.len());
    assert!(ratio < 0.1, "ratio {ratio:.3}");
    drop(supervisors);

    // A host killed outright takes every init and sandbox with it
    // (parent-death signals all the way down).
    host.child.start_kill().unwrap();
    let _ = timeout(WAIT, host.child.wait()).await.unwrap();
    for pid in host_pids {
        wait_gone(pid).await;
    }
}

/// The exec helper enters a sandbox through a pidfd of its PID 1: once that
/// process is gone the exec fails (exit 127, saying why) instead of entering
/// whatever process a reused pid now names.
#[tokio::test]
async fn the_exec_helper_never_enters_through_a_dead_pid_one() {
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    // SAFETY: pidfd_open takes plain integers; the child is not reaped yet.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, gone.id() as i32, 0) } as i32;
    assert!(pidfd >= 0, "{}", std::io::Error::last_os_error());
    gone.wait().unwrap();
    let mut helper = Command::new(env!("CARGO_BIN_EXE_openshell-supervisor"));
    helper
        .args(["__sandbox-enter", &pidfd.to_string(), "/", "true"])
        .stdin(std::process::Stdio::null());
    // SAFETY: the hook only clears the descriptor's close-on-exec flag.
    unsafe {
        helper.pre_exec(move || {
            if libc::fcntl(pidfd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = helper.output().await.unwrap();
    // SAFETY: closing the descriptor this test opened.
    unsafe { libc::close(pidfd) };
    assert_eq!(output.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot enter the sandbox") && stderr.contains("No such process"),
        "{stderr}"
    );
}

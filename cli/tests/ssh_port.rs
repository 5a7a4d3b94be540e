//! `openshell ssh-proxy --port N` as the ProxyCommand of the system's own
//! ssh, scp, sftp and rsync, to an sshd the test starts inside a sandbox of
//! a real 3-replica cluster (as the sandbox's uid, with test-owned host and
//! user keys and config, on a loopback port of the sandbox's host):
//! commands, a pty shell, 10 MiB each way intact, a directory listing, an
//! rsync, and where the streams land (gateway and edge metrics): on the
//! owner; no `GetSandbox` per connection with `--owner`; one unrouted retry
//! for an `--owner` that is gone; a relay, without retry, for a live
//! non-owner.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use openshell_testkit::wait_until;

const TEN_MIB: usize = 10 * 1024 * 1024;

/// An sshd inside the sandbox, run by an `openshell exec` child of the
/// test; stopped by that child's PID (which cancels the exec) when dropped.
struct Sshd {
    exec: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        stop(&mut self.exec);
        // Its log, for the test's output when something failed.
        let mut log = String::new();
        if let Some(mut err) = self.exec.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut log);
        }
        eprintln!("sshd log:\n{log}");
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// sshd gives a session's pty to the group `tty`; in the sandbox's user
/// namespace that group is not mapped, so its chown fails and sshd ends the
/// session. This test-owned shim, preloaded into the test's sshd only,
/// makes `getgrnam("tty")` find nothing, and sshd then uses the user's own
/// group (its documented fallback).
const NO_TTY_GROUP_SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <grp.h>
#include <string.h>
struct group *getgrnam(const char *name) {
    static struct group *(*real)(const char *);
    if (name != NULL && strcmp(name, "tty") == 0) return NULL;
    if (real == NULL) real = (struct group *(*)(const char *))dlsym(RTLD_NEXT, "getgrnam");
    return real(name);
}
"#;

fn build_shim(dir: &Path) -> Vec<u8> {
    let source = dir.join("no_tty_group.c");
    std::fs::write(&source, NO_TTY_GROUP_SHIM).unwrap();
    let library = dir.join("no_tty_group.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("cc (a C compiler, which building Rust needs anyway)");
    assert!(status.success());
    std::fs::read(&library).unwrap()
}

fn keygen(path: &Path) -> String {
    let status = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "openshell-cli-test",
            "-f",
        ])
        .arg(path)
        .status()
        .expect("ssh-keygen (scripts/setup.sh installs openssh-client)");
    assert!(status.success());
    std::fs::read_to_string(path.with_extension("pub")).unwrap()
}

/// Writes `data` to `path` inside the sandbox, as the sandbox's user.
fn put(c: &Cluster, sandbox: &str, path: &str, data: impl Into<Vec<u8>>) {
    c.cli()
        .args([
            "exec",
            "-i",
            sandbox,
            "--",
            "sh",
            "-c",
            &format!("umask 077; cat > '{path}'"),
        ])
        .stdin(data)
        .run(60)
        .success();
}

fn sh(c: &Cluster, sandbox: &str, script: &str) -> String {
    let out = c
        .cli()
        .args(["exec", sandbox, "--", "sh", "-c", script])
        .run(60);
    out.success();
    out.stdout
}

struct Client {
    dir: PathBuf,
    config: PathBuf,
    env: Vec<(String, String)>,
}

impl Client {
    /// `program ARGS` (ssh, scp, sftp, rsync) with the test's ssh config
    /// and the CLI's settings in the environment the ProxyCommand inherits.
    fn cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("HOME", &self.dir);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn ssh(&self, proxy: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut cmd = self.cmd("ssh");
        cmd.arg("-F").arg(&self.config);
        cmd.arg("-o").arg(format!("ProxyCommand={proxy}"));
        cmd.args(args);
        run(cmd, stdin, 120)
    }
}

fn run(mut cmd: Command, stdin: Option<&[u8]>, secs: u64) -> Output {
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start an ssh tool");
    wait_output(&mut child, stdin.map(<[u8]>::to_vec), secs)
}

fn sha256(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

#[test]
fn ssh_scp_sftp_and_rsync_through_ssh_proxy_port_to_an_sshd_in_the_sandbox() {
    let c = Cluster::start();
    let (_id, owner) = c.create_ready("ssh-box");

    // Test-owned keys: the sshd's host key and the client's user key.
    let keys = tempfile::Builder::new()
        .prefix("openshell-ssh-")
        .tempdir()
        .unwrap();
    let host_pub = keygen(&keys.path().join("host_key"));
    let user_pub = keygen(&keys.path().join("user_key"));

    // The sandbox's user and working directory, and the sshd's files in it.
    let user = sh(&c, "ssh-box", "id -un").trim().to_owned();
    let uid = sh(&c, "ssh-box", "id -u").trim().to_owned();
    let workdir = sh(&c, "ssh-box", "pwd").trim().to_owned();
    let port = free_port();
    let d = format!("{workdir}/sshd");
    sh(&c, "ssh-box", "umask 077; mkdir -p sshd");
    put(
        &c,
        "ssh-box",
        &format!("{d}/host_key"),
        std::fs::read(keys.path().join("host_key")).unwrap(),
    );
    put(&c, "ssh-box", &format!("{d}/authorized_keys"), user_pub);
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
         AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
         Subsystem sftp internal-sftp\nLogLevel VERBOSE\n"
    );
    put(&c, "ssh-box", &format!("{d}/sshd_config"), config);
    let mut env = Vec::new();
    if uid == "0" {
        // isolation none: sshd as root wants its privilege separation directory.
        sh(&c, "ssh-box", "mkdir -p /run/sshd");
    } else {
        put(
            &c,
            "ssh-box",
            &format!("{d}/no_tty_group.so"),
            build_shim(keys.path()),
        );
        env = vec!["-e".to_owned(), format!("LD_PRELOAD={d}/no_tty_group.so")];
    }
    let _sshd = Sshd {
        exec: c
            .cli()
            .args(["exec"])
            .args(&env)
            .args(["ssh-box", "--", "/usr/sbin/sshd", "-D", "-e", "-f"])
            .args([format!("{d}/sshd_config")])
            .spawn(),
    };
    // It listens on the sandbox's own loopback (its network namespace):
    // asked from inside.
    let listening = format!(
        "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            c.cli()
                .args(["exec", "ssh-box", "--", "python3", "-c", &listening])
                .run(30)
                .code
                == 0
        }),
        "sshd in the sandbox never listened on {port}"
    );

    // The client: pinned host key, the user key, batch mode.
    let client_dir = keys.path().to_owned();
    let known = client_dir.join("known_hosts");
    std::fs::write(&known, format!("ssh-box {}", host_pub)).unwrap();
    let ssh_config = client_dir.join("ssh_config");
    std::fs::write(
        &ssh_config,
        format!(
            "Host ssh-box\n  User {user}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
             UserKnownHostsFile {}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  \
             BatchMode yes\n  LogLevel ERROR\n",
            client_dir.join("user_key").display(),
            known.display()
        ),
    )
    .unwrap();
    let client = Client {
        dir: client_dir.clone(),
        config: ssh_config.clone(),
        env: vec![
            ("OPENSHELL_ENDPOINT".into(), c.edge.url.clone()),
            ("OPENSHELL_TOKEN".into(), TOKEN.into()),
        ],
    };
    let openshell = openshell_bin().display().to_string();
    let proxy_with = |owner: Option<&str>| match owner {
        Some(owner) => format!("{openshell} ssh-proxy %h --port {port} --owner {owner}"),
        None => format!("{openshell} ssh-proxy %h --port {port}"),
    };
    let proxy = proxy_with(Some(&owner));

    // A command; the streams land on the owner, with no lookup.
    let local_before = c
        .replica(&owner)
        .metric(&routed("local", "tcp"))
        .unwrap_or(0.0);
    let peer_before = c.metric_sum(&routed("peer", "tcp"));
    let gets_before = c.metric_sum(GET_SANDBOX_OK);
    let out = client.ssh(&proxy, &["ssh-box", "echo hello-$((40+2)); id -u"], None);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, format!("hello-42\n{uid}\n"));
    assert_eq!(
        c.replica(&owner)
            .metric(&routed("local", "tcp"))
            .unwrap_or(0.0),
        local_before + 1.0
    );
    assert_eq!(c.metric_sum(&routed("peer", "tcp")), peer_before);
    assert_eq!(
        c.metric_sum(GET_SANDBOX_OK),
        gets_before,
        "--owner still looked the owner up"
    );
    // The control: without --owner, one GetSandbox per connection.
    let out = client.ssh(&proxy_with(None), &["ssh-box", "true"], None);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(c.metric_sum(GET_SANDBOX_OK), gets_before + 1.0);
    assert_eq!(
        c.replica(&owner)
            .metric(&routed("local", "tcp"))
            .unwrap_or(0.0),
        local_before + 2.0
    );

    // The remote exit code comes back through ssh.
    let out = client.ssh(&proxy, &["ssh-box", "exit 3"], None);
    assert_eq!(out.code, 3, "{out:?}");

    // A pty shell.
    let out = client.ssh(
        &proxy,
        &["-tt", "ssh-box"],
        Some(b"echo pty-$((3*3)); tty; exit\n"),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("pty-9"), "{out:?}");
    assert!(out.stdout.contains("/dev/pts/"), "{out:?}");

    // scp: 10 MiB up, 10 MiB down, intact.
    let up = random_bytes(TEN_MIB, 7);
    let up_file = client_dir.join("up.bin");
    std::fs::write(&up_file, &up).unwrap();
    let mut scp = client.cmd("scp");
    scp.arg("-F")
        .arg(&ssh_config)
        .arg("-o")
        .arg(format!("ProxyCommand={proxy}"));
    scp.arg(&up_file).arg(format!("ssh-box:{workdir}/up.bin"));
    let out = run(scp, None, 300);
    assert_eq!(out.code, 0, "{out:?}");
    let remote_sum = client.ssh(
        &proxy,
        &["ssh-box", &format!("sha256sum {workdir}/up.bin")],
        None,
    );
    assert_eq!(
        remote_sum.stdout.split_whitespace().next(),
        Some(sha256(&up).as_str())
    );
    let made = client.ssh(
        &proxy,
        &[
            "ssh-box",
            &format!(
                "cd {workdir} && head -c 10485760 /dev/urandom > down.bin && sha256sum down.bin"
            ),
        ],
        None,
    );
    assert_eq!(made.code, 0, "{made:?}");
    let down_file = client_dir.join("down.bin");
    let mut scp = client.cmd("scp");
    scp.arg("-F")
        .arg(&ssh_config)
        .arg("-o")
        .arg(format!("ProxyCommand={proxy}"));
    scp.arg(format!("ssh-box:{workdir}/down.bin"))
        .arg(&down_file);
    let out = run(scp, None, 300);
    assert_eq!(out.code, 0, "{out:?}");
    let down = std::fs::read(&down_file).unwrap();
    assert_eq!(down.len(), TEN_MIB);
    assert_eq!(
        made.stdout.split_whitespace().next(),
        Some(sha256(&down).as_str())
    );

    // sftp lists the sandbox directory.
    let mut sftp = client.cmd("sftp");
    sftp.arg("-F")
        .arg(&ssh_config)
        .arg("-o")
        .arg(format!("ProxyCommand={proxy}"));
    sftp.args(["-b", "-", "ssh-box"]);
    let out = run(sftp, Some(format!("cd {workdir}\nls -1\n").as_bytes()), 120);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("up.bin") && out.stdout.contains("down.bin"),
        "{out:?}"
    );

    // rsync both ways.
    let tree = client_dir.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(tree.join("sub").join("b.bin"), random_bytes(200_000, 3)).unwrap();
    let rsh = format!("ssh -F {} -o ProxyCommand='{proxy}'", ssh_config.display());
    let mut rsync = client.cmd("rsync");
    rsync
        .args(["-a", "-e", &rsh])
        .arg(format!("{}/", tree.display()))
        .arg(format!("ssh-box:{workdir}/tree/"));
    let out = run(rsync, None, 120);
    assert_eq!(out.code, 0, "{out:?}");
    let listed = client.ssh(
        &proxy,
        &[
            "ssh-box",
            &format!("cd {workdir} && cat tree/a.txt && wc -c < tree/sub/b.bin"),
        ],
        None,
    );
    assert_eq!(
        listed.stdout.split_whitespace().collect::<Vec<_>>(),
        ["alpha", "200000"]
    );
    let back = client_dir.join("back");
    let mut rsync = client.cmd("rsync");
    rsync
        .args(["-a", "-e", &rsh])
        .arg(format!("ssh-box:{workdir}/tree/"))
        .arg(&back);
    let out = run(rsync, None, 120);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        std::fs::read(back.join("sub").join("b.bin")).unwrap(),
        std::fs::read(tree.join("sub").join("b.bin")).unwrap()
    );

    // An --owner that is gone: the edge cannot route it, one unrouted
    // retry, and the connection still works.
    let unavailable = c.edge_requests("hinted", "unavailable");
    let unhinted = c.edge_requests("unhinted", "forwarded");
    let out = client.ssh(
        &proxy_with(Some(GONE)),
        &["ssh-box", "echo via-retry"],
        None,
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "via-retry\n");
    assert_eq!(c.edge_requests("hinted", "unavailable"), unavailable + 1.0);
    assert_eq!(c.edge_requests("unhinted", "forwarded"), unhinted + 1.0);

    // A live replica that is not the owner relays it: no retry.
    let other = c.cluster.ids().into_iter().find(|id| *id != owner).unwrap();
    let unavailable = c.edge_requests("hinted", "unavailable");
    let hinted = c.edge_requests("hinted", "forwarded");
    let peer_before = c.metric_sum(&routed("peer", "tcp"));
    let out = client.ssh(
        &proxy_with(Some(&other)),
        &["ssh-box", "echo via-peer"],
        None,
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "via-peer\n");
    assert_eq!(c.metric_sum(&routed("peer", "tcp")), peer_before + 1.0);
    assert_eq!(c.edge_requests("hinted", "forwarded"), hinted + 1.0);
    assert_eq!(c.edge_requests("hinted", "unavailable"), unavailable);

    // A bad --owner is refused before any connection: one line.
    let out = client.ssh(&proxy_with(Some("no/such")), &["ssh-box", "true"], None);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("error: invalid_config: replica id"),
        "{out:?}"
    );
}

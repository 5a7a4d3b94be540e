//! `openshell ssh` and `openshell ssh-config` against the SSH server the
//! supervisor embeds, on a real 3-replica cluster: the host key learnt once
//! and pinned (strict checking), the remote exit code as ours, the owner
//! filled in (one `GetSandbox` per `openshell ssh`, none per connection of
//! the generated config), and scp, sftp and rsync through `ssh-config`.

mod common;

use std::process::{Command, Stdio};

use common::*;

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

#[test]
fn openshell_ssh_pins_the_host_key_and_ssh_config_serves_scp_sftp_and_rsync() {
    let c = Cluster::start();
    let (id, owner) = c.create_ready("ssh-embedded");
    let known_hosts = c
        .home
        .path()
        .join("config")
        .join("openshell")
        .join("known_hosts");

    // The first connection learns the key and pins it under the sandbox id.
    let out = c
        .cli()
        .args(["ssh", "ssh-embedded", "--", "echo hi-$((1+1)); exit 4"])
        .run(120);
    assert_eq!((out.code, out.stdout.as_str()), (4, "hi-2\n"), "{out:?}");
    let pinned = std::fs::read_to_string(&known_hosts).expect("known_hosts written");
    let alias = format!("openshell-{id}");
    assert!(pinned.lines().all(|l| l.starts_with(&alias)), "{pinned}");
    assert!(!pinned.is_empty());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&known_hosts)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    // Pinned: the next one reads the file and looks the sandbox up once.
    let gets = c.metric_sum(GET_SANDBOX_OK);
    let local = c
        .replica(&owner)
        .metric(&routed("local", "ssh"))
        .unwrap_or(0.0);
    let out = c
        .cli()
        .args(["ssh", "ssh-embedded", "--", "id -u"])
        .run(120);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(std::fs::read_to_string(&known_hosts).unwrap(), pinned);
    assert_eq!(c.metric_sum(GET_SANDBOX_OK), gets + 1.0);
    assert_eq!(
        c.replica(&owner)
            .metric(&routed("local", "ssh"))
            .unwrap_or(0.0),
        local + 1.0
    );

    // A stale pin (another key under the alias) is replaced by the key the
    // gateway vouches for; strict checking still applies to the session.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(made.success());
    let other_pub = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let blob = other_pub.split_whitespace().nth(1).unwrap();
    std::fs::write(&known_hosts, format!("{alias} ssh-ed25519 {blob}\n")).unwrap();
    let out = c.cli().args(["ssh", "ssh-embedded", "--", "true"]).run(120);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(std::fs::read_to_string(&known_hosts).unwrap(), pinned);

    // ssh-config: a Host block for the tools that read ssh_config.
    let out = c.cli().args(["ssh-config", "ssh-embedded"]).run(60);
    out.success();
    assert!(
        out.stdout.contains(&format!("--owner '{owner}'")),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains(TOKEN),
        "the token leaked into ssh_config"
    );
    let config = dir.path().join("ssh_config");
    std::fs::write(&config, &out.stdout).unwrap();
    let tool = |program: &str| {
        let mut cmd = Command::new(program);
        cmd.env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", c.home.path().join("config"))
            .env("OPENSHELL_TOKEN", TOKEN);
        cmd
    };
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
    let local_file = dir.path().join("data.bin");
    std::fs::write(&local_file, &data).unwrap();
    let gets = c.metric_sum(GET_SANDBOX_OK);
    let mut scp = tool("scp");
    scp.arg("-F")
        .arg(&config)
        .arg(&local_file)
        .arg("ssh-embedded:data.bin");
    let out = run(scp, None, 120);
    assert_eq!(out.code, 0, "{out:?}");
    let back_file = dir.path().join("back.bin");
    let mut scp = tool("scp");
    scp.arg("-F")
        .arg(&config)
        .arg("ssh-embedded:data.bin")
        .arg(&back_file);
    let out = run(scp, None, 120);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        std::fs::read(&back_file).unwrap() == data,
        "scp changed the data"
    );
    let mut sftp = tool("sftp");
    sftp.arg("-F")
        .arg(&config)
        .args(["-b", "-", "ssh-embedded"]);
    let out = run(sftp, Some(b"ls -1\n"), 60);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("data.bin"), "{out:?}");
    let mut rsync = tool("rsync");
    rsync
        .args(["-a", "-e", &format!("ssh -F {}", config.display())])
        .arg("ssh-embedded:data.bin")
        .arg(dir.path().join("rsynced.bin"));
    let out = run(rsync, None, 120);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(std::fs::read(dir.path().join("rsynced.bin")).unwrap() == data);
    // Every connection of the generated config went without a lookup.
    assert_eq!(c.metric_sum(GET_SANDBOX_OK), gets);

    // A missing sandbox: 255 (the CLI failed, not the remote side), one line.
    c.cli()
        .args(["ssh", "no-such", "--", "true"])
        .run(60)
        .one_line_error(255, "not_found");
}

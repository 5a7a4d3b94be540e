//! Every `openshell` command against a real 3-replica cluster behind the
//! built-in edge: tables and `--json`, exit codes (the remote one for
//! `exec`), stdin, forwards, settings, providers, watch, and bad input that
//! gives one clear line and a non-zero exit.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use openshell_testkit::wait_until;

/// An echo server in `sandbox`'s network (its own under isolation): the
/// CLI execs `readlink` there to find it.
fn echo_server(c: &Cluster, sandbox: &str) -> u16 {
    let out = c
        .cli()
        .args(["exec", sandbox, "--"])
        .args(openshell_testkit::netns::PRINT_NETNS)
        .run(30);
    let net = openshell_testkit::netns::SandboxNet::from_link(&out.success().stdout)
        .expect("the sandbox's network namespace");
    let listener = net.bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(false).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut read = socket.try_clone().unwrap();
                let mut write = socket;
                let _ = std::io::copy(&mut read, &mut write);
                let _ = write.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

#[test]
fn every_command_against_a_three_replica_cluster() {
    let c = Cluster::start();

    // create (waits for READY), get, list: tables and JSON.
    let (id, owner) = c.create_ready("cli-a");
    assert!(c.cluster.ids().contains(&owner), "{owner}");
    let out = c.cli().args(["sandbox", "get", "cli-a"]).run(30);
    out.success();
    let header = out.stdout.lines().next().unwrap();
    assert!(
        header.starts_with("NAME") && header.contains("PHASE"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("cli-a") && out.stdout.contains("READY") && out.stdout.contains(&id)
    );
    let got = c.cli().args(["sandbox", "get", "cli-a", "--json"]).run(30);
    let got = got.success().json();
    assert_eq!(got["id"], id.as_str());
    assert_eq!(got["owner"], owner.as_str());
    let labelled = c
        .cli()
        .args([
            "sandbox",
            "create",
            "cli-b",
            "-l",
            "team=x",
            "-e",
            "SECRET=hunter2",
            "--memory",
            "256Mi",
            "--cpu",
            "1.5",
            "--json",
        ])
        .run(60);
    let labelled = labelled.success().json();
    assert_eq!(labelled["labels"]["team"], "x");
    // The limits asked for, in the gateway's form, and its default pids.
    assert_eq!(
        labelled["limits"],
        serde_json::json!({"memory": "256Mi", "cpu": "1500m", "pids": 1024}),
        "{labelled}"
    );
    assert_eq!(labelled["environment_keys"][0], "SECRET");
    assert!(
        !labelled.to_string().contains("hunter2"),
        "a value leaked: {labelled}"
    );
    let listed = c.cli().args(["sandbox", "list", "--json"]).run(30);
    let names: Vec<String> = listed
        .success()
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["cli-a", "cli-b"]);
    let selected = c
        .cli()
        .args(["sandbox", "list", "-l", "team=x", "--json"])
        .run(30);
    assert_eq!(selected.success().json().as_array().unwrap().len(), 1);
    let table = c.cli().args(["sandbox", "ls"]).run(30);
    assert_eq!(
        table.success().stdout.lines().count(),
        3,
        "{}",
        table.stdout
    );

    // exec: streams split, the remote exit code is ours.
    let out = c
        .cli()
        .args([
            "exec",
            "cli-a",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .run(60);
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    let out = c.cli().args(["exec", "cli-a", "--", "true"]).run(60);
    assert_eq!(out.success().stdout, "");
    // -e, -w.
    let out = c
        .cli()
        .args([
            "exec",
            "cli-a",
            "-e",
            "GREETING=hi",
            "-w",
            "/",
            "--",
            "sh",
            "-c",
            "echo $GREETING; pwd",
        ])
        .run(60);
    assert_eq!(out.success().stdout, "hi\n/\n");
    // -i: stdin reaches the command, its EOF ends it.
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let out = c
        .cli()
        .args(["exec", "-i", "cli-a", "--", "sha256sum"])
        .stdin(data.clone())
        .run(60);
    let want = {
        use std::process::{Command, Stdio};
        let mut child = Command::new("sha256sum")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    assert_eq!(out.success().stdout, want);
    // Without -i stdin is not read.
    let out = c
        .cli()
        .args(["exec", "cli-a", "--", "cat"])
        .stdin("ignored")
        .run(60);
    assert_eq!(out.success().stdout, "");
    // exec's own failures exit 255, one line.
    c.cli()
        .args(["exec", "nope", "--", "true"])
        .run(30)
        .one_line_error(255, "not_found");
    c.cli()
        .args(["exec", "-t", "cli-a", "--", "sh"])
        .run(30)
        .one_line_error(255, "invalid_argument");

    // forward: LOCAL 0 picks a port; Ctrl-C (SIGINT) ends it with exit 0.
    let port = echo_server(&c, "cli-a");
    let mut child = c
        .cli()
        .args(["forward", "cli-a", &format!("0:{port}")])
        .spawn();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    let local = line
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_owned();
    for round in 0..3 {
        let mut socket = TcpStream::connect(&local).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let payload = format!("round {round} ").repeat(10_000);
        socket.write_all(payload.as_bytes()).unwrap();
        socket.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = String::new();
        socket.read_to_string(&mut back).unwrap();
        assert_eq!(back, payload);
    }
    openshell_testkit::signal(child.id() as i32, libc::SIGINT);
    let status = wait_output(&mut child, None, 20);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        TcpStream::connect(&local).is_err(),
        "the listener outlived the forward"
    );
    c.cli()
        .args(["forward", "cli-a", "80:0"])
        .run(10)
        .one_line_error(1, "invalid_argument");
    c.cli()
        .args(["forward", "nope", "0:80"])
        .run(30)
        .one_line_error(1, "not_found");

    // config: sandbox and global settings.
    c.cli()
        .args(["config", "set", "cli-a", "demo.greeting", "hello"])
        .run(30)
        .success();
    let out = c
        .cli()
        .args(["config", "get", "cli-a", "demo.greeting"])
        .run(30);
    assert_eq!(out.success().stdout, "hello\n");
    c.cli()
        .args([
            "config",
            "set",
            "--type",
            "int",
            "cli-a",
            "demo.count",
            "42",
        ])
        .run(30)
        .success();
    c.cli()
        .args([
            "config",
            "set",
            "--global",
            "--type",
            "bool",
            "demo.flag",
            "true",
        ])
        .run(30)
        .success();
    let all = c.cli().args(["config", "get", "cli-a", "--json"]).run(30);
    let all = all.success().json();
    assert_eq!(all["settings"]["demo.count"]["value"], 42);
    assert_eq!(all["settings"]["demo.flag"]["value"], true);
    assert_eq!(all["settings"]["demo.flag"]["scope"], "global");
    assert_eq!(all["settings"]["demo.greeting"]["scope"], "sandbox");
    let table = c.cli().args(["config", "get", "cli-a"]).run(30);
    assert!(
        table.success().stdout.starts_with("KEY"),
        "{}",
        table.stdout
    );
    let unset = c
        .cli()
        .args(["config", "unset", "cli-a", "demo.greeting", "--json"])
        .run(30);
    assert_eq!(unset.success().json()["deleted"], true);
    c.cli()
        .args(["config", "get", "cli-a", "demo.greeting"])
        .run(30)
        .one_line_error(1, "not_found");
    c.cli()
        .args(["config", "unset", "--global", "demo.flag"])
        .run(30)
        .success();
    c.cli()
        .args(["config", "set", "--type", "bool", "cli-a", "k", "maybe"])
        .run(10)
        .one_line_error(1, "invalid_argument");
    c.cli()
        .args(["config", "set", "cli-a", "bad key!", "v"])
        .run(30)
        .one_line_error(1, "invalid_argument");
    c.cli()
        .args(["config", "set", "--global", "cli-a", "k", "v"])
        .run(10)
        .one_line_error(1, "invalid_argument");

    // providers: values go in, never come out.
    let env_file = c.home.path().join("provider.env");
    std::fs::write(&env_file, "# keys\nAPI_KEY=sk-very-secret\n").unwrap();
    let out = c
        .cli()
        .args(["provider", "create", "p1", "-e", "REGION=eu"])
        .arg_path("--env-file", &env_file)
        .args(["--json"])
        .run(30);
    let created = out.success().json();
    assert_eq!(
        created["environment_keys"],
        serde_json::json!(["API_KEY", "REGION"])
    );
    assert!(!out.stdout.contains("sk-very-secret") && !out.stderr.contains("sk-very-secret"));
    let out = c
        .cli()
        .args(["provider", "attach", "p1", "cli-a", "--json"])
        .run(30);
    assert_eq!(out.success().json()["providers"], serde_json::json!(["p1"]));
    let seen = wait_until(Duration::from_secs(30), || {
        c.cli()
            .args(["exec", "cli-a", "--", "sh", "-c", "echo $REGION"])
            .run(60)
            .stdout
            == "eu\n"
    });
    assert!(
        seen,
        "the attached provider's environment never reached exec"
    );
    let out = c.cli().args(["provider", "detach", "p1", "cli-a"]).run(30);
    assert!(out.success().stdout.contains("detached"), "{}", out.stdout);
    c.cli()
        .args(["provider", "create", "p1"])
        .run(30)
        .one_line_error(1, "already_exists");
    c.cli()
        .args(["provider", "attach", "missing", "cli-a"])
        .run(30)
        .one_line_error(1, "not_found");

    // logs: what ran in the sandbox, filtered; -f follows new lines.
    let recorded = wait_until(Duration::from_secs(30), || {
        let out = c
            .cli()
            .args(["logs", "cli-a", "--source", "sandbox", "--json"])
            .run(30);
        out.stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|l| l["message"] == "exec finished" && l["source"] == "sandbox")
    });
    assert!(recorded, "no exec line in the sandbox's logs");
    let out = c.cli().args(["logs", "cli-a", "--tail", "1"]).run(30);
    assert_eq!(out.success().stdout.lines().count(), 1, "{}", out.stdout);
    c.cli()
        .args(["logs", "cli-a", "--level", "loud"])
        .run(30)
        .one_line_error(1, "invalid_argument");
    let out = c.cli().args(["logs", "cli-a", "--since", "soon"]).run(30);
    assert_eq!(out.code, 2, "{out:?}");
    let mut follow = Background(c.cli().args(["logs", "cli-a", "-f", "--tail", "1"]).spawn());
    let followed = BufReader::new(follow.0.stdout.take().unwrap());
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in followed.lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // The replayed line says the follow is under way.
    lines_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("logs -f printed nothing");
    let out = c
        .cli()
        .args(["exec", "cli-a", "--", "sh", "-c", "exit 5"])
        .run(60);
    assert_eq!(out.code, 5, "{out:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = false;
    while let Ok(next) =
        lines_rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
    {
        if next.contains("exec finished") && next.contains("exit_code=5") {
            seen = true;
            break;
        }
    }
    stop(&mut follow.0);
    assert!(seen, "logs -f never printed the new exec");

    // watch: a snapshot, then changes, until the sandbox is gone (exit 0).
    let mut watch = c
        .cli()
        .args(["sandbox", "watch", "cli-b", "--json"])
        .spawn();
    let mut lines = BufReader::new(watch.stdout.take().unwrap());
    let mut first = String::new();
    lines.read_line(&mut first).unwrap();
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["phase"], "READY");
    let out = c.cli().args(["sandbox", "delete", "cli-b"]).run(30);
    assert!(
        out.success().stdout.contains("sandbox cli-b deleted"),
        "{}",
        out.stdout
    );
    let rest = wait_output(&mut watch, None, 60);
    assert_eq!(rest.code, 0, "{rest:?}");
    let mut tail = String::new();
    lines.read_to_string(&mut tail).unwrap();
    let last: serde_json::Value =
        serde_json::from_str(tail.lines().last().unwrap_or("{}")).unwrap();
    assert!(
        last["phase"] == "DELETED" || last["phase"] == "DELETING",
        "watch ended on {last}"
    );

    // delete --wait, then the sandbox is gone: one line, exit 1.
    let out = c
        .cli()
        .args(["sandbox", "delete", "cli-a", "--wait", "--json"])
        .run(120);
    assert_eq!(out.success().json()[0]["name"], "cli-a");
    let out = c.cli().args(["sandbox", "get", "cli-a"]).run(30);
    out.one_line_error(1, "not_found");
    assert!(out.stderr.contains("cli-a"), "{}", out.stderr);

    // Bad input: one clear line, non-zero, nothing changed.
    c.cli()
        .args(["sandbox", "create", "Bad_Name"])
        .run(30)
        .one_line_error(1, "invalid_argument");
    let listed = c.cli().args(["sandbox", "list", "--json"]).run(30);
    assert_eq!(listed.success().json(), serde_json::json!([]));
    c.cli()
        .args(["sandbox", "create", "x", "--timeout", "0"])
        .run(10)
        .one_line_error(1, "invalid_argument");
    let out = c
        .cli()
        .args(["sandbox", "create", "x", "--memory", "lots"])
        .run(30);
    out.one_line_error(1, "invalid_argument");
    assert!(out.stderr.contains("limits.memory"), "{}", out.stderr);
    c.cli()
        .env("OPENSHELL_TOKEN", "wrong-token")
        .args(["sandbox", "list"])
        .run(30)
        .one_line_error(1, "unauthenticated");
    c.cli()
        .env_remove("OPENSHELL_TOKEN")
        .args(["sandbox", "list"])
        .run(30)
        .one_line_error(1, "unauthenticated");
    let out = c
        .cli()
        .env("OPENSHELL_TOKEN", "wrong-token-abc")
        .args(["sandbox", "list"])
        .run(30);
    assert!(
        !out.stderr.contains("wrong-token-abc"),
        "the token leaked: {}",
        out.stderr
    );
    c.cli()
        .args(["--endpoint", "not a url", "sandbox", "list"])
        .run(10)
        .one_line_error(1, "invalid_config");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    c.cli()
        .args([
            "--endpoint",
            &format!("http://127.0.0.1:{closed}"),
            "sandbox",
            "list",
        ])
        .run(30)
        .one_line_error(1, "connect");
}

#[test]
fn settings_come_from_flags_then_environment_then_the_config_file() {
    let c = Cluster::start();
    let config_dir = c.home.path().join("config").join("openshell");
    std::fs::create_dir_all(&config_dir).unwrap();
    let file = config_dir.join("config.toml");
    std::fs::write(
        &file,
        format!("endpoint = \"{}\"\ntoken = \"{TOKEN}\"\n", c.edge.url),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let bare = || Cli::new(c.home.path());
    // The file alone.
    let out = bare().args(["sandbox", "list"]).run(30);
    assert_eq!(out.success().stderr, "");
    // The environment wins over the file.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    bare()
        .env("OPENSHELL_ENDPOINT", &closed)
        .args(["sandbox", "list"])
        .run(30)
        .one_line_error(1, "connect");
    bare()
        .env("OPENSHELL_TOKEN", "other")
        .args(["sandbox", "list"])
        .run(30)
        .one_line_error(1, "unauthenticated");
    // An empty variable counts as unset.
    bare()
        .env("OPENSHELL_ENDPOINT", "")
        .args(["sandbox", "list"])
        .run(30)
        .success();
    // Flags win over the environment.
    bare()
        .env("OPENSHELL_ENDPOINT", &closed)
        .args(["--endpoint", &c.edge.url, "sandbox", "list"])
        .run(30)
        .success();
    let token_file = c.home.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    bare()
        .env("OPENSHELL_TOKEN", "other")
        .args(["sandbox", "list"])
        .arg_path("--token-file", &token_file)
        .run(30)
        .success();
    bare()
        .env("OPENSHELL_TOKEN", "other")
        .args(["--token", TOKEN, "sandbox", "list"])
        .run(30)
        .success();
    // XDG_CONFIG_HOME unset: ~/.config.
    let home_config = c.home.path().join(".config").join("openshell");
    std::fs::create_dir_all(&home_config).unwrap();
    std::fs::copy(&file, home_config.join("config.toml")).unwrap();
    bare()
        .env_remove("XDG_CONFIG_HOME")
        .args(["sandbox", "list"])
        .run(30)
        .success();
    // A readable token file is warned about; a bad file is one line.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let out = bare().args(["sandbox", "list"]).run(30);
    assert!(
        out.success().stderr.starts_with("warning: "),
        "{}",
        out.stderr
    );
    std::fs::write(&file, "endpoint = \"http://127.0.0.1:1\"\ntokn = \"x\"\n").unwrap();
    let out = bare().args(["sandbox", "list"]).run(30);
    out.one_line_error(1, "invalid_config");
    assert!(
        out.stderr.contains("config.toml") && out.stderr.contains("line 2"),
        "{}",
        out.stderr
    );
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let home = tempfile::tempdir().unwrap();
    for argv in [
        &["sandbox", "frobnicate"][..],
        &["exec", "box"],
        &["--bogus", "sandbox", "list"],
        &["ssh-proxy", "box", "--port", "0"],
        &["ssh-proxy", "box", "--port", "70000"],
        &["sandbox", "create", "-e", "NOEQUALS"],
        &["completions", "tcsh"],
    ] {
        let out = Cli::new(home.path()).args(argv).run(10);
        out.one_line_error(2, "usage");
    }
    let help = Cli::new(home.path()).args(["--help"]).run(10);
    assert!(
        help.success().stdout.contains("Exit codes"),
        "{}",
        help.stdout
    );
    let version = Cli::new(home.path()).args(["--version"]).run(10);
    assert!(version.success().stdout.starts_with("openshell "));
    // ssh-proxy refuses names it would not put on a command line.
    Cli::new(home.path())
        .args(["ssh-proxy", "a;b"])
        .run(10)
        .one_line_error(1, "invalid_argument");
    Cli::new(home.path())
        .args(["ssh", "$(x)"])
        .run(10)
        .one_line_error(255, "invalid_argument");
}

#[test]
fn completions_for_bash_zsh_and_fish() {
    let home = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = Cli::new(home.path()).args(["completions", shell]).run(10);
        assert!(out.success().stdout.contains("ssh-proxy"), "{shell}");
    }
    // The bash script parses.
    let out = Cli::new(home.path()).args(["completions", "bash"]).run(10);
    let script = home.path().join("openshell.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn gateway_up_runs_the_gateway_beside_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut up = Cli::new(home.path())
        .args([
            "gateway",
            "up",
            "--replicas",
            "1",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .arg_path("--data-dir", &home.path().join("data"))
        .spawn();
    // `up` says it serves (and only then handles Ctrl-C) on its last line.
    let stdout = up.stdout.take().unwrap();
    let (said, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("Ctrl-C stops it") {
                let _ = said.send(());
            }
        }
    });
    let announced = ready.recv_timeout(Duration::from_secs(60)).is_ok();
    let serving = announced
        && Cli::new(home.path())
            .args(["--endpoint", &endpoint, "sandbox", "list"])
            .run(30)
            .code
            == 0;
    // Ctrl-C reaches the gateway itself (the CLI replaced itself with it).
    openshell_testkit::signal(up.id() as i32, libc::SIGINT);
    let out = wait_output(&mut up, None, 60);
    assert!(serving, "gateway up never served: {}", out.stderr);
    assert_eq!(out.code, 0, "{out:?}");
}

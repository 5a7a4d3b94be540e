//! Sandbox isolation, probed from inside real sandboxes.
//!
//! Each probe is a command run in a sandbox that tries to reach something
//! that is not the sandbox's own, with a positive control: the same kind of
//! operation on something that *is* its own, which must succeed, so a probe
//! cannot pass because its path or method was wrong. The expected outcome of
//! every probe per isolation mode is the table in `docs/ARCHITECTURE.md`
//! (section "Isolation probes"); this test reads that table and asserts it.
//!
//! The gateway runs with authentication and a peer token, its secrets in
//! its environment, as a deployment would.

mod common;
mod config_util;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use openshell_testkit::{Gateway, GatewayOptions, marker, metric_value, sandbox_token};

const PEER_TOKEN: &str = "peer-secret-for-isolation-probes-7d41";
const PYTHON: &str = "/usr/bin/python3";

/// A probe: `attack` exits 0 when it got through; `control` must exit 0.
/// With `secrets`, an attack that ran counts only if its output holds one
/// of the cluster's secrets (reading a file with none in it exposes nothing).
struct Probe {
    name: &'static str,
    attack: &'static str,
    control: &'static str,
    secrets: bool,
}

/// Python one-liners the probes share (argv[1] is the target).
const PTRACE: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
# PTRACE_SEIZE does not stop the target; our exit detaches.
sys.exit(0 if libc.ptrace(0x4206, int(sys.argv[1]), 0, 0) == 0 else 1)
"#;
const UMOUNT: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.umount2(sys.argv[1].encode(), 2) == 0 else 1)
"#;
const MOVE: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("moved", exist_ok=True)
MS_MOVE = 8192
sys.exit(0 if libc.mount(sys.argv[1].encode(), b"moved", None, MS_MOVE, None) == 0 else 1)
"#;
const FDS: &str = r#"
import os, sys
extra = []
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue  # the descriptor listdir used, closed by now
    if int(fd) > 2:
        extra.append(target)
print(extra)
sys.exit(0 if extra else 1)
"#;

/// Connects to argv[1]:argv[2] within 3 s: exit 0 when connected.
const CONNECT: &str = r#"
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError as err:
    print(err)
    sys.exit(1)
"#;
/// The control of every network probe: a listener of its own on loopback,
/// reached the way the attacks try theirs.
/// (Its port goes through a file of its own, empty before the listener
/// starts: a file shared with an earlier control could name a closed port.)
const OWN_PORT: &str = r#"f=$(mktemp -p .); $PY -c 'import socket; s = socket.create_server(("127.0.0.1", 0)); print(s.getsockname()[1], flush=True); import time; time.sleep(30)' > $f & for i in $(seq 50); do [ -s $f ] && break; sleep 0.1; done; $PY -c "$CONNECT" 127.0.0.1 $(cat $f); r=$?; kill $!; rm -f $f; exit $r"#;

const PROBES: &[Probe] = &[
    Probe {
        name: "net-gateway-port",
        attack: r#"$PY -c "$CONNECT" 127.0.0.1 $GW_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "net-edge-port",
        attack: r#"$PY -c "$CONNECT" 127.0.0.1 $EDGE_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "net-postgres-port",
        attack: r#"$PY -c "$CONNECT" 127.0.0.1 $PG_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "net-other-sandbox-port",
        attack: r#"$PY -c "$CONNECT" 127.0.0.1 $OTHER_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "net-host-loopback-service",
        attack: r#"$PY -c "$CONNECT" 127.0.0.1 $HOST_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "net-host-address",
        attack: r#"$PY -c "$CONNECT" $HOST_ADDR $HOST_WIDE_PORT"#,
        control: OWN_PORT,
        secrets: false,
    },
    Probe {
        name: "supervisor-environ",
        attack: r#"cat /proc/$SUP/environ | tr '\0' '\n'"#,
        control: r#"cat /proc/self/environ | tr '\0' '\n' | grep -q OPENSHELL_SANDBOX_ID"#,
        secrets: true,
    },
    Probe {
        name: "gateway-environ",
        attack: r#"cat /proc/$GW/environ | tr '\0' '\n'"#,
        control: r#"cat /proc/self/environ | tr '\0' '\n' | grep -q OPENSHELL_SANDBOX_ID"#,
        secrets: true,
    },
    Probe {
        name: "supervisor-cmdline",
        attack: r#"cat /proc/$SUP/cmdline | tr '\0' ' '"#,
        control: r#"cat /proc/self/cmdline | tr '\0' ' ' | grep -q cmdline"#,
        secrets: true,
    },
    Probe {
        name: "exec-environment",
        attack: "env",
        control: "env | grep -q OPENSHELL_SANDBOX_ID",
        secrets: true,
    },
    Probe {
        name: "token-descriptor",
        attack: r#"$PY -c "$FDS""#,
        control: r#"echo mine > fd.txt; exec 7< fd.txt; $PY -c "$FDS""#,
        secrets: false,
    },
    Probe {
        name: "store-file",
        attack: r#"head -c 15 "$DATA/store/gateway.db" | grep -q 'SQLite format'"#,
        control: r#"printf 'SQLite format 3' > own.db; head -c 15 own.db | grep -q 'SQLite format'"#,
        secrets: false,
    },
    Probe {
        name: "other-sandbox-files",
        attack: r#"cat "$DATA/sandboxes/$OTHER/work/secret.txt""#,
        control: r#"echo mine > mine.txt; cat "$HOME/mine.txt""#,
        secrets: false,
    },
    Probe {
        name: "other-sandbox-processes",
        attack: r#"grep -qs "TEST_MARKER=$OTHER_MARK" /proc/[0-9]*/environ"#,
        control: r#"TEST_MARKER=$OWN_MARK sleep 30 & sleep 0.3; grep -qs "TEST_MARKER=$OWN_MARK" /proc/[0-9]*/environ; r=$?; kill $!; exit $r"#,
        secrets: false,
    },
    Probe {
        name: "signal-supervisor",
        attack: "kill -0 $SUP",
        control: "kill -0 $$",
        secrets: false,
    },
    Probe {
        name: "signal-gateway",
        attack: "kill -0 $GW",
        control: "kill -0 $$",
        secrets: false,
    },
    Probe {
        name: "ptrace-supervisor",
        attack: r#"$PY -c "$PTRACE" $SUP"#,
        control: r#"sleep 30 & $PY -c "$PTRACE" $!; r=$?; kill $!; exit $r"#,
        secrets: false,
    },
    Probe {
        name: "ptrace-gateway",
        attack: r#"$PY -c "$PTRACE" $GW"#,
        control: r#"sleep 30 & $PY -c "$PTRACE" $!; r=$?; kill $!; exit $r"#,
        secrets: false,
    },
    Probe {
        name: "unmount-hiding-mount",
        attack: r#"$PY -c "$UMOUNT" "$DATA" || unshare -Urm $PY -c "$UMOUNT" "$DATA""#,
        control: r#"mkdir -p d; unshare -Urm sh -c 'mount -t tmpfs t d && $PY -c "$UMOUNT" d'"#,
        secrets: false,
    },
    Probe {
        name: "move-hiding-mount",
        attack: r#"unshare -Urm $PY -c "$MOVE" "$DATA""#,
        control: r#"mkdir -p d; unshare -Urm sh -c 'mount -t tmpfs t d && $PY -c "$MOVE" d'"#,
        secrets: false,
    },
];

/// An address of this host that is not loopback (its first IPv4 address
/// from `hostname -I`): what a sandbox with a route out could try instead
/// of 127.0.0.1.
fn host_address() -> std::net::IpAddr {
    let output = Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .expect("a non-loopback address on this host")
}

/// The expected outcome of every probe for `mode`, from the docs' table.
fn documented(mode: &str) -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ARCHITECTURE.md"),
    )
    .expect("docs/ARCHITECTURE.md");
    let section = doc
        .split("### Isolation probes")
        .nth(1)
        .expect("an \"Isolation probes\" section");
    let mut rows = section.lines().filter(|l| l.starts_with('|'));
    let header: Vec<String> = rows
        .next()
        .expect("table header")
        .split('|')
        .map(|c| c.trim().trim_matches('`').to_owned())
        .collect();
    let column = header
        .iter()
        .position(|c| c.starts_with(mode))
        .unwrap_or_else(|| panic!("no column for {mode} in {header:?}"));
    rows.skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            (
                cells[1].trim_matches('`').to_owned(),
                cells[column].to_owned(),
            )
        })
        .collect()
}

fn gateway(isolation: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        env: vec![("OPENSHELL_GATEWAY_TOKENS".into(), TOKEN.into())],
        peer_token: Some(PEER_TOKEN.into()),
        extra_args: vec!["--isolation".into(), isolation.into()],
        ..GatewayOptions::default()
    })
}

async fn run(client: &mut Client, sandbox: &str, script: &str, env: &[(&str, &str)]) -> ExecResult {
    let mut request = exec_request(sandbox, &["sh", "-c", script]);
    for (key, value) in env {
        request
            .environment
            .insert((*key).to_owned(), (*value).to_owned());
    }
    exec(client, request).await.expect("exec")
}

async fn probe_all(isolation: &str) {
    let gw = gateway(isolation);
    assert_eq!(
        gw.metric(&format!(
            "openshell_server_sandbox_isolation{{mode=\"{isolation}\"}}"
        )),
        Some(1.0),
        "{}",
        gw.metrics()
    );
    let mut client = client(&gw).await;
    let me = create_ready(&mut client, "prober").await;
    let other = create_ready(&mut client, "neighbour").await;
    let (my_id, other_id) = (me.metadata.unwrap().id, other.metadata.unwrap().id);
    let store = gw.store_dir();
    let supervisor =
        std::fs::read_to_string(store.join("sandboxes").join(&my_id).join("supervisor.pid"))
            .expect("supervisor.pid")
            .trim()
            .to_owned();
    let gateway_pid = gw.pid().expect("gateway pid").to_string();

    // The neighbour has a file and a running process of its own.
    let other_mark = marker();
    run(
        &mut client,
        "neighbour",
        "echo neighbour-secret > secret.txt",
        &[],
    )
    .await;
    let mut hold = exec_request("neighbour", &["sleep", "300"]);
    hold.environment
        .insert("TEST_MARKER".into(), other_mark.clone());
    let held = client.exec_sandbox(hold).await.expect("exec").into_inner();
    let deadline = Instant::now() + Duration::from_secs(10);
    while openshell_testkit::pids_with_env("TEST_MARKER", &other_mark).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the neighbour's process did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Network targets: the gateway's own port, an edge, PostgreSQL, a port
    // the neighbour listens on (in its own network), a loopback service of
    // the host, and a service on the host's non-loopback address.
    let edge = openshell_testkit::Edge::start(&[("gw-0", gw.url.as_str())]);
    let pg = openshell_testkit::cluster::Postgres::start();
    let neighbour_net = sandbox_net(&mut client, "neighbour").await;
    let neighbour_listener = neighbour_net.bind("127.0.0.1:0").unwrap();
    let host_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_addr = host_address();
    let host_wide = std::net::TcpListener::bind((host_addr, 0)).unwrap();
    let ports = [
        ("GW_PORT", gw.grpc_addr.port()),
        ("EDGE_PORT", edge.grpc_addr.port()),
        ("PG_PORT", pg.port),
        (
            "OTHER_PORT",
            neighbour_listener.local_addr().unwrap().port(),
        ),
        ("HOST_PORT", host_listener.local_addr().unwrap().port()),
        ("HOST_WIDE_PORT", host_wide.local_addr().unwrap().port()),
    ]
    .map(|(key, port)| (key, port.to_string()));
    let host_addr = host_addr.to_string();

    let secrets = [
        TOKEN.to_owned(),
        PEER_TOKEN.to_owned(),
        sandbox_token(&store, &my_id).expect("token"),
        sandbox_token(&store, &other_id).expect("token"),
        "OPENSHELL_SANDBOX_TOKEN".to_owned(),
        "OPENSHELL_PEER_TOKEN".to_owned(),
        "OPENSHELL_GATEWAY_TOKENS".to_owned(),
    ];
    let own_mark = marker();
    let data = store.display().to_string();
    let env = [
        ("SUP", supervisor.as_str()),
        ("GW", gateway_pid.as_str()),
        ("DATA", data.as_str()),
        ("OTHER", other_id.as_str()),
        ("OTHER_MARK", other_mark.as_str()),
        ("OWN_MARK", own_mark.as_str()),
        ("PY", PYTHON),
        ("PTRACE", PTRACE),
        ("UMOUNT", UMOUNT),
        ("MOVE", MOVE),
        ("FDS", FDS),
        ("CONNECT", CONNECT),
        ("HOST_ADDR", host_addr.as_str()),
    ];
    let env: Vec<(&str, &str)> = env
        .into_iter()
        .chain(ports.iter().map(|(key, port)| (*key, port.as_str())))
        .collect();

    let expected = documented(isolation);
    let mut measured = BTreeMap::new();
    for probe in PROBES {
        let control = run(&mut client, "prober", probe.control, &env).await;
        assert_eq!(
            control.exit_code,
            Some(0),
            "the control of {} failed, so the probe proves nothing: {}{}",
            probe.name,
            control.stdout_text(),
            String::from_utf8_lossy(&control.stderr)
        );
        let attack = run(&mut client, "prober", probe.attack, &env).await;
        let output = attack.stdout_text();
        let got_through = attack.exit_code == Some(0)
            && (!probe.secrets || secrets.iter().any(|s| output.contains(s.as_str())));
        let outcome = if got_through { "exposed" } else { "blocked" };
        measured.insert(probe.name.to_owned(), outcome.to_owned());
    }
    drop(held);

    let mut mismatches = Vec::new();
    for probe in PROBES {
        let want = expected
            .get(probe.name)
            .unwrap_or_else(|| panic!("probe {} is not in the docs' table", probe.name));
        let got = &measured[probe.name];
        // "n/a": the mode has nothing of that kind to attack (no hiding
        // mounts without namespaces); the control still ran above.
        if want != "n/a" && want != got {
            mismatches.push(format!("{}: documented {want}, measured {got}", probe.name));
        }
    }
    assert_eq!(
        expected.len(),
        PROBES.len(),
        "the docs' table and the probes differ: {:?}",
        expected.keys().collect::<Vec<_>>()
    );
    assert!(
        mismatches.is_empty(),
        "isolation {isolation}: {mismatches:#?}"
    );
}

#[tokio::test]
async fn probes_with_namespaces_match_the_documented_table() {
    probe_all("namespaces").await;
}

#[tokio::test]
async fn probes_without_isolation_match_the_documented_table() {
    probe_all("none").await;
}

#[tokio::test]
async fn sandbox_processes_run_unprivileged_in_their_own_namespaces() {
    let gw = gateway("namespaces");
    let mut client = client(&gw).await;
    let sandbox = create_ready(&mut client, "who").await;
    let id = sandbox.metadata.unwrap().id;
    let mark = marker();
    let out = run(
        &mut client,
        "who",
        "id -u; id -G; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; echo $$; ls /proc | grep -c '^[0-9]'",
        &[("TEST_MARKER", &mark)],
    )
    .await;
    let text = out.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "1000", "{text}");
    assert_eq!(lines[1], "1000", "no supplementary groups: {text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    // PID 1 is the sandbox's init; the shell is one of very few processes.
    let pid: u32 = lines[4].parse().unwrap();
    assert!(pid < 10, "{text}");
    let processes: u32 = lines[5].parse().unwrap();
    assert!(processes < 10, "the sandbox sees {processes} processes");
    // On the host, the sandbox's files belong to an unprivileged uid.
    use std::os::unix::fs::MetadataExt;
    let workdir = gw.store_dir().join("sandboxes").join(&id).join("work");
    let owner = std::fs::metadata(&workdir).unwrap().uid();
    assert!(owner >= 200_000, "workdir owned by {owner}");
    run(&mut client, "who", "echo x > made-here", &[]).await;
    assert_eq!(
        std::fs::metadata(workdir.join("made-here")).unwrap().uid(),
        owner
    );
}

#[tokio::test]
async fn configuration_is_never_written_through_a_symlink() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: [
            vec!["--isolation".into(), "namespaces".into()],
            config_util::push_args(None),
        ]
        .concat(),
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    create_ready(&mut client, "sly").await;
    // The sandbox owns its workdir: it points .openshell at a host
    // directory the supervisor (root) could write to.
    let target = tempfile::tempdir().unwrap();
    let script = format!(
        "mv .openshell .moved-away && ln -s {} .openshell && echo ok",
        target.path().display()
    );
    assert_eq!(
        run(&mut client, "sly", &script, &[]).await.stdout_text(),
        "ok\n"
    );
    let rejected = config_util::results(&gw, "rejected");
    config_util::set(&mut client, "sly", "k", config_util::string("v")).await;
    config_util::wait_metric(
        &gw,
        r#"openshell_server_config_results_total{outcome="rejected"}"#,
        rejected + 1.0,
        Duration::from_secs(20),
    )
    .await;
    assert!(
        std::fs::read_dir(target.path()).unwrap().next().is_none(),
        "the supervisor wrote through the sandbox's symlink"
    );
}

/// Runs `openshell-gateway serve` as an unprivileged user (nobody), which
/// cannot map sandbox users: `namespaces` must refuse to start, `auto` must
/// fall back to `none` with a warning and say so in its metrics.
#[test]
fn without_privileges_namespaces_refuses_and_auto_falls_back_loudly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // Copies nobody can run wherever the checkout lives (under /root, say).
    let copy = |name: &str| {
        let to = dir.path().join(name);
        std::fs::copy(openshell_testkit::bin(name), &to).unwrap();
        to
    };
    let gateway_bin = copy("openshell-gateway");
    let supervisor_bin = copy("openshell-supervisor");
    let serve = |isolation: &str, name: &str| {
        let data = dir.path().join(name);
        let ready = dir.path().join(format!("{name}.ready"));
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&gateway_bin)
            .args([
                "serve",
                "--dev",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(&data)
            .arg("--ready-file")
            .arg(&ready)
            .args(["--isolation", isolation])
            .arg("--supervisor-bin")
            .arg(&supervisor_bin)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        (command.spawn().expect("setpriv"), ready)
    };

    let (child, _) = serve("namespaces", "strict");
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--isolation namespaces is not available"),
        "{stderr}"
    );

    let (mut child, ready) = serve("auto", "lenient");
    let deadline = Instant::now() + Duration::from_secs(30);
    let info = loop {
        if let Ok(text) = std::fs::read_to_string(&ready)
            && let Ok(info) = serde_json::from_str::<serde_json::Value>(&text)
        {
            break info;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("gateway exited: {status}");
        }
        assert!(Instant::now() < deadline, "gateway not ready");
        std::thread::sleep(Duration::from_millis(50));
    };
    let metrics_addr = info["metrics"].as_str().unwrap().to_owned();
    let mut stream = std::net::TcpStream::connect(&metrics_addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut metrics = String::new();
    stream.read_to_string(&mut metrics).unwrap();
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        metric_value(
            &metrics,
            "openshell_server_sandbox_isolation{mode=\"none\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(stderr.contains("SANDBOXES ARE NOT ISOLATED"), "{stderr}");
}

/// A forward to 127.0.0.1:PORT reaches the server the sandbox runs on its
/// own loopback, even when the host has a different server on the same
/// port number.
#[tokio::test]
async fn a_forward_reaches_the_sandboxs_own_server_not_the_hosts() {
    use tokio::io::AsyncWriteExt;
    let gw = gateway("namespaces");
    let mut client = client(&gw).await;
    create_ready(&mut client, "serves").await;
    // The host's server on the port: it answers "host" to anyone.
    let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = host.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = host.accept().await {
            let _ = conn.write_all(b"host").await;
        }
    });
    // The sandbox's server on the same port number: an echo.
    let script = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/scripts/sandbox-echo.py"),
    )
    .unwrap();
    let request = exec_request("serves", &["python3", "-c", &script, &port.to_string()]);
    let mut server = client
        .exec_sandbox(request)
        .await
        .expect("exec")
        .into_inner();
    let mut said = Vec::new();
    while !said.contains(&b'\n') {
        let event = tokio::time::timeout(Duration::from_secs(20), server.message())
            .await
            .expect("the sandbox's server starts within 20 s")
            .expect("exec stream")
            .expect("an event before the exit");
        match event.payload {
            Some(openshell_proto::exec_sandbox_event::Payload::Stdout(out)) => {
                said.extend_from_slice(&out.data)
            }
            Some(openshell_proto::exec_sandbox_event::Payload::Exit(exit)) => {
                panic!("the sandbox's server exited: {exit:?}")
            }
            _ => {}
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&said),
        format!("listening {port}\n")
    );
    // `echo` sends "ping" and asserts it comes back: the host's server
    // would have answered "host".
    common::forward::echo(&mut client, common::forward::init("serves", port, ""))
        .await
        .expect("forward to the sandbox's own port");
    drop(server);
}

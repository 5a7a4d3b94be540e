//! Resource limits, enforced on real sandboxes: a memory hog is killed by
//! its sandbox's limit (and the exit event says so), a fork bomb stops at
//! the process limit, a busy loop gets the CPU quota, and none of it slows
//! an exec in another sandbox down. Each limit has a positive control: the
//! same program in a sandbox without that limit does what it asked.
//!
//! The limits come from `spec.template.resources.limits` and the gateway's
//! defaults (`--sandbox-memory`, `--sandbox-pids`), enforced through the
//! supervisor's cgroups: the test needs a host where they can be written
//! (root here), and says so when they cannot.

mod common;

use std::time::{Duration, Instant};

use common::*;
use openshell_proto::{
    CreateSandboxRequest, GetSandboxRequest, SandboxSpec, SandboxTemplate, exec_sandbox_event,
};
use openshell_testkit::{Gateway, GatewayOptions};
use prost_types::value::Kind;
use prost_types::{Struct, Value};

/// Allocates argv[1] MiB and touches every page, then exits 0.
const HOG: &str = r#"
import sys
block = b"\x01" * (int(sys.argv[1]) << 20)
print(len(block) >> 20)
"#;
/// Forks children that wait on a pipe until argv[1] of them run or a fork
/// fails; prints how many were forked, then lets them go.
const FORKS: &str = r#"
import os, sys
r, w = os.pipe()
forked = 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    forked += 1
print(forked)
os.close(w)
"#;
/// Spins for argv[1] seconds of wall time, prints the CPU seconds it got.
const SPIN: &str = r#"
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
print(time.process_time())
"#;
/// A fork bomb: every process forks as fast as it can for argv[1] seconds.
const BOMB: &str = r#"
import os, sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        os.fork()
    except OSError:
        pass
"#;

fn text(value: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(value.to_owned())),
    }
}

fn number(value: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(value)),
    }
}

fn object(pairs: Vec<(&str, Value)>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct {
            fields: pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })),
    }
}

fn with_resources(name: &str, resources: Struct) -> CreateSandboxRequest {
    CreateSandboxRequest {
        name: name.to_owned(),
        spec: Some(SandboxSpec {
            template: Some(SandboxTemplate {
                resources: Some(resources),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn limits(pairs: Vec<(&str, Value)>) -> Struct {
    Struct {
        fields: [("limits".to_owned(), object(pairs))].into(),
    }
}

async fn create_limited(client: &mut Client, name: &str, pairs: Vec<(&str, Value)>) {
    client
        .create_sandbox(with_resources(name, limits(pairs)))
        .await
        .expect("create a limited sandbox");
    wait_phase(client, name, openshell_proto::SandboxPhase::Ready).await;
}

/// An exec's exit code and whether its exit event says the memory limit
/// killed it, with its stdout.
async fn run(client: &mut Client, sandbox: &str, argv: &[&str]) -> (i32, bool, String) {
    let stream = client
        .exec_sandbox(exec_request(sandbox, argv))
        .await
        .expect("exec")
        .into_inner();
    let mut stream = stream;
    let mut stdout = Vec::new();
    let mut exit = None;
    let read = async {
        while let Some(event) = stream.message().await.expect("exec stream") {
            match event.payload {
                Some(exec_sandbox_event::Payload::Stdout(out)) => stdout.extend(out.data),
                Some(exec_sandbox_event::Payload::Exit(e)) => {
                    exit = Some((e.exit_code, e.oom_killed))
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("exec finished within 60 s");
    let (code, oom) = exit.expect("an exit event");
    (
        code,
        oom,
        String::from_utf8_lossy(&stdout).trim().to_owned(),
    )
}

/// Runs an attacking program until it ends or its sandbox is deleted
/// (which ends its relay).
async fn attack(client: &mut Client, sandbox: &str, argv: &[&str]) {
    if let Ok(stream) = client.exec_sandbox(exec_request(sandbox, argv)).await {
        let mut stream = stream.into_inner();
        while let Ok(Some(_)) = stream.message().await {}
    }
}

/// A gateway whose sandboxes run with its default limits, refusing any it
/// cannot enforce (so on a host without writable cgroups these tests fail
/// with FAILED_PRECONDITION instead of passing unlimited).
fn start_gateway() -> Gateway {
    Gateway::start(GatewayOptions {
        extra_args: vec!["--resource-limits".into(), "required".into()],
        ..GatewayOptions::with_token(TOKEN)
    })
}

/// A file of sandbox `id`'s cgroup on this host (v1 layout, else v2).
fn cgroup_file(id: &str, controller: &str, file: &str) -> String {
    let candidates = [
        format!("/sys/fs/cgroup/{controller}/openshell/{id}/{file}"),
        format!(
            "/sys/fs/cgroup/openshell/{id}/{}",
            file.replace("oom_control", "events")
        ),
    ];
    candidates
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_else(|| panic!("no {file} for the sandbox's cgroup"))
}

#[tokio::test]
async fn a_memory_hog_is_killed_by_its_limit_and_the_exit_event_says_so() {
    let gw = start_gateway();
    let mut client = client(&gw).await;
    create_limited(&mut client, "lim-mem", vec![("memory", text("64Mi"))]).await;
    create_ready(&mut client, "lim-mem-free").await;

    let (code, oom, _) = run(&mut client, "lim-mem", &["python3", "-c", HOG, "256"]).await;
    assert_eq!(
        (code, oom),
        (137, true),
        "the hog was not killed for memory"
    );
    // Below the limit the same program runs, and the sandbox lives on.
    let (code, oom, out) = run(&mut client, "lim-mem", &["python3", "-c", HOG, "8"]).await;
    assert_eq!((code, oom, out.as_str()), (0, false, "8"));
    // Positive control: the default limit (4Gi) lets the hog through.
    let (code, oom, out) = run(&mut client, "lim-mem-free", &["python3", "-c", HOG, "256"]).await;
    assert_eq!((code, oom, out.as_str()), (0, false, "256"));
    // A process killed some other way is not reported as an OOM kill.
    let (code, oom, _) = run(&mut client, "lim-mem", &["sh", "-c", "kill -9 $$"]).await;
    assert_eq!((code, oom), (137, false));

    // The stored spec names the limits in force, the defaults included.
    let sandbox = client
        .get_sandbox(GetSandboxRequest {
            name: "lim-mem".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let resources = sandbox.spec.unwrap().template.unwrap().resources.unwrap();
    let Some(Kind::StructValue(limits)) = &resources.fields["limits"].kind else {
        panic!("no limits in {resources:?}");
    };
    assert_eq!(limits.fields["memory"], text("64Mi"));
    assert_eq!(limits.fields["pids"], number(1024.0));
}

#[tokio::test]
async fn a_fork_bomb_stops_at_the_process_limit() {
    let gw = start_gateway();
    let mut client = client(&gw).await;
    create_limited(&mut client, "lim-pids", vec![("pids", number(32.0))]).await;
    create_ready(&mut client, "lim-pids-free").await;

    let (code, _, forked) = run(&mut client, "lim-pids", &["python3", "-c", FORKS, "200"]).await;
    assert_eq!(code, 0);
    let forked: u32 = forked.parse().expect("a count");
    // 32 processes in all: the init, PID 1, the exec's helper and the
    // program take some of them.
    assert!((20..32).contains(&forked), "forked {forked} under pids 32");
    // Positive control: the default limit (1024) lets 200 through.
    let (_, _, free) = run(
        &mut client,
        "lim-pids-free",
        &["python3", "-c", FORKS, "200"],
    )
    .await;
    assert_eq!(free, "200");
    // Once the children are gone the sandbox can run things again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _, out) = run(&mut client, "lim-pids", &["echo", "ok"]).await;
        if code == 0 && out == "ok" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sandbox stayed out of processes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_busy_loop_gets_the_cpu_quota() {
    let gw = start_gateway();
    let mut client = client(&gw).await;
    create_limited(&mut client, "lim-cpu", vec![("cpu", text("200m"))]).await;
    create_ready(&mut client, "lim-cpu-free").await;

    let cpu = |out: String| out.parse::<f64>().expect("CPU seconds");
    let (_, _, limited) = run(&mut client, "lim-cpu", &["python3", "-c", SPIN, "2"]).await;
    let (_, _, free) = run(&mut client, "lim-cpu-free", &["python3", "-c", SPIN, "2"]).await;
    let (limited, free) = (cpu(limited), cpu(free));
    println!("2 s of spinning: {limited:.2} CPU s under cpu 200m, {free:.2} without a limit");
    // 200m of 2 s is 0.4 s; the interpreter's start counts too.
    assert!(limited < 0.6, "{limited:.2} CPU s under a 200m limit");
    assert!(free > 0.9, "{free:.2} CPU s without a limit (control)");
}

#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_do_not_slow_another_sandbox_down() {
    let gw = start_gateway();
    let mut client = client(&gw).await;
    create_limited(
        &mut client,
        "lim-bad",
        vec![
            ("memory", text("64Mi")),
            ("pids", number(64.0)),
            ("cpu", text("500m")),
        ],
    )
    .await;
    create_ready(&mut client, "lim-good").await;
    let timed = async |client: &mut Client| {
        let started = Instant::now();
        let (code, _, out) = run(client, "lim-good", &["echo", "fine"]).await;
        assert_eq!((code, out.as_str()), (0, "fine"));
        started.elapsed()
    };
    let mut before = Duration::ZERO;
    for _ in 0..5 {
        before = before.max(timed(&mut client).await);
    }
    // The hog first (it would not get a process once the bomb runs).
    let mut hog = client.clone();
    let hog = tokio::spawn(async move {
        let script = r#"for i in 1 2 3 4 5 6 7 8; do python3 -c 'b"\x01" * (512 << 20)'; done"#;
        attack(&mut hog, "lim-bad", &["sh", "-c", script]).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut bomb = client.clone();
    let bomb =
        tokio::spawn(
            async move { attack(&mut bomb, "lim-bad", &["python3", "-c", BOMB, "15"]).await },
        );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut during = Duration::ZERO;
    for _ in 0..5 {
        during = during.max(timed(&mut client).await);
    }
    // The attack is real: the bomb holds every process it may have, and
    // the hog was killed for memory.
    let id = client
        .get_sandbox(GetSandboxRequest {
            name: "lim-bad".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap()
        .metadata
        .unwrap()
        .id;
    // The count moves (the memory limit kills forked interpreters too), so
    // the proof that the bomb reached the limit is the refused forks.
    let processes: u64 = cgroup_file(&id, "pids", "pids.current")
        .trim()
        .parse()
        .unwrap();
    let events = cgroup_file(&id, "pids", "pids.events");
    let refused: u64 = events
        .lines()
        .find_map(|line| line.strip_prefix("max "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no max count in pids.events: {events}"));
    assert!(
        refused > 0,
        "the bomb never reached its limit ({processes} processes now)"
    );
    let oom_kills = cgroup_file(&id, "memory", "memory.oom_control");
    assert!(
        !oom_kills.contains("oom_kill 0"),
        "no OOM kill: {oom_kills}"
    );
    println!(
        "exec in another sandbox: slowest {before:?} before, {during:?} during the attack \
         ({processes} processes in the attacker)"
    );
    assert!(
        during < Duration::from_secs(3).max(before * 5),
        "an exec took {during:?} during the attack ({before:?} before)"
    );
    // Deleting the sandbox ends the attack (its PID 1 takes everything).
    client
        .delete_sandbox(openshell_proto::DeleteSandboxRequest {
            name: "lim-bad".into(),
            ..Default::default()
        })
        .await
        .expect("delete");
    for task in [hog, bomb] {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
}

#[tokio::test]
async fn bad_resources_are_refused_and_nothing_is_created() {
    let gw = start_gateway();
    let mut client = client(&gw).await;
    let cases: Vec<(Struct, &str)> = vec![
        (limits(vec![("memory", text("lots"))]), "limits.memory"),
        (limits(vec![("memory", text("1Mi"))]), "smallest"),
        (limits(vec![("cpu", text("0"))]), "limits.cpu"),
        (limits(vec![("pids", number(2.0))]), "limits.pids"),
        (
            limits(vec![("nvidia.com/gpu", number(1.0))]),
            "\"nvidia.com/gpu\"",
        ),
        (
            Struct {
                fields: [("limitz".to_owned(), object(vec![]))].into(),
            },
            "\"limitz\"",
        ),
    ];
    for (i, (resources, needle)) in cases.into_iter().enumerate() {
        let name = format!("lim-bad-{i}");
        let err = client
            .create_sandbox(with_resources(&name, resources))
            .await
            .expect_err("bad resources accepted");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains(needle),
            "{needle}: {}",
            err.message()
        );
        let missing = client
            .get_sandbox(GetSandboxRequest {
                name,
                ..Default::default()
            })
            .await
            .expect_err("a refused sandbox exists");
        assert_eq!(missing.code(), tonic::Code::NotFound);
    }
}

/// A gateway on a host whose cgroups it cannot see: started in a mount
/// namespace of its own with a tmpfs over `/sys/fs/cgroup` (its supervisors
/// inherit it), with `--resource-limits MODE`.
fn gateway_without_cgroups(mode: &str) -> Gateway {
    Gateway::start(GatewayOptions {
        extra_args: vec!["--resource-limits".into(), mode.into()],
        launcher: vec![
            "unshare".into(),
            "--mount".into(),
            "--propagation".into(),
            "private".into(),
            "sh".into(),
            "-c".into(),
            r#"mount -t tmpfs none /sys/fs/cgroup && exec "$0" "$@""#.into(),
        ],
        ..GatewayOptions::with_token(TOKEN)
    })
}

#[tokio::test]
async fn limits_a_host_cannot_enforce_follow_the_resource_limits_mode() {
    // auto: created, unlimited, and saying so.
    let gw = gateway_without_cgroups("auto");
    let mut client = client(&gw).await;
    create_limited(&mut client, "lim-none", vec![("memory", text("64Mi"))]).await;
    let sandbox = client
        .get_sandbox(GetSandboxRequest {
            name: "lim-none".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let condition = sandbox
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.r#type == "LimitsNotEnforced")
        .unwrap_or_else(|| panic!("no LimitsNotEnforced condition: {sandbox:?}"));
    assert!(
        condition.message.contains("memory") && condition.message.contains("pids"),
        "{}",
        condition.message
    );
    let template = sandbox.spec.unwrap().template.unwrap_or_default();
    assert_eq!(template.resources, None, "unenforced limits were stored");
    for resource in ["memory", "pids"] {
        let sample =
            format!(r#"openshell_server_sandbox_limits_unenforced_total{{resource="{resource}"}}"#);
        assert_eq!(gw.metric(&sample), Some(1.0), "{sample}");
    }
    let (code, oom, out) = run(&mut client, "lim-none", &["python3", "-c", HOG, "256"]).await;
    assert_eq!((code, oom, out.as_str()), (0, false, "256"));
    drop(client);
    drop(gw);

    // required: refused, naming the limit and where it came from.
    let gw = gateway_without_cgroups("required");
    let mut client = common::client(&gw).await;
    let err = client
        .create_sandbox(with_resources(
            "lim-refused",
            limits(vec![("memory", text("64Mi"))]),
        ))
        .await
        .expect_err("an unenforceable limit was accepted");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("spec.template.resources") && err.message().contains("memory"),
        "{}",
        err.message()
    );
    // The default pids limit cannot be enforced either.
    let err = client
        .create_sandbox(CreateSandboxRequest {
            name: "lim-default".into(),
            ..Default::default()
        })
        .await
        .expect_err("an unenforceable default was accepted");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("defaults"), "{}", err.message());
    for name in ["lim-refused", "lim-default"] {
        let missing = client
            .get_sandbox(GetSandboxRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .expect_err("a refused sandbox exists");
        assert_eq!(missing.code(), tonic::Code::NotFound);
    }
}

//! Unit tests of exec relays against real processes.

use super::*;
use openshell_proto::ExecSandboxWindowResize;
use std::os::unix::fs::PermissionsExt;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;

fn settings(workdir: &Path) -> ExecSettings {
    ExecSettings {
        cgroup: None,
        egress: None,
        sandbox_id: "sb-1".into(),
        workdir: workdir.to_path_buf(),
        path: DEFAULT_PATH.into(),
        lang: None,
        provider_env: ProviderEnv::default(),
        sandbox_init: None,
    }
}

fn request(argv: &[&str]) -> ExecSandboxRequest {
    ExecSandboxRequest {
        command: argv.iter().map(|arg| arg.to_string()).collect(),
        ..Default::default()
    }
}

fn stdin_frame(data: &[u8]) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(data.to_vec().into())),
        })),
    }
}

fn resize_frame(cols: u32, rows: u32) -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::ExecInput(ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Resize(
                ExecSandboxWindowResize { cols, rows },
            )),
        })),
    }
}

fn eof() -> RelayFrame {
    RelayFrame {
        payload: Some(relay_frame::Payload::Eof(openshell_proto::RelayEof {})),
    }
}

#[derive(Debug, Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<i32>,
}

impl Output {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Runs one exec over in-memory relay channels, feeding `input` first.
async fn exec(request: ExecSandboxRequest, workdir: &Path, input: Vec<RelayFrame>) -> Output {
    let settings = settings(workdir);
    let (out_tx, mut out_rx) = mpsc::channel(16);
    let (in_tx, in_rx) = mpsc::channel(16);
    let task = tokio::spawn(async move {
        run(
            request,
            &settings,
            out_tx,
            ReceiverStream::new(in_rx),
            std::future::pending(),
        )
        .await
    });
    for frame in input {
        in_tx.send(Ok(frame)).await.unwrap();
    }
    let mut output = Output::default();
    while let Some(frame) = out_rx.recv().await {
        assert!(output.exit.is_none(), "frame after the exit event");
        let Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
            payload: Some(event),
        })) = frame.payload
        else {
            panic!("unexpected frame {frame:?}");
        };
        match event {
            exec_sandbox_event::Payload::Stdout(chunk) => {
                assert!(chunk.data.len() <= CHUNK);
                output.stdout.extend(chunk.data);
            }
            exec_sandbox_event::Payload::Stderr(chunk) => {
                assert!(chunk.data.len() <= CHUNK);
                output.stderr.extend(chunk.data);
            }
            exec_sandbox_event::Payload::Exit(exit) => {
                output.exit = Some(exit.exit_code);
            }
        }
    }
    // The gateway ends its side once it has the exit event.
    drop(in_tx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("exec ends once the gateway ends the stream")
        .unwrap();
    output
}

#[test]
fn environment_is_built_from_scratch() {
    let settings = ExecSettings {
        lang: Some("C.UTF-8".into()),
        ..settings(Path::new("/sandbox"))
    };
    let requested = HashMap::from([
        ("FOO".to_owned(), "bar".to_owned()),
        ("HOME".to_owned(), "/elsewhere".to_owned()),
        (TOKEN_VAR.to_owned(), "leak".to_owned()),
        ("A=B".to_owned(), "x".to_owned()),
    ]);
    let env = settings.environment(false, &requested);
    let get = |key: &str| env.get(&OsString::from(key)).cloned();
    assert_eq!(get("PATH"), Some(DEFAULT_PATH.into()));
    assert_eq!(get("HOME"), Some("/elsewhere".into()));
    assert_eq!(get("OPENSHELL_SANDBOX_ID"), Some("sb-1".into()));
    assert_eq!(get("LANG"), Some("C.UTF-8".into()));
    assert_eq!(get("FOO"), Some("bar".into()));
    assert_eq!(get("TERM"), None);
    assert_eq!(get(TOKEN_VAR), None);
    assert_eq!(env.len(), 5);

    let env = settings.environment(true, &HashMap::new());
    assert_eq!(
        env.get(&OsString::from("TERM")),
        Some(&"xterm-256color".into())
    );
    assert_eq!(env.get(&OsString::from("HOME")), Some(&"/sandbox".into()));
}

#[test]
fn provider_environment_sits_under_the_request() {
    let settings = settings(Path::new("/sandbox"));
    settings.provider_env.replace(HashMap::from([
        ("API_KEY".to_owned(), "provider-secret".to_owned()),
        ("SHARED".to_owned(), "provider".to_owned()),
        (TOKEN_VAR.to_owned(), "leak".to_owned()),
    ]));
    assert!(!format!("{settings:?}").contains("provider-secret"));
    let requested = HashMap::from([("SHARED".to_owned(), "request".to_owned())]);
    let env = settings.environment(false, &requested);
    let get = |key: &str| env.get(&OsString::from(key)).cloned();
    assert_eq!(get("API_KEY"), Some("provider-secret".into()));
    assert_eq!(get("SHARED"), Some("request".into()));
    assert_eq!(get(TOKEN_VAR), None);
}

#[test]
fn workdir_is_relative_to_the_sandbox() {
    let base = Path::new("/sandbox");
    assert_eq!(resolve_workdir(base, ""), PathBuf::from("/sandbox"));
    assert_eq!(resolve_workdir(base, "src"), PathBuf::from("/sandbox/src"));
    assert_eq!(resolve_workdir(base, "/tmp"), PathBuf::from("/tmp"));
}

#[test]
fn exit_codes_follow_the_shell() {
    assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
    assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
    assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
}

#[test]
fn timeouts_are_optional() {
    let mut req = request(&["true"]);
    assert_eq!(execution_timeout(&req), None);
    req.execution_timeout = Some(prost_types::Duration {
        seconds: 2,
        nanos: 500,
    });
    assert_eq!(execution_timeout(&req), Some(Duration::new(2, 500)));
    req.execution_timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: 0,
    });
    assert_eq!(execution_timeout(&req), None);
    req.execution_timeout = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    assert_eq!(execution_timeout(&req), None);
    req.execution_timeout = Some(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    });
    assert!(execution_timeout(&req).is_some());
}

#[tokio::test]
async fn pipes_carry_megabytes_on_both_streams() {
    let dir = tempfile::tempdir().unwrap();
    let script = "yes out | head -c 3000000 & yes err | head -c 3000000 >&2; wait";
    let output = exec(request(&["sh", "-c", script]), dir.path(), vec![eof()]).await;
    assert_eq!(output.exit, Some(0));
    assert_eq!(output.stdout.len(), 3_000_000);
    assert_eq!(output.stderr.len(), 3_000_000);
    assert!(output.stdout.chunks(4).all(|c| c == &b"out\n"[..c.len()]));
    assert!(output.stderr.chunks(4).all(|c| c == &b"err\n"[..c.len()]));
}

#[tokio::test]
async fn stdin_comes_from_the_request_then_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(&["cat"]);
    req.stdin = b"hello ".to_vec();
    let output = exec(req, dir.path(), vec![stdin_frame(b"world"), eof()]).await;
    assert_eq!(output.stdout(), "hello world");
    assert_eq!(output.exit, Some(0));
}

#[tokio::test]
async fn child_sees_only_its_environment_and_workdir() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let mut req = request(&["sh", "-c", "pwd; env | sort"]);
    req.workdir = "sub".into();
    req.environment = HashMap::from([
        ("GREETING".into(), "hi".into()),
        (TOKEN_VAR.into(), "leak".into()),
    ]);
    let output = exec(req, dir.path(), vec![eof()]).await;
    let text = output.stdout();
    let mut lines = text.lines();
    assert_eq!(
        Path::new(lines.next().unwrap()).canonicalize().unwrap(),
        dir.path().join("sub").canonicalize().unwrap()
    );
    let env: Vec<&str> = lines.collect();
    assert!(env.contains(&"GREETING=hi"), "{env:?}");
    assert!(env.contains(&"OPENSHELL_SANDBOX_ID=sb-1"), "{env:?}");
    assert!(
        env.iter().all(|line| !line.starts_with(TOKEN_VAR)),
        "{env:?}"
    );
    assert!(env.iter().all(|line| !line.starts_with("TERM=")), "{env:?}");
}

#[tokio::test]
async fn pty_reports_its_size_and_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(&["sh", "-c", "stty size; exit 3"]);
    req.tty = true;
    req.cols = 100;
    req.rows = 30;
    let output = exec(req, dir.path(), vec![]).await;
    assert_eq!(output.stdout().trim(), "30 100");
    assert!(output.stderr.is_empty());
    assert_eq!(output.exit, Some(3));

    let mut req = request(&["sh", "-c", "stty size; tty; echo $TERM"]);
    req.tty = true;
    let output = exec(req, dir.path(), vec![]).await;
    let text = output.stdout();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines[0], "24 80");
    assert!(lines[1].starts_with("/dev/pts/"), "{lines:?}");
    assert_eq!(lines[2], "xterm-256color");
    assert_eq!(output.exit, Some(0));
}

#[tokio::test]
async fn pty_resize_and_eof() {
    let dir = tempfile::tempdir().unwrap();
    let mut req = request(&["sh", "-c", "read line; stty size; cat; echo done"]);
    req.tty = true;
    let input = vec![resize_frame(50, 10), stdin_frame(b"go\n"), eof()];
    let output = exec(req, dir.path(), input).await;
    let text = output.stdout();
    assert!(text.contains("10 50"), "{text:?}");
    assert!(text.contains("done"), "{text:?}");
    assert_eq!(output.exit, Some(0));
}

#[tokio::test]
async fn spawn_failures_become_stderr_and_an_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let output = exec(request(&["no-such-command-4711"]), dir.path(), vec![]).await;
    assert_eq!(
        output.stderr(),
        "openshell-supervisor: cannot run `no-such-command-4711`: No such file or directory\n"
    );
    assert_eq!(output.exit, Some(127));

    let script = dir.path().join("not-executable");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = exec(request(&[script.to_str().unwrap()]), dir.path(), vec![]).await;
    assert!(output.stderr().contains("Permission denied"), "{output:?}");
    assert_eq!(output.exit, Some(126));

    let mut req = request(&["true"]);
    req.workdir = "missing".into();
    let output = exec(req, dir.path(), vec![]).await;
    assert!(output.stderr().contains("working directory"), "{output:?}");
    assert_eq!(output.exit, Some(127));

    let mut req = request(&["no-such-command-4711"]);
    req.tty = true;
    let output = exec(req, dir.path(), vec![]).await;
    assert_eq!(output.exit, Some(127));
}

#[tokio::test]
async fn signals_and_timeouts_map_to_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let output = exec(request(&["sh", "-c", "kill -TERM $$"]), dir.path(), vec![]).await;
    assert_eq!(output.exit, Some(143));

    let mut req = request(&["sh", "-c", "echo started; sleep 30"]);
    req.execution_timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: 300_000_000,
    });
    let began = std::time::Instant::now();
    let output = exec(req, dir.path(), vec![]).await;
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(output.stdout(), "started\n");
    assert_eq!(output.exit, Some(124));
}

fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // A reparented zombie is dead; reaping it is init's job.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('Z'),
    }
}

/// Starts `sh` with a background `sleep`, reads both pids, then ends the
/// relay the way `end` says; the whole group must be gone.
async fn cancelled_exec_leaves_nothing(
    end: impl FnOnce(oneshot::Sender<()>, mpsc::Sender<Result<RelayFrame, tonic::Status>>),
) {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(dir.path());
    let (out_tx, mut out_rx) = mpsc::channel(16);
    let (in_tx, in_rx) = mpsc::channel(16);
    let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
    let req = request(&["sh", "-c", "sleep 30 & echo $$ $!; wait"]);
    let task = tokio::spawn(async move {
        let cancel = async {
            let _ = cancel_rx.await;
        };
        run(req, &settings, out_tx, ReceiverStream::new(in_rx), cancel).await
    });
    let frame = out_rx.recv().await.unwrap();
    let Some(relay_frame::Payload::ExecEvent(ExecSandboxEvent {
        payload: Some(exec_sandbox_event::Payload::Stdout(chunk)),
    })) = frame.payload
    else {
        panic!("expected the pids first, got {frame:?}");
    };
    let text = String::from_utf8(chunk.data).unwrap();
    let pids: Vec<i32> = text
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    end(cancel_tx, in_tx);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("cancelled exec ends")
        .unwrap();
    // No exit event for a cancelled exec.
    assert!(out_rx.recv().await.is_none());
    assert!(process_gone(pids[0]), "shell still there");
    for _ in 0..50 {
        if process_gone(pids[1]) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("background sleep survived");
}

#[tokio::test]
async fn cancel_kills_the_process_group() {
    cancelled_exec_leaves_nothing(|cancel, _inbound| {
        cancel.send(()).unwrap();
    })
    .await;
}

#[tokio::test]
async fn relay_stream_error_kills_the_process_group() {
    cancelled_exec_leaves_nothing(|_cancel, inbound| {
        inbound
            .try_send(Err(tonic::Status::cancelled("client went away")))
            .unwrap();
        // Keep the cancel sender alive: only the stream error ends it.
        std::mem::forget(_cancel);
    })
    .await;
}

#[tokio::test]
async fn relay_stream_end_kills_the_process_group() {
    cancelled_exec_leaves_nothing(|cancel, inbound| {
        drop(inbound);
        std::mem::forget(cancel);
    })
    .await;
}

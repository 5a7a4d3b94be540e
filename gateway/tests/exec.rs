//! Exec and interactive exec through the gateway to real processes.

mod common;

use std::time::Duration;

use common::*;
use openshell_proto::*;
use openshell_testkit::{eventually, is_running};
use tokio_stream::StreamExt;

#[tokio::test]
async fn exec_runs_argv_with_env_workdir_and_stdin() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "runner").await;

    let out = exec(
        &mut client,
        exec_request("runner", &["echo", "hello", "world"]),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_text(), "hello world\n");
    assert_eq!(out.exit_code, Some(0));

    let mut request = exec_request("runner", &["sh", "-c", "mkdir -p sub && cd sub && pwd"]);
    request.environment.insert("ANSWER".into(), "42".into());
    let out = exec(&mut client, request).await.unwrap();
    assert!(
        out.stdout_text().trim_end().ends_with("/work/sub"),
        "{}",
        out.stdout_text()
    );

    let mut request = exec_request("runner", &["sh", "-c", "echo $ANSWER; pwd; cat"]);
    request.environment.insert("ANSWER".into(), "42".into());
    request.workdir = "sub".into();
    request.stdin = b"from stdin".to_vec();
    let out = exec(&mut client, request).await.unwrap();
    let text = out.stdout_text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "42");
    assert!(lines[1].ends_with("/work/sub"));
    assert_eq!(lines[2], "from stdin");

    // The supervisor's own credentials never reach a process.
    let out = sh(&mut client, "runner", "env").await;
    assert!(!out.stdout_text().contains("OPENSHELL_SANDBOX_TOKEN"));
}

#[tokio::test]
async fn stdout_and_stderr_are_separate_and_exit_codes_are_kept() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "codes").await;
    let out = sh(&mut client, "codes", "echo out; echo err >&2; exit 7").await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit_code, Some(7));

    // Killed by SIGKILL (9): 128 + 9.
    let out = sh(&mut client, "codes", "kill -9 $$").await;
    assert_eq!(out.exit_code, Some(137));

    let out = exec(&mut client, exec_request("codes", &["/no/such/binary"]))
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/binary"));
}

#[tokio::test]
async fn several_mib_on_both_streams_arrive_whole_and_in_order() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "bulk").await;
    // 4 MiB of numbered lines on stdout and 3 MiB on stderr, written at once.
    let script = "i=0; awk 'BEGIN { for (i = 0; i < 180000; i++) printf \"out %08d abcdefghij\\n\", i }' & \
                  awk 'BEGIN { for (i = 0; i < 135000; i++) printf \"err %08d abcdefghij\\n\", i > \"/dev/stderr\" }'; wait";
    let out = sh(&mut client, "bulk", script).await;
    assert_eq!(out.exit_code, Some(0));
    let check = |bytes: &[u8], prefix: &str, count: usize| {
        let text = std::str::from_utf8(bytes).unwrap();
        let mut n = 0;
        for (i, line) in text.lines().enumerate() {
            assert_eq!(line, format!("{prefix} {i:08} abcdefghij"), "line {i}");
            n += 1;
        }
        assert_eq!(n, count);
    };
    check(&out.stdout, "out", 180000);
    check(&out.stderr, "err", 135000);
    assert!(out.stdout.len() > 4_000_000 && out.stderr.len() > 3_000_000);
}

#[tokio::test]
async fn execution_timeout_kills_the_process() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "slow").await;
    let mut request = exec_request("slow", &["sh", "-c", "echo started; sleep 30"]);
    request.execution_timeout = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let started = std::time::Instant::now();
    let out = exec(&mut client, request).await.unwrap();
    assert_eq!(out.exit_code, Some(124));
    assert_eq!(out.stdout_text(), "started\n");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn cancelling_the_stream_kills_the_process() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "cancel").await;
    let marker = openshell_testkit::marker();
    let mut stream = client
        .exec_sandbox({
            // Found by a marker: a pid the sandbox reports is its own.
            let mut request = exec_request("cancel", &["sh", "-c", "echo started; exec sleep 300"]);
            request
                .environment
                .insert("TEST_MARKER".into(), marker.clone());
            request
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(first.payload, Some(exec_sandbox_event::Payload::Stdout(_))),
        "{first:?}"
    );
    let pids = openshell_testkit::pids_with_env("TEST_MARKER", &marker);
    assert!(!pids.is_empty(), "the exec's process is not running");
    drop(stream);
    assert!(
        eventually(Duration::from_secs(10), || pids
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes {pids:?} survived the cancelled exec; log:\n{}",
        gw.log()
    );
}

#[tokio::test]
async fn interactive_exec_uses_a_pty_takes_stdin_and_resizes() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "tty").await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let start_request = ExecSandboxRequest {
        sandbox: "tty".into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "stty size; read line; echo got:$line; stty size; [ -t 0 ] && echo is-tty; exit 3"
                .into(),
        ],
        tty: true,
        cols: 100,
        rows: 30,
        ..Default::default()
    };
    let input = |payload| ExecSandboxInput {
        payload: Some(payload),
    };
    tx.send(input(exec_sandbox_input::Payload::Start(start_request)))
        .await
        .unwrap();
    let mut events = client
        .exec_sandbox_interactive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();

    let mut output = String::new();
    let mut exit = None;
    let mut sent = false;
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = events.next().await {
            match event.unwrap().payload {
                Some(exec_sandbox_event::Payload::Stdout(out)) => {
                    output.push_str(&String::from_utf8_lossy(&out.data));
                }
                Some(exec_sandbox_event::Payload::Stderr(_)) => {}
                Some(exec_sandbox_event::Payload::Exit(e)) => exit = Some(e.exit_code),
                None => {}
            }
            if !sent && output.contains("30 100") {
                sent = true;
                tx.send(input(exec_sandbox_input::Payload::Resize(
                    ExecSandboxWindowResize {
                        cols: 120,
                        rows: 40,
                    },
                )))
                .await
                .unwrap();
                tx.send(input(exec_sandbox_input::Payload::Stdin(
                    b"ping\n".to_vec().into(),
                )))
                .await
                .unwrap();
            }
        }
    })
    .await;
    assert!(done.is_ok(), "interactive exec did not finish: {output}");
    assert_eq!(exit, Some(3), "{output}");
    assert!(output.contains("got:ping"), "{output}");
    assert!(output.contains("40 120"), "{output}");
    assert!(output.contains("is-tty"), "{output}");
}

#[tokio::test]
async fn interactive_exec_without_tty_closes_stdin_when_the_client_does() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "pipe").await;
    let messages = vec![
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Start(exec_request(
                "pipe",
                &["wc", "-c"],
            ))),
        },
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(
                vec![b'x'; 100_000].into(),
            )),
        },
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(vec![b'y'; 23].into())),
        },
    ];
    let stream = client
        .exec_sandbox_interactive(tokio_stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    let out = collect(stream).await.unwrap();
    assert_eq!(out.stdout_text().trim(), "100023");
    assert_eq!(out.exit_code, Some(0));
}

/// An exec request the gateway cannot decode is the client's fault, and
/// so is an interactive input message that does not decode.
#[tokio::test]
async fn a_malformed_exec_message_is_invalid_argument() {
    use prost::Message;
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "bad-exec").await;
    // Field 1 (sandbox) announcing 255 bytes that never come.
    let truncated = bytes::Bytes::from_static(&[0x0a, 0xff, 0x01, 0x00]);
    let status = raw_call::raw_stream(
        &gw,
        "/openshell.v1.OpenShell/ExecSandbox",
        vec![truncated.clone()],
        &[],
    )
    .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("malformed exec request"),
        "{status:?}"
    );

    let start = ExecSandboxInput {
        payload: Some(exec_sandbox_input::Payload::Start(ExecSandboxRequest {
            sandbox: "bad-exec".into(),
            command: vec!["cat".into()],
            ..Default::default()
        })),
    };
    let status = raw_call::raw_stream(
        &gw,
        "/openshell.v1.OpenShell/ExecSandboxInteractive",
        vec![bytes::Bytes::from(start.encode_to_vec()), truncated],
        &[],
    )
    .await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("malformed exec input message"),
        "{status:?}"
    );
}

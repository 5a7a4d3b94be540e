//! Exec through the SDK against the real gateway and supervisor: buffered
//! (stdout, stderr, exit code, output cap), streaming (order, exit last),
//! interactive (pty, stdin, resize, close stdin), and the end of the
//! sandbox-side process when a call is cancelled, dropped or runs out of
//! time.
//!
//! Waits for processes to go away use testkit's async `eventually`: a
//! blocking sleep on the test runtime would stall the client's connection.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use openshell_sdk::{CallOptions, CancellationToken, Client, ExecEvent, ExecRequest};
use openshell_testkit::{eventually, is_running};

async fn run(client: &Client, request: ExecRequest) -> openshell_sdk::ExecOutput {
    within(60, "exec", client.exec(request, CallOptions::new()))
        .await
        .expect("exec")
}

/// Reads the `pid` file a script left in the sandbox's working directory.
/// Host pids of the processes an exec marked with `marker` started: found
/// by the marker, since a pid the sandbox reports is one of its namespace.
fn marked(marker: &str) -> Vec<i32> {
    openshell_testkit::pids_with_env(MARKER, marker)
}

/// Waits until the marked exec runs (it created `started`), then its pids.
async fn started(client: &Client, sandbox: &str, marker: &str) -> Vec<i32> {
    within(20, "the marked exec to start", async {
        loop {
            let out = run(client, ExecRequest::new(sandbox, ["test", "-e", "started"])).await;
            let pids = marked(marker);
            if out.success() && !pids.is_empty() {
                break pids;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
}

fn all_running(pids: &[i32]) -> bool {
    !pids.is_empty() && pids.iter().all(|p| is_running(*p))
}

async fn assert_gone(gw: &openshell_testkit::Gateway, pids: &[i32], what: &str) {
    assert!(
        eventually(Duration::from_secs(10), || pids
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes {pids:?} survived {what}; gateway log:\n{}",
        gw.log()
    );
}

const MARKER: &str = "TEST_MARKER";

#[tokio::test]
async fn buffered_exec_returns_stdout_stderr_and_the_exit_code() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "runner").await;

    let out = run(
        &client,
        ExecRequest::new("runner", ["echo", "hello", "world"]),
    )
    .await;
    assert_eq!(out.stdout_text(), "hello world\n");
    assert!(out.stderr.is_empty());
    assert_eq!(out.exit_code, 0);
    assert!(out.success());

    let out = run(
        &client,
        ExecRequest::new("runner", ["sh", "-c", "echo out; echo err >&2; exit 7"]),
    )
    .await;
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");
    assert_eq!(out.exit_code, 7);
    assert!(!out.success());

    // Environment, working directory and stdin reach the process.
    let out = run(
        &client,
        ExecRequest::new(
            "runner",
            [
                "sh",
                "-c",
                "mkdir -p sub; cd sub; printf '%s|' \"$ANSWER\"; cat",
            ],
        )
        .env("ANSWER", "42")
        .stdin(Bytes::from_static(b"from stdin")),
    )
    .await;
    assert_eq!(out.stdout_text(), "42|from stdin");
    let out = run(&client, ExecRequest::new("runner", ["pwd"]).workdir("sub")).await;
    assert!(
        out.stdout_text().trim_end().ends_with("/work/sub"),
        "{}",
        out.stdout_text()
    );

    // Signals are 128+n; a program that cannot start is 127.
    let out = run(
        &client,
        ExecRequest::new("runner", ["sh", "-c", "kill -9 $$"]),
    )
    .await;
    assert_eq!(out.exit_code, 137);
    let out = run(&client, ExecRequest::new("runner", ["/no/such/binary"])).await;
    assert_eq!(out.exit_code, 127);
    assert!(out.stderr_text().contains("/no/such/binary"));

    // Several MiB arrive whole (under the default cap).
    let out = run(
        &client,
        ExecRequest::new(
            "runner",
            [
                "sh",
                "-c",
                "head -c 3000000 /dev/zero; head -c 1000000 /dev/zero >&2",
            ],
        ),
    )
    .await;
    assert_eq!(out.stdout.len(), 3_000_000);
    assert_eq!(out.stderr.len(), 1_000_000);
    assert_eq!(out.exit_code, 0);

    // A server-side execution timeout is exit code 124.
    let out = run(
        &client,
        ExecRequest::new("runner", ["sleep", "30"]).timeout(Duration::from_millis(500)),
    )
    .await;
    assert_eq!(out.exit_code, 124);

    // Errors of the gateway come through with their code and replica.
    let err = within(
        10,
        "exec",
        client.exec(ExecRequest::new("missing", ["true"]), CallOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert_eq!(err.served_by(), Some(REPLICA));
}

#[tokio::test]
async fn buffered_exec_past_the_output_cap_fails_with_output_limit_and_stops_the_process() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "capped").await;
    let marker = openshell_testkit::marker();

    // Per call: 64 KiB, against endless output.
    let started = Instant::now();
    let err = within(
        30,
        "capped exec",
        client.exec(
            ExecRequest::new("capped", ["sh", "-c", "touch started; exec yes"])
                .env(MARKER, &marker)
                .output_limit(64 * 1024),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "output_limit", "{err}");
    assert!(err.to_string().contains("65536 bytes"), "{err}");
    assert!(!err.retryable());
    assert!(started.elapsed() < Duration::from_secs(20));
    // The call was cancelled, so the endless writer is killed.
    // It ran (it made `started`); whatever of it is left must go.
    let out = run(
        &client,
        ExecRequest::new("capped", ["test", "-e", "started"]),
    )
    .await;
    assert!(out.success(), "the marked exec never started");
    let pid = marked(&marker);
    assert_gone(&gw, &pid, "the output cap").await;

    // Stdout and stderr count together; the client-wide cap applies too.
    let config = openshell_sdk::ClientConfig::builder(gw.url.clone())
        .token(TOKEN)
        .exec_output_limit(1000)
        .build()
        .unwrap();
    let small = within(10, "connect", Client::connect(config))
        .await
        .unwrap();
    let err = within(
        30,
        "capped exec",
        small.exec(
            ExecRequest::new(
                "capped",
                [
                    "sh",
                    "-c",
                    "head -c 600 /dev/zero; head -c 600 /dev/zero >&2",
                ],
            ),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "output_limit", "{err}");
    // Exactly at the cap is fine.
    let out = within(
        30,
        "exec at the cap",
        small.exec(
            ExecRequest::new(
                "capped",
                [
                    "sh",
                    "-c",
                    "head -c 500 /dev/zero; head -c 500 /dev/zero >&2",
                ],
            ),
            CallOptions::new(),
        ),
    )
    .await
    .expect("output exactly at the cap");
    assert_eq!(out.stdout.len() + out.stderr.len(), 1000);
}

#[tokio::test]
async fn exec_stream_yields_events_in_order_and_ends_with_exit() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "streamer").await;

    let mut stream = within(
        10,
        "exec_stream",
        client.exec_stream(
            ExecRequest::new(
                "streamer",
                [
                    "sh",
                    "-c",
                    "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5",
                ],
            ),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec_stream");
    // Merge adjacent chunks of the same kind; the order of kinds is the
    // order the process wrote them.
    let mut events: Vec<ExecEvent> = Vec::new();
    while let Some(event) = next_event(&mut stream, 20).await {
        let event = event.expect("event");
        match (events.last_mut(), event) {
            (Some(ExecEvent::Stdout(prev)), ExecEvent::Stdout(more)) => {
                *prev = Bytes::from([prev.as_ref(), more.as_ref()].concat());
            }
            (Some(ExecEvent::Stderr(prev)), ExecEvent::Stderr(more)) => {
                *prev = Bytes::from([prev.as_ref(), more.as_ref()].concat());
            }
            (_, event) => events.push(event),
        }
    }
    assert_eq!(
        events,
        vec![
            ExecEvent::Stdout(Bytes::from_static(b"one\n")),
            ExecEvent::Stderr(Bytes::from_static(b"two\n")),
            ExecEvent::Stdout(Bytes::from_static(b"three\n")),
            ExecEvent::Exit(5),
        ]
    );
    // Finished streams stay finished, however often they are polled.
    assert!(next_event(&mut stream, 5).await.is_none());
    assert!(next_event(&mut stream, 5).await.is_none());

    // A long output arrives in order, then exactly one exit event, last.
    let mut stream = client
        .exec_stream(
            ExecRequest::new("streamer", ["seq", "1", "200000"]),
            CallOptions::new(),
        )
        .await
        .expect("exec_stream");
    let mut stdout = Vec::new();
    let mut exits = Vec::new();
    while let Some(event) = next_event(&mut stream, 30).await {
        match event.expect("event") {
            ExecEvent::Stdout(data) => {
                assert!(exits.is_empty(), "stdout after the exit event");
                stdout.extend_from_slice(&data);
            }
            ExecEvent::Stderr(data) => panic!("stderr: {}", String::from_utf8_lossy(&data)),
            ExecEvent::Exit(code) => exits.push(code),
        }
    }
    assert_eq!(exits, vec![0]);
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert!(stdout == expected.as_bytes(), "seq output differs");
}

#[tokio::test]
async fn exec_interactive_with_a_tty_takes_stdin_and_resizes() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "tty").await;

    let mut session = within(
        10,
        "exec_interactive",
        client.exec_interactive(
            ExecRequest::new(
                "tty",
                [
                    "sh",
                    "-c",
                    "stty size; read line; echo got:$line; stty size; [ -t 0 ] && echo is-tty; exit 3",
                ],
            )
            .tty(100, 30),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec_interactive");

    let mut output = String::new();
    let mut exit = None;
    let mut sent = false;
    while let Some(event) = within(20, "interactive event", session.next_event()).await {
        match event.expect("event") {
            ExecEvent::Stdout(data) => output.push_str(&String::from_utf8_lossy(&data)),
            ExecEvent::Stderr(data) => output.push_str(&String::from_utf8_lossy(&data)),
            ExecEvent::Exit(code) => exit = Some(code),
        }
        if !sent && output.contains("30 100") {
            sent = true;
            session.resize(120, 40).await.expect("resize");
            session.write("ping\n").await.expect("stdin");
        }
    }
    // `None` after the exit event, again and again.
    assert!(
        within(5, "after exit", session.next_event())
            .await
            .is_none()
    );
    assert!(sent, "the initial size never showed: {output:?}");
    assert_eq!(exit, Some(3), "{output:?}");
    assert!(output.contains("got:ping"), "{output:?}");
    assert!(output.contains("40 120"), "resize not seen: {output:?}");
    assert!(output.contains("is-tty"), "{output:?}");
}

#[tokio::test]
async fn exec_interactive_without_a_tty_reads_stdin_until_closed() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "pipe").await;

    let session = within(
        10,
        "exec_interactive",
        client.exec_interactive(
            ExecRequest::new("pipe", ["sh", "-c", "wc -c; [ -t 0 ] || echo no-tty"])
                .stdin(Bytes::from_static(b"abc")),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec_interactive");
    let (input, mut events) = session.into_parts();
    // 200 000 bytes: more than one 64 KiB stdin chunk.
    within(20, "stdin", input.write(vec![b'x'; 200_000]))
        .await
        .expect("write");
    input.close();
    input.close(); // idempotent
    let err = input.write("late").await.unwrap_err();
    assert_eq!(err.code(), "stream_closed", "{err}");

    let mut stdout = String::new();
    let mut exit = None;
    while let Some(event) = next_event(&mut events, 20).await {
        match event.expect("event") {
            ExecEvent::Stdout(data) => stdout.push_str(&String::from_utf8_lossy(&data)),
            ExecEvent::Stderr(data) => panic!("stderr: {}", String::from_utf8_lossy(&data)),
            ExecEvent::Exit(code) => exit = Some(code),
        }
    }
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["200003", "no-tty"]
    );
    assert_eq!(exit, Some(0));
}

#[tokio::test]
async fn cancelling_an_exec_stream_with_its_token_kills_the_process() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "cancel").await;
    let marker = openshell_testkit::marker();

    let token = CancellationToken::new();
    let mut stream = within(
        10,
        "exec_stream",
        client.exec_stream(
            ExecRequest::new("cancel", ["sh", "-c", "echo started; exec sleep 300"])
                .env(MARKER, &marker),
            CallOptions::new().cancel_token(token.clone()),
        ),
    )
    .await
    .expect("exec_stream");
    let pid = read_started(&mut stream, &marker).await;
    assert!(all_running(&pid), "processes {pid:?} are not running");

    token.cancel();
    let err = next_event(&mut stream, 10)
        .await
        .expect("an error after cancelling")
        .unwrap_err();
    assert_eq!(err.code(), "cancelled", "{err}");
    assert!(next_event(&mut stream, 5).await.is_none());
    assert_gone(&gw, &pid, "a cancelled exec stream").await;

    // One token cancels a buffered exec started with it, from another task.
    let token = CancellationToken::new();
    let call = tokio::spawn({
        let client = client.clone();
        let options = CallOptions::new().cancel_token(token.clone());
        let marker = marker.clone();
        async move {
            client
                .exec(
                    ExecRequest::new("cancel", ["sh", "-c", "touch started; exec sleep 300"])
                        .env(MARKER, &marker),
                    options,
                )
                .await
        }
    });
    // Wait until the process runs, then cancel.
    let pid = started(&client, "cancel", &marker).await;
    token.cancel();
    let err = within(10, "cancelled exec", call)
        .await
        .expect("task")
        .unwrap_err();
    assert_eq!(err.code(), "cancelled", "{err}");
    assert_gone(&gw, &pid, "a cancelled buffered exec").await;
    // The caller's token is not consumed by the client: the client still works.
    let out = run(&client, ExecRequest::new("cancel", ["true"])).await;
    assert!(out.success());
}

#[tokio::test]
async fn dropping_an_exec_stream_kills_the_process() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "dropped").await;
    let marker = openshell_testkit::marker();

    let mut stream = within(
        10,
        "exec_stream",
        client.exec_stream(
            ExecRequest::new("dropped", ["sh", "-c", "echo started; exec sleep 300"])
                .env(MARKER, &marker),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec_stream");
    let pid = read_started(&mut stream, &marker).await;
    assert!(all_running(&pid));
    drop(stream);
    assert_gone(&gw, &pid, "a dropped exec stream").await;

    // Same for an interactive session.
    let mut session = within(
        10,
        "exec_interactive",
        client.exec_interactive(
            ExecRequest::new("dropped", ["sh", "-c", "echo started; exec sleep 300"])
                .env(MARKER, &marker),
            CallOptions::new(),
        ),
    )
    .await
    .expect("exec_interactive");
    let pid = read_started(&mut session, &marker).await;
    assert!(all_running(&pid));
    drop(session);
    assert_gone(&gw, &pid, "a dropped interactive exec").await;
}

#[tokio::test]
async fn a_short_deadline_ends_the_call_with_deadline_exceeded_and_kills_the_process() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "deadline").await;
    let marker = openshell_testkit::marker();

    // Streaming: the pid first, then the deadline.
    let started = Instant::now();
    let mut stream = within(
        10,
        "exec_stream",
        client.exec_stream(
            ExecRequest::new("deadline", ["sh", "-c", "echo started; exec sleep 5"])
                .env(MARKER, &marker),
            CallOptions::new().deadline(Duration::from_millis(1000)),
        ),
    )
    .await
    .expect("exec_stream");
    let pid = read_started(&mut stream, &marker).await;
    let err = next_event(&mut stream, 10)
        .await
        .expect("an error at the deadline")
        .unwrap_err();
    assert_eq!(err.code(), "deadline_exceeded", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    // Gone well before `sleep 5` would have ended by itself.
    assert!(
        eventually(Duration::from_millis(2500), || pid
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes {pid:?} survived the deadline"
    );
    assert!(started.elapsed() < Duration::from_millis(4800));

    // Buffered.
    let started = Instant::now();
    let err = within(
        10,
        "exec with a deadline",
        client.exec(
            ExecRequest::new("deadline", ["sh", "-c", "touch started; exec sleep 5"])
                .env(MARKER, &marker),
            CallOptions::new().deadline(Duration::from_millis(1000)),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "deadline_exceeded", "{err}");
    assert!(started.elapsed() < Duration::from_secs(4));
    // It ran (it made `started`); whatever of it is left must go.
    let out = run(
        &client,
        ExecRequest::new("deadline", ["test", "-e", "started"]),
    )
    .await;
    assert!(out.success(), "the marked exec never started");
    let pid = marked(&marker);
    assert!(
        eventually(Duration::from_millis(2500), || pid
            .iter()
            .all(|p| !is_running(*p)))
        .await,
        "processes {pid:?} survived the deadline"
    );
    assert!(started.elapsed() < Duration::from_millis(4800));

    // The client's default deadline bounds unary calls, not exec streams.
    let config = openshell_sdk::ClientConfig::builder(gw.url.clone())
        .token(TOKEN)
        .default_deadline(Some(Duration::from_millis(500)))
        .build()
        .unwrap();
    let short = within(10, "connect", Client::connect(config))
        .await
        .unwrap();
    let out = within(
        20,
        "exec longer than the default deadline",
        short.exec(
            ExecRequest::new("deadline", ["sleep", "1.5"]),
            CallOptions::new(),
        ),
    )
    .await
    .expect("streams get no default deadline");
    assert!(out.success());
}

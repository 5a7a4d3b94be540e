//! The raw boundary against the real gateway: encoded prost bytes in and
//! out, caller metadata, and response metadata (`x-openshell-served-by`) on
//! answers, streams and errors.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::StreamExt;
use openshell_sdk::proto::{
    self, ExecSandboxEvent, ExecSandboxInput, ExecSandboxRequest, GetSandboxRequest, HealthRequest,
    HealthResponse, SandboxResponse, exec_sandbox_event, exec_sandbox_input,
};
use openshell_sdk::{CallOptions, Metadata, RawStream};
use prost::Message;

const GET_SANDBOX: &str = "/openshell.v1.OpenShell/GetSandbox";
const HEALTH: &str = "/openshell.v1.OpenShell/Health";
const EXEC: &str = "/openshell.v1.OpenShell/ExecSandbox";
const EXEC_INTERACTIVE: &str = "/openshell.v1.OpenShell/ExecSandboxInteractive";

async fn drain_exec(stream: &mut RawStream) -> (Vec<u8>, Option<i32>) {
    let mut stdout = Vec::new();
    let mut exit = None;
    while let Some(frame) = within(20, "raw recv", stream.recv()).await.expect("recv") {
        let event = ExecSandboxEvent::decode(frame).expect("decodable event");
        match event.payload {
            Some(exec_sandbox_event::Payload::Stdout(out)) => stdout.extend(out.data),
            Some(exec_sandbox_event::Payload::Exit(e)) => exit = Some(e.exit_code),
            _ => {}
        }
    }
    (stdout, exit)
}

#[tokio::test]
async fn raw_unary_takes_and_returns_encoded_bytes_with_metadata() {
    let gw = start();
    let client = client(&gw).await;
    let created = create_ready(&client, "rawbox").await;

    let request = GetSandboxRequest {
        name: "rawbox".into(),
        ..Default::default()
    };
    let response = within(
        10,
        "raw_unary",
        client.raw_unary(
            GET_SANDBOX,
            Bytes::from(request.encode_to_vec()),
            Metadata::new().with("x-request-id", "raw-it-1"),
            CallOptions::new().deadline(Duration::from_secs(5)),
        ),
    )
    .await
    .expect("raw GetSandbox");
    assert_eq!(response.served_by(), Some(REPLICA));
    assert_eq!(
        response.metadata.get("x-openshell-served-by"),
        Some(REPLICA)
    );
    let decoded = SandboxResponse::decode(response.bytes.clone()).expect("decodable response");
    let sandbox = decoded.sandbox.expect("sandbox");
    let meta = sandbox.metadata.expect("metadata");
    assert_eq!(meta.name, "rawbox");
    assert_eq!(meta.id, created.id);

    let health = within(
        10,
        "raw health",
        client.raw_unary(
            HEALTH,
            Bytes::from(HealthRequest {}.encode_to_vec()),
            Metadata::new(),
            CallOptions::new(),
        ),
    )
    .await
    .expect("raw Health");
    let decoded = HealthResponse::decode(health.bytes).unwrap();
    assert_eq!(decoded.status(), proto::ServiceStatus::Healthy);
    assert_eq!(health.metadata.get("x-openshell-served-by"), Some(REPLICA));

    // Errors carry their code and the response metadata.
    let missing = GetSandboxRequest {
        name: "nope".into(),
        ..Default::default()
    };
    let err = within(
        10,
        "raw_unary",
        client.raw_unary(
            GET_SANDBOX,
            Bytes::from(missing.encode_to_vec()),
            Metadata::new(),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert_eq!(err.served_by(), Some(REPLICA));
    assert_eq!(
        err.metadata().and_then(|m| m.get("x-openshell-served-by")),
        Some(REPLICA)
    );

    // Undecodable request bytes are the server's invalid_argument (or
    // internal), never a client crash.
    let err = within(
        10,
        "raw_unary",
        client.raw_unary(
            GET_SANDBOX,
            Bytes::from_static(b"\xff\xff\xff"),
            Metadata::new(),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err.code(), "invalid_argument" | "internal"),
        "{err}"
    );

    // A caller `authorization` pair replaces the client's (absent) token.
    let anonymous = client_with_token(&gw, None).await;
    let err = within(
        10,
        "raw_unary",
        anonymous.raw_unary(
            GET_SANDBOX,
            Bytes::from(request.encode_to_vec()),
            Metadata::new(),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "unauthenticated", "{err}");
    let response = within(
        10,
        "raw_unary",
        anonymous.raw_unary(
            GET_SANDBOX,
            Bytes::from(request.encode_to_vec()),
            Metadata::new().with("authorization", format!("Bearer {TOKEN}")),
            CallOptions::new(),
        ),
    )
    .await
    .expect("caller authorization");
    assert_eq!(response.served_by(), Some(REPLICA));

    // Streaming methods are refused before any I/O.
    let err = client
        .raw_unary(EXEC, Bytes::new(), Metadata::new(), CallOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "invalid_config");
}

#[tokio::test]
async fn raw_stream_server_streaming_exec_with_metadata_and_trailers() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "rawexec").await;

    let mut stream = within(
        10,
        "raw_stream",
        client.raw_stream(EXEC, Metadata::new(), CallOptions::new()),
    )
    .await
    .expect("raw_stream");
    assert_eq!(stream.method().map(|m| m.path), Some(EXEC));
    let request = ExecSandboxRequest {
        sandbox: "rawexec".into(),
        command: vec!["sh".into(), "-c".into(), "echo raw; exit 4".into()],
        ..Default::default()
    };
    within(
        10,
        "send",
        stream.send(Bytes::from(request.encode_to_vec())),
    )
    .await
    .expect("send");
    // A server-streaming method takes one message: the send side closed.
    let err = stream.send(Bytes::new()).await.unwrap_err();
    assert_eq!(err.code(), "stream_closed");

    let headers = within(10, "headers", stream.response_metadata())
        .await
        .expect("response metadata");
    assert_eq!(headers.get("x-openshell-served-by"), Some(REPLICA));
    let (stdout, exit) = drain_exec(&mut stream).await;
    assert_eq!(stdout, b"raw\n");
    assert_eq!(exit, Some(4));
    assert!(stream.trailers().is_some(), "trailers after a clean end");
    // Finished: further receives keep saying so.
    assert!(stream.recv().await.expect("recv after end").is_none());

    // The split halves: the receiver as a `Stream` ends (and stays ended)
    // after the exit event.
    let stream = client
        .raw_stream(EXEC, Metadata::new(), CallOptions::new())
        .await
        .unwrap();
    let (sender, receiver) = stream.split();
    sender
        .send(Bytes::from(request.encode_to_vec()))
        .await
        .expect("send");
    assert!(
        sender.is_closed(),
        "one message closes a server-streaming call"
    );
    let mut frames = receiver.into_stream();
    let mut exit = None;
    while let Some(frame) = within(20, "frame", frames.next()).await {
        let event = ExecSandboxEvent::decode(frame.expect("frame")).unwrap();
        if let Some(exec_sandbox_event::Payload::Exit(e)) = event.payload {
            exit = Some(e.exit_code);
        }
    }
    assert_eq!(exit, Some(4));
    assert!(within(5, "after the end", frames.next()).await.is_none());

    // A failing stream reports the status with its metadata.
    let mut stream = client
        .raw_stream(EXEC, Metadata::new(), CallOptions::new())
        .await
        .unwrap();
    let request = ExecSandboxRequest {
        sandbox: "absent".into(),
        command: vec!["true".into()],
        ..Default::default()
    };
    stream
        .send(Bytes::from(request.encode_to_vec()))
        .await
        .unwrap();
    let err = within(10, "recv", stream.recv()).await.unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    assert_eq!(err.served_by(), Some(REPLICA));
    // The error sticks.
    assert_eq!(stream.recv().await.unwrap_err().code(), "not_found");
}

#[tokio::test]
async fn raw_stream_bidi_interactive_exec_with_half_close() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "rawbidi").await;

    let mut stream = within(
        10,
        "raw_stream",
        client.raw_stream(
            EXEC_INTERACTIVE,
            Metadata::new().with("x-request-id", "raw-bidi"),
            CallOptions::new(),
        ),
    )
    .await
    .expect("raw_stream");
    let input = |payload| {
        Bytes::from(
            ExecSandboxInput {
                payload: Some(payload),
            }
            .encode_to_vec(),
        )
    };
    let start = ExecSandboxRequest {
        sandbox: "rawbidi".into(),
        command: vec!["cat".into()],
        ..Default::default()
    };
    stream
        .send(input(exec_sandbox_input::Payload::Start(start)))
        .await
        .expect("send start");
    for part in [&b"hello "[..], b"raw ", b"bidi"] {
        stream
            .send(input(exec_sandbox_input::Payload::Stdin(
                part.to_vec().into(),
            )))
            .await
            .expect("send stdin");
    }
    stream.close_send();
    stream.close_send(); // idempotent
    let headers = within(10, "headers", stream.response_metadata())
        .await
        .expect("headers");
    assert_eq!(headers.get("x-openshell-served-by"), Some(REPLICA));
    let (stdout, exit) = drain_exec(&mut stream).await;
    assert_eq!(stdout, b"hello raw bidi");
    assert_eq!(exit, Some(0));
}

#[tokio::test]
async fn cancelling_a_raw_stream_kills_the_process_even_when_nobody_receives() {
    let gw = start();
    let client = client(&gw).await;
    create_ready(&client, "raw-cancel").await;
    let marker = openshell_testkit::marker();
    let request = ExecSandboxRequest {
        sandbox: "raw-cancel".into(),
        command: vec![
            "sh".into(),
            "-c".into(),
            "echo started; exec sleep 300".into(),
        ],
        // Found by a marker: a pid the sandbox reports is its own.
        environment: [("TEST_MARKER".to_owned(), marker.clone())].into(),
        ..Default::default()
    };
    let token = openshell_sdk::CancellationToken::new();
    let mut stream = client
        .raw_stream(
            "/openshell.v1.OpenShell/ExecSandbox",
            Metadata::new(),
            CallOptions::new().cancel_token(token.clone()),
        )
        .await
        .unwrap();
    stream
        .send(Bytes::from(request.encode_to_vec()))
        .await
        .unwrap();
    let first = within(10, "first event", stream.recv())
        .await
        .unwrap()
        .unwrap();
    let event = ExecSandboxEvent::decode(first).unwrap();
    assert!(
        matches!(event.payload, Some(exec_sandbox_event::Payload::Stdout(_))),
        "{event:?}"
    );
    let pids = openshell_testkit::pids_with_env("TEST_MARKER", &marker);
    assert!(!pids.is_empty(), "the exec's process is not running");
    // Cancel while still holding the stream and without receiving again.
    token.cancel();
    assert!(
        openshell_testkit::eventually(Duration::from_secs(10), || pids
            .iter()
            .all(|p| !openshell_testkit::is_running(*p)))
        .await,
        "the sandbox process outlived the cancelled stream"
    );
    let err = stream.recv().await.unwrap_err();
    assert_eq!(err.code(), "cancelled");
}

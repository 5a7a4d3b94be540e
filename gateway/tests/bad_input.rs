//! Every bad-input row gets a clear gRPC error and changes nothing.

mod common;

use common::*;
use openshell_proto::*;
use openshell_testkit::sandbox_token;
use tonic::Code;

async fn sandbox_count(client: &mut Client) -> usize {
    client
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .len()
}

async fn forward_error(client: &mut Client, frames: Vec<TcpForwardFrame>) -> tonic::Status {
    match client.forward_tcp(tokio_stream::iter(frames)).await {
        Err(status) => status,
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Err(status) => break status,
                    Ok(None) => panic!("forward ended without an error"),
                    Ok(Some(_)) => {}
                }
            }
        }
    }
}

fn forward_init(sandbox: &str, host: &str, port: u32) -> TcpForwardFrame {
    TcpForwardFrame {
        payload: Some(tcp_forward_frame::Payload::Init(TcpForwardInit {
            sandbox: sandbox.into(),
            target: Some(tcp_forward_init::Target::Tcp(TcpRelayTarget {
                host: host.into(),
                port,
            })),
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn create_rejects_bad_names_and_environment_and_changes_nothing() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "existing").await;
    let long = "a".repeat(64);
    for name in [
        "-bad",
        "bad-",
        "Upper",
        "under_score",
        "dot.ted",
        long.as_str(),
    ] {
        let err = client
            .create_sandbox(CreateSandboxRequest {
                name: name.into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{name}: {err:?}");
    }
    let err = client
        .create_sandbox(CreateSandboxRequest {
            name: "env".into(),
            spec: Some(SandboxSpec {
                environment: [("NOT-AN-ID".to_owned(), "s3cr3t-value".to_owned())].into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(!err.message().contains("s3cr3t-value"), "{}", err.message());
    let err = client
        .create_sandbox(CreateSandboxRequest {
            name: "existing".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert_eq!(sandbox_count(&mut client).await, 1);
    assert_eq!(gw.supervisor_pids().len(), 1);

    // An empty name on get/delete/watch is invalid too.
    let err = client
        .get_sandbox(GetSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn list_rejects_bad_paging_and_selectors() {
    let gw = start();
    let mut client = client(&gw).await;
    for request in [
        ListSandboxesRequest {
            page_size: -1,
            ..Default::default()
        },
        ListSandboxesRequest {
            page_token: "garbage".into(),
            ..Default::default()
        },
        ListSandboxesRequest {
            label_selector: "novalue".into(),
            ..Default::default()
        },
    ] {
        let err = client.list_sandboxes(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
    }
}

#[tokio::test]
async fn exec_rejects_bad_requests() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "box").await;

    let err = exec(&mut client, exec_request("box", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = exec(&mut client, exec_request("box", &[""]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);

    let mut bad_env = exec_request("box", &["true"]);
    bad_env
        .environment
        .insert("1X".into(), "hidden-value".into());
    let err = exec(&mut client, bad_env).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(!err.message().contains("hidden-value"));

    let err = exec(&mut client, exec_request("ghost", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Interactive: the first message must be start.
    let err = match client
        .exec_sandbox_interactive(tokio_stream::iter(vec![ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(b"hi".to_vec().into())),
        }]))
        .await
    {
        Err(status) => status,
        Ok(response) => collect(response.into_inner()).await.expect_err("an error"),
    };
    assert_eq!(err.code(), Code::InvalidArgument);

    // Oversized interactive stdin frame.
    let messages = vec![
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Start(exec_request(
                "box",
                &["cat"],
            ))),
        },
        ExecSandboxInput {
            payload: Some(exec_sandbox_input::Payload::Stdin(
                vec![0; 2 * 1024 * 1024].into(),
            )),
        },
    ];
    let response = client
        .exec_sandbox_interactive(tokio_stream::iter(messages))
        .await;
    let err = match response {
        Err(status) => status,
        Ok(response) => collect(response.into_inner()).await.expect_err("an error"),
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");

    // A request over the gateway's message limit.
    let mut huge = exec_request("box", &["cat"]);
    huge.stdin = vec![0; 9 * 1024 * 1024];
    let err = exec(&mut client, huge).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::ResourceExhausted | Code::OutOfRange),
        "{err:?}"
    );
}

#[tokio::test]
async fn forward_rejects_bad_frames_and_targets() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "fwd").await;

    let err = forward_error(
        &mut client,
        vec![TcpForwardFrame {
            payload: Some(tcp_forward_frame::Payload::Data(b"x".to_vec().into())),
        }],
    )
    .await;
    assert_eq!(err.code(), Code::InvalidArgument);

    for (host, port) in [
        ("10.1.2.3", 80),
        ("example.com", 80),
        ("127.0.0.1", 0),
        ("127.0.0.1", 70000),
    ] {
        let err = forward_error(&mut client, vec![forward_init("fwd", host, port)]).await;
        assert_eq!(err.code(), Code::InvalidArgument, "{host}:{port}");
    }
    let err = forward_error(&mut client, vec![forward_init("ghost", "127.0.0.1", 80)]).await;
    assert_eq!(err.code(), Code::NotFound);

    // An oversized data frame ends the stream with RESOURCE_EXHAUSTED.
    let listener = sandbox_net(&mut client, "fwd")
        .await
        .bind("127.0.0.1:0")
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let err = forward_error(
        &mut client,
        vec![
            forward_init("fwd", "127.0.0.1", port.into()),
            TcpForwardFrame {
                payload: Some(tcp_forward_frame::Payload::Data(
                    vec![0; 2 * 1024 * 1024].into(),
                )),
            },
        ],
    )
    .await;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}

#[tokio::test]
async fn a_sandbox_that_is_not_ready_is_a_failed_precondition() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "broken").await;
    let pid = gw.supervisor_pids()[0];
    openshell_testkit::signal(pid, libc::SIGKILL);
    wait_phase(&mut client, "broken", SandboxPhase::Error).await;
    let err = exec(&mut client, exec_request("broken", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let err = forward_error(&mut client, vec![forward_init("broken", "127.0.0.1", 80)]).await;
    assert_eq!(err.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn missing_or_wrong_tokens_are_unauthenticated() {
    let gw = start();
    let mut none = client_with(&gw, None).await;
    let err = none
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut wrong = client_with(&gw, Some("not-the-token")).await;
    let err = wrong
        .create_sandbox(CreateSandboxRequest {
            name: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(!err.message().contains("not-the-token"));
    let err = wrong
        .exec_sandbox(exec_request("x", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut good = client(&gw).await;
    assert_eq!(sandbox_count(&mut good).await, 0);
}

#[tokio::test]
async fn a_sandbox_token_acts_only_for_its_sandbox() {
    let gw = start();
    let mut client = client(&gw).await;
    let a = create_ready(&mut client, "sandbox-a").await;
    let b = create_ready(&mut client, "sandbox-b").await;
    let a_id = a.metadata.unwrap().id;
    let b_id = b.metadata.unwrap().id;
    // The token sandbox A's supervisor was given.
    let token_a = sandbox_token(&gw.store_dir(), &a_id).expect("token of sandbox A");

    let mut as_a = client_with(&gw, Some(&token_a)).await;
    // A hello for sandbox B with A's token.
    let hello = SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: b_id.clone(),
            instance_id: "intruder".into(),
            connection_epoch: 1,
            ..Default::default()
        })),
    };
    let result = as_a
        .connect_supervisor(tokio_stream::iter(vec![hello]))
        .await;
    let err = match result {
        Err(status) => status,
        Ok(response) => response.into_inner().message().await.expect_err("an error"),
    };
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // A sandbox token is not a user token.
    let err = as_a
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    // A's token opens RelayStream, but only with an init naming a channel
    // that is pending.
    for (first, code) in [
        (
            relay_frame::Payload::Data(b"x".to_vec().into()),
            Code::InvalidArgument,
        ),
        (
            relay_frame::Payload::Init(RelayInit {
                channel_id: "no-such-channel".into(),
            }),
            Code::NotFound,
        ),
    ] {
        let result = as_a
            .relay_stream(tokio_stream::iter(vec![RelayFrame {
                payload: Some(first),
            }]))
            .await;
        let err = match result {
            Err(status) => status,
            Ok(response) => response.into_inner().message().await.expect_err("an error"),
        };
        assert_eq!(err.code(), code, "{err:?}");
    }
    // And a user token is not a sandbox token.
    let err = match client
        .relay_stream(tokio_stream::iter(vec![RelayFrame {
            payload: Some(relay_frame::Payload::Init(RelayInit {
                channel_id: "x".into(),
            })),
        }]))
        .await
    {
        Err(status) => status,
        Ok(response) => response.into_inner().message().await.expect_err("an error"),
    };
    assert_eq!(err.code(), Code::Unauthenticated);

    // Both sandboxes are still served by their own supervisors.
    assert_eq!(
        sh(&mut client, "sandbox-b", "echo ok").await.stdout_text(),
        "ok\n"
    );
}

#[test]
fn dev_mode_is_refused_off_loopback_and_tokens_are_required() {
    let bin = openshell_testkit::bin("openshell-gateway");
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&bin)
        .args([
            "serve",
            "--dev",
            "--listen",
            "0.0.0.0:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("OPENSHELL_GATEWAY_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
    let out = std::process::Command::new(&bin)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("OPENSHELL_GATEWAY_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no user tokens"));
}

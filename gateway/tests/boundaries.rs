//! Boundaries found in review, each checked against the real gateway binary:
//! metric labels callers cannot invent, create-time inputs the gateway does
//! not model, bounded echoes of input, and command-line flags that are only
//! safe in some settings.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::Full;
use openshell_proto::sandbox::{NetworkBinary, NetworkEndpoint, NetworkPolicyRule, SandboxPolicy};
use openshell_proto::*;
use openshell_testkit::Gateway;
use tonic::Code;

/// One unary gRPC call with an empty message to any path; the answer's
/// grpc-status (headers of a trailers-only answer, else trailers).
async fn raw_call(gw: &Gateway, path: &str, token: Option<&str>) -> Option<String> {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(gw.grpc_addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let mut request = http::Request::post(format!("{}{path}", gw.url))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
        .await
        .expect("answered within 20 s")
        .expect("an HTTP/2 answer");
    if let Some(code) = response.headers().get("grpc-status") {
        return Some(code.to_str().unwrap().to_owned());
    }
    let collected = response.into_body().collect().await.expect("body");
    collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap().to_owned())
}

// ------------------------------------------------------------ metric labels

#[tokio::test]
async fn unknown_paths_are_counted_as_unknown_and_create_no_series() {
    let gw = start();
    let invented = [
        "/openshell.v1.OpenShell/NoSuchMethod-7f3a",
        "/random.Service/Health",
        "/x9q2/y8w1",
        "/openshell.peer.v1.Peer/Invented-4c1d",
    ];
    for path in invented {
        for token in [None, Some(TOKEN)] {
            let code = raw_call(&gw, path, token).await;
            assert!(
                code.as_deref().is_some_and(|c| c != "0"),
                "{path}: {code:?}"
            );
        }
    }
    // A real method keeps its own label.
    assert_eq!(
        raw_call(&gw, "/openshell.v1.OpenShell/Health", None)
            .await
            .as_deref(),
        Some("0")
    );

    let text = gw.metrics();
    let mut unknown = 0.0;
    for line in text
        .lines()
        .filter(|l| l.starts_with("openshell_server_requests_total{"))
    {
        let method = line
            .split("method=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("no method label: {line}"));
        let known = openshell_proto::METHODS.iter().any(|m| m.name == method);
        assert!(known || method == "unknown", "unexpected series: {line}");
        if method == "unknown" {
            unknown += line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_default();
        }
    }
    for part in ["NoSuchMethod", "random.Service", "x9q2", "y8w1", "Invented"] {
        assert!(!text.contains(part), "{part} in metrics:\n{text}");
    }
    assert_eq!(unknown, (invented.len() * 2) as f64, "{text}");
    assert_eq!(
        gw.metric("openshell_server_requests_total{method=\"Health\",code=\"ok\"}"),
        Some(1.0)
    );
}

// ------------------------------------------------------------ edge listen

#[test]
fn edge_refuses_a_public_listen_address_without_allow_public() {
    let bin = openshell_testkit::bin("openshell-gateway");
    let out = std::process::Command::new(&bin)
        .args(["edge", "--listen", "0.0.0.0:0"])
        .args(["--replica", "gw-0=http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    assert!(stderr.contains("--allow-public"), "{stderr}");

    // With --allow-public it serves until SIGTERM and exits cleanly.
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready.json");
    let mut child = std::process::Command::new(&bin)
        .args(["edge", "--listen", "0.0.0.0:0", "--allow-public"])
        .args(["--replica", "gw-0=http://127.0.0.1:9"])
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let served = openshell_testkit::wait_until(Duration::from_secs(20), || {
        ready.exists() || child.try_wait().ok().flatten().is_some()
    });
    assert!(served && ready.exists(), "edge did not start");
    openshell_testkit::signal(child.id() as i32, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

// ------------------------------------------------------------ create inputs

async fn sandbox_count(client: &mut Client) -> usize {
    client
        .list_sandboxes(ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .len()
}

/// A create the gateway must refuse: INVALID_ARGUMENT naming `field`, and
/// no sandbox record or supervisor afterwards.
async fn assert_create_refused(
    gw: &Gateway,
    client: &mut Client,
    request: CreateSandboxRequest,
    field: &str,
) {
    let before = sandbox_count(client).await;
    let err = client.create_sandbox(request).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
    assert!(err.message().contains(field), "{field}: {}", err.message());
    assert_eq!(sandbox_count(client).await, before, "{field}");
    assert_eq!(gw.supervisor_pids().len(), before, "{field}");
}

#[tokio::test]
async fn create_refuses_client_set_providers() {
    let gw = start();
    let mut client = client(&gw).await;
    assert_create_refused(
        &gw,
        &mut client,
        CreateSandboxRequest {
            name: "with-providers".into(),
            spec: Some(SandboxSpec {
                providers: vec!["github".into()],
                ..Default::default()
            }),
            ..Default::default()
        },
        "spec.providers",
    )
    .await;
    let err = client
        .get_sandbox(GetSandboxRequest {
            name: "with-providers".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

fn network_policy(host: &str) -> SandboxPolicy {
    SandboxPolicy {
        version: 0,
        network_policies: [(
            "api".to_owned(),
            NetworkPolicyRule {
                name: String::new(),
                endpoints: vec![NetworkEndpoint {
                    host: host.into(),
                    port: 443,
                    protocol: "https".into(),
                }],
                binaries: vec![NetworkBinary {
                    path: "/usr/bin/curl".into(),
                }],
            },
        )]
        .into(),
    }
}

fn create(name: &str, spec: SandboxSpec) -> CreateSandboxRequest {
    CreateSandboxRequest {
        name: name.into(),
        spec: Some(spec),
        ..Default::default()
    }
}

#[tokio::test]
async fn create_refuses_inputs_the_gateway_does_not_model_and_changes_nothing() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "existing").await;
    let rows: Vec<(&str, CreateSandboxRequest)> = vec![
        (
            "await_main_process_attachment",
            CreateSandboxRequest {
                name: "await".into(),
                await_main_process_attachment: true,
                ..Default::default()
            },
        ),
        (
            "workload_template",
            CreateSandboxRequest {
                name: "templated".into(),
                workload_template: "python-dev".into(),
                ..Default::default()
            },
        ),
        (
            "service_exposures",
            CreateSandboxRequest {
                name: "exposed".into(),
                service_exposures: vec![SandboxServiceExposure {
                    service: "web".into(),
                    target_port: 8080,
                    ..Default::default()
                }],
                ..Default::default()
            },
        ),
        (
            "spec.resource_requirements",
            create(
                "gpu",
                SandboxSpec {
                    resource_requirements: Some(ResourceRequirements {
                        gpu: Some(GpuResourceRequirements { count: Some(1) }),
                    }),
                    ..Default::default()
                },
            ),
        ),
        (
            "spec.restart_policy",
            create(
                "on-failure",
                SandboxSpec {
                    restart_policy: SandboxRestartPolicy::OnFailure as i32,
                    ..Default::default()
                },
            ),
        ),
        (
            "spec.restart_policy",
            create(
                "always",
                SandboxSpec {
                    restart_policy: SandboxRestartPolicy::Always as i32,
                    ..Default::default()
                },
            ),
        ),
        (
            "spec.restart_policy",
            create(
                "unknown-policy",
                SandboxSpec {
                    restart_policy: 42,
                    ..Default::default()
                },
            ),
        ),
    ];
    for (field, request) in rows {
        assert_create_refused(&gw, &mut client, request, field).await;
    }
    // An invalid create-time policy is refused like an invalid UpdateConfig.
    let err = client
        .create_sandbox(create(
            "bad-policy",
            SandboxSpec {
                policy: Some(network_policy("not a host")),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(sandbox_count(&mut client).await, 1);
    assert_eq!(gw.supervisor_pids().len(), 1);

    // NEVER (and UNSPECIFIED, which means NEVER) are what the gateway does.
    client
        .create_sandbox(create(
            "never",
            SandboxSpec {
                restart_policy: SandboxRestartPolicy::Never as i32,
                ..Default::default()
            },
        ))
        .await
        .expect("restart_policy NEVER is accepted");
    wait_phase(&mut client, "never", SandboxPhase::Ready).await;
}

#[tokio::test]
async fn a_create_time_policy_becomes_the_sandboxes_policy() {
    let gw = start();
    let mut client = client(&gw).await;
    let created = client
        .create_sandbox(create(
            "with-policy",
            SandboxSpec {
                policy: Some(network_policy("api.example.com")),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    // The spec keeps no copy that a later UpdateConfig would leave stale.
    assert_eq!(created.spec.as_ref().unwrap().policy, None);
    let id = created.metadata.as_ref().unwrap().id.clone();
    let config = client
        .get_sandbox_config(sandbox::GetSandboxConfigRequest {
            sandbox_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let policy = config.policy.clone().expect("policy");
    assert_eq!(config.version, 1);
    assert_eq!(policy.version, 1);
    assert_eq!(config.policy_source(), sandbox::PolicySource::Sandbox);
    let rule = &policy.network_policies["api"];
    assert_eq!(rule.name, "api", "normalised like UpdateConfig");
    assert_eq!(rule.endpoints[0].host, "api.example.com");
    assert!(!config.policy_hash.is_empty());

    // The same policy through UpdateConfig changes nothing: it is already set.
    let update = client
        .update_config(UpdateConfigRequest {
            sandbox: "with-policy".into(),
            policy: Some(network_policy("api.example.com")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(update.version, 1);
    assert_eq!(update.policy_hash, config.policy_hash);
    wait_phase(&mut client, "with-policy", SandboxPhase::Ready).await;
}

#[tokio::test]
async fn a_template_image_is_accepted_and_marked_ignored() {
    let gw = start();
    let mut client = client(&gw).await;
    let created = client
        .create_sandbox(create(
            "with-image",
            SandboxSpec {
                template: Some(SandboxTemplate {
                    image: "ghcr.io/example/dev:latest".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    let ignored = |sandbox: &Sandbox| {
        sandbox
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .find(|c| c.r#type == "ImageIgnored")
            .cloned()
    };
    let condition = ignored(&created).expect("ImageIgnored condition at create");
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains("spec.template.image"),
        "{condition:?}"
    );
    // It stays through the phase changes; the image stays in the spec.
    let ready = wait_phase(&mut client, "with-image", SandboxPhase::Ready).await;
    assert!(ignored(&ready).is_some(), "{ready:?}");
    assert_eq!(
        ready.spec.unwrap().template.unwrap().image,
        "ghcr.io/example/dev:latest"
    );
    // Without an image there is no such condition.
    let plain = create_ready(&mut client, "no-image").await;
    assert!(ignored(&plain).is_none());
}

// ------------------------------------------------------------ command line

/// `serve` with `args` on loopback and a fresh data directory, expected to
/// exit on its own (a refusal); its exit status and stderr.
fn serve_refusal(args: &[&str]) -> (std::process::ExitStatus, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(openshell_testkit::bin("openshell-gateway"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path())
        .args(args)
        .env_remove("OPENSHELL_GATEWAY_TOKENS")
        .env_remove("OPENSHELL_DATABASE_URL")
        .env_remove("OPENSHELL_PEER_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = openshell_testkit::wait_until(Duration::from_secs(20), || {
        child.try_wait().ok().flatten().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(exited, "serve {args:?} kept running");
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn test_flags_need_allow_test_flags() {
    for args in [
        &["--dev", "--driver", "none"][..],
        &["--dev", "--config-build-delay-ms", "5"],
        &["--dev", "--config-reconcile-ms", "100"],
        &["--dev", "--heartbeat-ms", "1000"],
        &[
            "--token",
            "t",
            "--member-refresh-ms",
            "300",
            "--member-ttl-ms",
            "3000",
        ],
    ] {
        let (status, stderr) = serve_refusal(args);
        assert!(!status.success(), "{args:?}");
        assert!(stderr.contains("for tests and benchmarks only"), "{stderr}");
        assert!(stderr.contains("--allow-test-flags"), "{stderr}");
        assert!(stderr.contains(args[args.len() - 2]), "{stderr}");
    }
    // --dev alone still means "no authentication", nothing more.
    let gw = Gateway::start(openshell_testkit::GatewayOptions::dev());
    assert!(!gw.log().contains("--allow-test-flags"));
}

/// A lost-host bound the seat renewals could not keep up with, or a policy
/// that does not exist, is refused before anything starts, naming the flag.
#[test]
fn bad_lost_host_flags_are_refused() {
    for (args, says) in [
        (
            &["--dev", "--driver", "hosts", "--host-lost-after", "5"][..],
            "--host-lost-after",
        ),
        (
            &["--dev", "--driver", "hosts", "--host-lost-after", "x"],
            "--host-lost-after",
        ),
        (
            &["--dev", "--driver", "hosts", "--host-lost-policy", "ignore"],
            "--host-lost-policy",
        ),
        // The test knob below the renewal period (5 s at the default heartbeat).
        (
            &[
                "--dev",
                "--allow-test-flags",
                "--driver",
                "hosts",
                "--host-lost-after-ms",
                "3000",
            ],
            "more than twice the host seat renewal period",
        ),
    ] {
        let (status, stderr) = serve_refusal(args);
        assert!(!status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test]
async fn test_flags_run_with_allow_test_flags() {
    let gw = Gateway::start(openshell_testkit::GatewayOptions {
        extra_args: ["--allow-test-flags", "--config-reconcile-ms", "100"]
            .map(String::from)
            .to_vec(),
        ..openshell_testkit::GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    create_ready(&mut client, "allowed").await;
}

#[test]
fn secrets_on_the_command_line_are_warned_about_without_their_value() {
    let gw = Gateway::start(openshell_testkit::GatewayOptions {
        extra_args: ["--peer-token", "peer-secret-91d2"]
            .map(String::from)
            .to_vec(),
        ..openshell_testkit::GatewayOptions::with_token(TOKEN)
    });
    let log = gw.log();
    for flag in ["--token", "--peer-token"] {
        assert!(
            log.contains(&format!(
                "{flag} was given on the command line, which every local user can read"
            )),
            "{log}"
        );
    }
    assert!(
        log.contains("--tokens-file or OPENSHELL_GATEWAY_TOKENS"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "{log}");
    assert!(!log.contains("peer-secret-91d2"), "{log}");
    drop(gw);

    // A database URL with a password is a secret too (the store is
    // unreachable, so serve stops after the warning).
    let (status, stderr) = serve_refusal(&[
        "--dev",
        "--database-url",
        "postgres://gw:db-secret-5a0c@127.0.0.1:1/openshell",
    ]);
    assert!(!status.success());
    assert!(
        stderr.contains("--database-url was given on the command line"),
        "{stderr}"
    );
    assert!(!stderr.contains("db-secret-5a0c"), "{stderr}");

    // Tokens from a file draw no warning.
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let gw = Gateway::start(openshell_testkit::GatewayOptions {
        extra_args: vec!["--tokens-file".into(), tokens.display().to_string()],
        ..Default::default()
    });
    assert!(
        !gw.log().contains("was given on the command line"),
        "{}",
        gw.log()
    );
}

// ------------------------------------------------------------ echoed input

/// An error that shows at most 64 characters of a 10,000-character input.
fn assert_short_echo(row: &str, err: &tonic::Status, filler: char) {
    let message = err.message();
    assert!(message.chars().count() < 300, "{row}: {message}");
    let run: String = std::iter::repeat_n(filler, 65).collect();
    assert!(!message.contains(&run), "{row}: {message}");
}

#[tokio::test]
async fn errors_quote_at_most_64_characters_of_any_input() {
    let gw = start();
    let mut client = client(&gw).await;
    create_ready(&mut client, "box").await;
    let x = "x".repeat(10_000);
    let long_workspace = Some(datamodel::WorkspaceSelector {
        selection: Some(datamodel::workspace_selector::Selection::Workspace(
            "w".repeat(10_000),
        )),
    });

    for (row, selector, filler) in [
        ("selector", x.clone(), 'x'),
        ("second term", format!("a=1,{x}"), 'x'),
        ("multibyte", "é".repeat(10_000), 'é'),
    ] {
        let err = client
            .list_sandboxes(ListSandboxesRequest {
                label_selector: selector,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{row}");
        assert!(err.message().contains("..."), "{row}: {}", err.message());
        assert_short_echo(row, &err, filler);
    }

    let err = client
        .get_sandbox(GetSandboxRequest {
            name: x.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short_echo("get name", &err, 'x');

    let err = client
        .get_sandbox(GetSandboxRequest {
            name: "box".into(),
            workspace_scope: long_workspace.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_short_echo("get workspace", &err, 'w');

    let err = client
        .create_sandbox(CreateSandboxRequest {
            name: "other".into(),
            workspace_scope: long_workspace,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_short_echo("create workspace", &err, 'w');

    let err = client
        .create_sandbox(create(
            "env",
            SandboxSpec {
                environment: [("K".repeat(10_000), "v".into())].into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short_echo("environment key", &err, 'K');

    let err = client
        .update_config(UpdateConfigRequest {
            sandbox: "box".into(),
            setting_key: "s".repeat(10_000),
            setting_value: Some(sandbox::SettingValue {
                value: Some(sandbox::setting_value::Value::BoolValue(true)),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short_echo("setting key", &err, 's');

    let mut policy = network_policy("api.example.com");
    let rule = policy.network_policies.remove("api").unwrap();
    policy.network_policies.insert("r".repeat(10_000), rule);
    let err = client
        .update_config(UpdateConfigRequest {
            sandbox: "box".into(),
            policy: Some(policy),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_short_echo("rule key", &err, 'r');

    let err = client
        .attach_provider(AttachProviderRequest {
            sandbox: "box".into(),
            provider: x.clone(),
        })
        .await
        .unwrap_err();
    assert_short_echo("provider name", &err, 'x');

    assert_eq!(sandbox_count(&mut client).await, 1);
}

//! Every bad-input row of the configuration RPCs (UpdateConfig, the
//! provider RPCs, GetSandboxConfig and GetSandboxProviderEnvironment)
//! against the real gateway: the right gRPC status, nothing changed, and no
//! secret or setting value in any error or log line.

mod common;
mod config_util;

use common::*;
use config_util::*;
use openshell_proto::sandbox::{
    GetSandboxConfigRequest, NetworkBinary, NetworkEndpoint, NetworkPolicyRule, SandboxPolicy,
    SettingValue, setting_value,
};
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::Code;

const SECRET: &str = "zz-secret-4f1d";

fn rule(host: &str, port: u32, protocol: &str, binary: &str) -> NetworkPolicyRule {
    NetworkPolicyRule {
        name: String::new(),
        endpoints: vec![NetworkEndpoint {
            host: host.into(),
            port,
            protocol: protocol.into(),
        }],
        binaries: vec![NetworkBinary {
            path: binary.into(),
        }],
    }
}

fn policy(key: &str, rule: NetworkPolicyRule) -> Option<SandboxPolicy> {
    Some(SandboxPolicy {
        version: 0,
        network_policies: [(key.to_owned(), rule)].into(),
    })
}

fn value(v: setting_value::Value) -> Option<SettingValue> {
    Some(SettingValue { value: Some(v) })
}

fn provider(name: &str, env: &[(&str, &str)]) -> Option<Provider> {
    Some(Provider {
        name: name.into(),
        environment: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
}

fn check(row: &str, result: Result<impl std::fmt::Debug, tonic::Status>, code: Code) {
    let err = result.expect_err(row);
    assert_eq!(err.code(), code, "{row}: {err:?}");
    assert!(
        !err.message().contains(SECRET),
        "{row}: secret echoed: {err:?}"
    );
    assert!(
        err.metadata().get("x-openshell-served-by").is_some(),
        "{row}: no served-by"
    );
}

/// Everything a bad request could have changed.
async fn state(client: &mut Client, id: &str) -> (sandbox::GetSandboxConfigResponse, Sandbox) {
    let config = client
        .get_sandbox_config(GetSandboxConfigRequest {
            sandbox_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let sandbox = client
        .get_sandbox(GetSandboxRequest {
            name: "target".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    (config, sandbox)
}

#[tokio::test]
async fn config_rpcs_refuse_bad_input_and_change_nothing() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: push_args(None),
        ..GatewayOptions::with_token(TOKEN)
    });
    let mut client = client(&gw).await;
    let target = create_ready(&mut client, "target").await;
    let other = create_ready(&mut client, "other").await;
    let (target_id, other_id) = (id(&target), id(&other));
    client
        .create_provider(CreateProviderRequest {
            provider: provider("known", &[("KEY", SECRET)]),
        })
        .await
        .unwrap();
    client
        .attach_provider(AttachProviderRequest {
            sandbox: "target".into(),
            provider: "known".into(),
        })
        .await
        .unwrap();
    set(&mut client, "target", "kept", string("yes")).await;
    let before = state(&mut client, &target_id).await;
    let known_revision = before.0.provider_env_revision;

    // ------------------------------------------------ UpdateConfig
    let ok_rule = rule("api.example.com", 443, "rest", "/usr/bin/curl");
    let big = format!("{SECRET}{}", "x".repeat(20_000));
    let rows: Vec<(&str, UpdateConfigRequest, Code)> = vec![
        (
            "global with a sandbox",
            UpdateConfigRequest {
                sandbox: "target".into(),
                global: true,
                setting_key: "k".into(),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "no sandbox, not global",
            UpdateConfigRequest {
                setting_key: "k".into(),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "nothing to update",
            UpdateConfigRequest {
                sandbox: "target".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "bad sandbox name",
            UpdateConfigRequest {
                sandbox: "Not_A_Name".into(),
                setting_key: "k".into(),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "missing sandbox",
            UpdateConfigRequest {
                sandbox: "nobody".into(),
                setting_key: "k".into(),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::NotFound,
        ),
        (
            "policy and setting together",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", ok_rule.clone()),
                setting_key: "k".into(),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "policy with a setting value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", ok_rule.clone()),
                setting_value: value(string("v")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "setting key without a value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "k".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "value without a key",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_value: value(string(SECRET)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "delete without a key",
            UpdateConfigRequest {
                sandbox: "target".into(),
                delete_setting: true,
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "delete with a value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "kept".into(),
                setting_value: value(string(SECRET)),
                delete_setting: true,
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "bad setting key",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "-bad key".into(),
                setting_value: value(string(SECRET)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "empty setting value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "k".into(),
                setting_value: Some(SettingValue { value: None }),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "oversized string value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "k".into(),
                setting_value: value(string(&big)),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "oversized bytes value",
            UpdateConfigRequest {
                sandbox: "target".into(),
                setting_key: "k".into(),
                setting_value: value(setting_value::Value::BytesValue(vec![7; 70_000])),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "rule with a bad name",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("bad rule", ok_rule.clone()),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "rule name differs from its key",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy(
                    "r",
                    NetworkPolicyRule {
                        name: "other".into(),
                        ..ok_rule.clone()
                    },
                ),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "rule without endpoints",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy(
                    "r",
                    NetworkPolicyRule {
                        endpoints: vec![],
                        ..ok_rule.clone()
                    },
                ),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "endpoint without a host",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("", 443, "rest", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "endpoint host with spaces",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("a host", 443, "rest", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "port 0",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("a.example", 0, "rest", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "port above 65535",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("a.example", 70_000, "rest", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "unknown protocol",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("a.example", 443, "gopher", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "relative binary path",
            UpdateConfigRequest {
                sandbox: "target".into(),
                policy: policy("r", rule("a.example", 443, "rest", "curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
        (
            "global policy that is invalid",
            UpdateConfigRequest {
                global: true,
                policy: policy("r", rule("a.example", 0, "rest", "/usr/bin/curl")),
                ..Default::default()
            },
            Code::InvalidArgument,
        ),
    ];
    for (row, request, code) in rows {
        check(row, client.update_config(request).await, code);
    }
    let mut anonymous = client_with(&gw, None).await;
    check(
        "update without a token",
        anonymous
            .update_config(setting("target", "k", string("v")))
            .await,
        Code::Unauthenticated,
    );
    let target_token = sandbox_token(&gw.store_dir(), &target_id);
    let mut as_target = client_with(&gw, Some(&target_token)).await;
    check(
        "update with a sandbox token",
        as_target
            .update_config(setting("target", "k", string("v")))
            .await,
        Code::Unauthenticated,
    );

    // ------------------------------------------------ providers
    let long = format!("{SECRET}{}", "y".repeat(40_000));
    let nul = format!("{SECRET}\0");
    let provider_rows: Vec<(&str, Option<Provider>, Code)> = vec![
        ("no provider", None, Code::InvalidArgument),
        (
            "empty name",
            provider("", &[("A", "1")]),
            Code::InvalidArgument,
        ),
        (
            "bad name",
            provider("Bad_Name", &[("A", "1")]),
            Code::InvalidArgument,
        ),
        (
            "bad key",
            provider("fresh", &[("1BAD", SECRET)]),
            Code::InvalidArgument,
        ),
        (
            "oversized value",
            provider("fresh", &[("A", &long)]),
            Code::InvalidArgument,
        ),
        (
            "NUL in a value",
            provider("fresh", &[("A", &nul)]),
            Code::InvalidArgument,
        ),
        (
            "duplicate",
            provider("known", &[("KEY", "other")]),
            Code::AlreadyExists,
        ),
    ];
    for (row, p, code) in &provider_rows {
        check(
            &format!("create: {row}"),
            client
                .create_provider(CreateProviderRequest {
                    provider: p.clone(),
                })
                .await,
            *code,
        );
    }
    for (row, p, code) in &provider_rows[..6] {
        check(
            &format!("update: {row}"),
            client
                .update_provider(UpdateProviderRequest {
                    provider: p.clone(),
                })
                .await,
            *code,
        );
    }
    check(
        "update a missing provider",
        client
            .update_provider(UpdateProviderRequest {
                provider: provider("missing", &[("A", SECRET)]),
            })
            .await,
        Code::NotFound,
    );
    let attach_rows = [
        (
            "attach to a missing sandbox",
            "nobody",
            "known",
            Code::NotFound,
        ),
        (
            "attach a missing provider",
            "target",
            "missing",
            Code::NotFound,
        ),
        ("attach twice", "target", "known", Code::AlreadyExists),
        (
            "attach a bad provider name",
            "target",
            "Bad_Name",
            Code::InvalidArgument,
        ),
        (
            "attach to a bad sandbox name",
            "Bad_Name",
            "known",
            Code::InvalidArgument,
        ),
    ];
    for (row, sandbox, p, code) in attach_rows {
        check(
            row,
            client
                .attach_provider(AttachProviderRequest {
                    sandbox: sandbox.into(),
                    provider: p.into(),
                })
                .await,
            code,
        );
    }
    check(
        "detach what is not attached",
        client
            .detach_provider(DetachProviderRequest {
                sandbox: "other".into(),
                provider: "known".into(),
            })
            .await,
        Code::NotFound,
    );
    check(
        "detach from a missing sandbox",
        client
            .detach_provider(DetachProviderRequest {
                sandbox: "nobody".into(),
                provider: "known".into(),
            })
            .await,
        Code::NotFound,
    );
    check(
        "create a provider without a token",
        anonymous
            .create_provider(CreateProviderRequest {
                provider: provider("fresh", &[("A", SECRET)]),
            })
            .await,
        Code::Unauthenticated,
    );

    // ------------------------------------------------ reads
    check(
        "config without a sandbox id",
        client
            .get_sandbox_config(GetSandboxConfigRequest::default())
            .await,
        Code::InvalidArgument,
    );
    check(
        "config of a missing sandbox",
        client
            .get_sandbox_config(GetSandboxConfigRequest {
                sandbox_id: "00000000-0000-4000-8000-000000000000".into(),
            })
            .await,
        Code::NotFound,
    );
    check(
        "config without a token",
        anonymous
            .get_sandbox_config(GetSandboxConfigRequest {
                sandbox_id: target_id.clone(),
            })
            .await,
        Code::Unauthenticated,
    );
    let mut wrong = client_with(&gw, Some("ossb_not-a-real-token")).await;
    check(
        "config with a wrong token",
        wrong
            .get_sandbox_config(GetSandboxConfigRequest {
                sandbox_id: target_id.clone(),
            })
            .await,
        Code::Unauthenticated,
    );
    check(
        "config of another sandbox with a sandbox token",
        as_target
            .get_sandbox_config(GetSandboxConfigRequest {
                sandbox_id: other_id.clone(),
            })
            .await,
        Code::PermissionDenied,
    );
    check(
        "environment with a user token",
        client
            .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
                sandbox_id: target_id.clone(),
            })
            .await,
        Code::Unauthenticated,
    );
    check(
        "environment of another sandbox",
        as_target
            .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
                sandbox_id: other_id.clone(),
            })
            .await,
        Code::PermissionDenied,
    );
    check(
        "environment without a sandbox id",
        as_target
            .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest::default())
            .await,
        Code::InvalidArgument,
    );
    // The sandbox's own token reads its own configuration and environment.
    let own = as_target
        .get_sandbox_config(GetSandboxConfigRequest {
            sandbox_id: target_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own, before.0);
    let env = as_target
        .get_sandbox_provider_environment(GetSandboxProviderEnvironmentRequest {
            sandbox_id: target_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(env.environment.get("KEY").map(String::as_str), Some(SECRET));
    assert_eq!(env.provider_env_revision, known_revision);

    // Nothing changed, and no secret reached the log.
    let after = state(&mut client, &target_id).await;
    assert_eq!(
        after.0, before.0,
        "a refused request changed the configuration"
    );
    assert_eq!(
        after.1.metadata.as_ref().unwrap().resource_version,
        before.1.metadata.as_ref().unwrap().resource_version,
        "a refused request changed the sandbox"
    );
    assert_eq!(after.1.spec, before.1.spec);
    let other_after = client
        .get_sandbox_config(GetSandboxConfigRequest {
            sandbox_id: other_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other_after.config_revision, 0);
    assert_eq!(other_after.provider_env_revision, 0);
    let log = gw.log();
    assert!(!log.contains(SECRET), "a secret reached the gateway log");
    for id in [&target_id, &other_id] {
        assert!(!supervisor_log(&gw.store_dir(), id).contains(SECRET));
    }
}

//! Unit tests of the configuration model's checks and hashes.

use super::*;
use openshell_proto::sandbox::{NetworkBinary, NetworkEndpoint};

fn rule(host: &str, port: u32) -> NetworkPolicyRule {
    NetworkPolicyRule {
        name: String::new(),
        endpoints: vec![NetworkEndpoint {
            host: host.into(),
            port,
            protocol: "rest".into(),
        }],
        binaries: vec![NetworkBinary {
            path: "/usr/bin/curl".into(),
        }],
    }
}

fn policy(rules: &[(&str, NetworkPolicyRule)]) -> SandboxPolicy {
    SandboxPolicy {
        version: 0,
        network_policies: rules
            .iter()
            .map(|(k, r)| (k.to_string(), r.clone()))
            .collect(),
    }
}

#[test]
fn policies_are_validated_and_normalised() {
    let ok = validate_policy(&policy(&[("github", rule("api.github.com", 443))])).unwrap();
    assert_eq!(ok.network_policies["github"].name, "github");
    for bad in [
        policy(&[("", rule("a.example", 443))]),
        policy(&[("bad key", rule("a.example", 443))]),
        policy(&[("x", rule("", 443))]),
        policy(&[("x", rule("a b", 443))]),
        policy(&[("x", rule("a.example", 0))]),
        policy(&[("x", rule("a.example", 70000))]),
        policy(&[(
            "x",
            NetworkPolicyRule {
                endpoints: vec![],
                ..rule("a", 1)
            },
        )]),
        policy(&[(
            "x",
            NetworkPolicyRule {
                name: "y".into(),
                ..rule("a", 1)
            },
        )]),
        policy(&[(
            "x",
            NetworkPolicyRule {
                binaries: vec![NetworkBinary {
                    path: "curl".into(),
                }],
                ..rule("a", 1)
            },
        )]),
    ] {
        assert_eq!(
            validate_policy(&bad).unwrap_err().code(),
            tonic::Code::InvalidArgument,
            "{bad:?}"
        );
    }
}

#[test]
fn policy_hash_ignores_the_version_and_map_order() {
    let a = policy(&[("a", rule("a.example", 1)), ("b", rule("b.example", 2))]);
    let mut b = policy(&[("b", rule("b.example", 2)), ("a", rule("a.example", 1))]);
    b.version = 7;
    assert_eq!(policy_hash(&a), policy_hash(&b));
    let c = policy(&[("a", rule("a.example", 1))]);
    assert_ne!(policy_hash(&a), policy_hash(&c));
}

#[test]
fn fingerprints_cover_both_parts() {
    let config = GetSandboxConfigResponse {
        config_revision: 3,
        ..Default::default()
    };
    let mut env = GetSandboxProviderEnvironmentResponse::default();
    env.environment.insert("A".into(), "1".into());
    env.environment.insert("B".into(), "2".into());
    let base = fingerprint(&config, &env);
    // Same content built again: same fingerprint.
    let mut again = GetSandboxProviderEnvironmentResponse::default();
    again.environment.insert("B".into(), "2".into());
    again.environment.insert("A".into(), "1".into());
    assert_eq!(base, fingerprint(&config, &again));
    again.environment.insert("A".into(), "changed".into());
    assert_ne!(base, fingerprint(&config, &again));
    let newer = GetSandboxConfigResponse {
        config_revision: 4,
        ..Default::default()
    };
    assert_ne!(base, fingerprint(&newer, &env));
}

#[test]
fn settings_are_validated_without_echoing_values() {
    let value = |v| Some(SettingValue { value: Some(v) });
    assert!(
        validate_setting(
            "log_level",
            value(setting_value::Value::StringValue("debug".into())).as_ref(),
            false
        )
        .is_ok()
    );
    assert!(validate_setting("log_level", None, true).is_ok());
    let secret = "s3cret-value".repeat(2000);
    let err = validate_setting(
        "k",
        value(setting_value::Value::StringValue(secret)).as_ref(),
        false,
    )
    .unwrap_err();
    assert!(!err.message().contains("s3cret"));
    assert!(validate_setting("k", Some(&SettingValue { value: None }), false).is_err());
    assert!(validate_setting("-k", None, true).is_err());
    assert!(
        validate_setting(
            "k",
            value(setting_value::Value::BoolValue(true)).as_ref(),
            true
        )
        .is_err()
    );
}

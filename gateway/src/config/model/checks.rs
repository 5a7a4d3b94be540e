//! Checks of policies, settings and providers before they reach the store.

use super::*;

pub(super) fn key_ok(key: &str) -> bool {
    let mut bytes = key.bytes();
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

pub(super) fn host_ok(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'*' | b':'))
}

/// Checks a policy and returns it normalised: rule names filled from their
/// keys, version cleared (the store assigns it).
pub fn validate_policy(policy: &SandboxPolicy) -> Result<SandboxPolicy, Status> {
    if policy.network_policies.len() > MAX_RULES {
        return Err(Status::invalid_argument(format!(
            "policy has {} network rules; the limit is {MAX_RULES}",
            policy.network_policies.len()
        )));
    }
    let mut out = SandboxPolicy::default();
    for (key, rule) in &policy.network_policies {
        if !key_ok(key) {
            return Err(Status::invalid_argument(format!(
                "network rule name {} is invalid: 1..{MAX_KEY_LEN} of [A-Za-z0-9_.-], \
                 starting with a letter or digit",
                quote(key)
            )));
        }
        // Valid keys are short, but every echo goes through quote().
        let shown = quote(key);
        if !rule.name.is_empty() && rule.name != *key {
            return Err(Status::invalid_argument(format!(
                "network_policies[{shown}].name must be empty or equal its key"
            )));
        }
        if rule.endpoints.is_empty() {
            return Err(Status::invalid_argument(format!(
                "network_policies[{shown}] needs at least one endpoint"
            )));
        }
        if rule.endpoints.len() > MAX_ENDPOINTS || rule.binaries.len() > MAX_BINARIES {
            return Err(Status::invalid_argument(format!(
                "network_policies[{shown}]: at most {MAX_ENDPOINTS} endpoints and \
                 {MAX_BINARIES} binaries"
            )));
        }
        for (i, endpoint) in rule.endpoints.iter().enumerate() {
            if !host_ok(&endpoint.host) {
                return Err(Status::invalid_argument(format!(
                    "network_policies[{shown}].endpoints[{i}].host must be a host name, \
                     address or wildcard (1..253 of [A-Za-z0-9.-_*:])"
                )));
            }
            if endpoint.port == 0 || endpoint.port > 65535 {
                return Err(Status::invalid_argument(format!(
                    "network_policies[{shown}].endpoints[{i}].port {} is out of range (1..65535)",
                    endpoint.port
                )));
            }
            if !PROTOCOLS.contains(&endpoint.protocol.as_str()) {
                return Err(Status::invalid_argument(format!(
                    "network_policies[{shown}].endpoints[{i}].protocol must be one of \
                     tcp, rest, http, https, grpc (or empty)"
                )));
            }
        }
        for (i, binary) in rule.binaries.iter().enumerate() {
            if !binary.path.starts_with('/')
                || binary.path.len() > 4096
                || binary.path.contains('\0')
            {
                return Err(Status::invalid_argument(format!(
                    "network_policies[{shown}].binaries[{i}].path must be an absolute path"
                )));
            }
        }
        out.network_policies.insert(
            key.clone(),
            NetworkPolicyRule {
                name: key.clone(),
                endpoints: rule.endpoints.clone(),
                binaries: rule.binaries.clone(),
            },
        );
    }
    Ok(out)
}

/// [`validate_policy`] plus the size limit of a stored policy.
pub(super) fn checked_policy(policy: &SandboxPolicy) -> Result<SandboxPolicy, Status> {
    let policy = validate_policy(policy)?;
    if policy.encoded_len() > MAX_POLICY_BYTES {
        return Err(Status::invalid_argument("policy is larger than 1 MiB"));
    }
    Ok(policy)
}

/// The policy scope row of a sandbox created with `spec.policy`: the row
/// `UpdateConfig` would write for that policy on a new sandbox (version 1),
/// so `GetSandboxConfig` returns it and an identical `UpdateConfig` later
/// changes nothing.
pub fn policy_seed(policy: &SandboxPolicy) -> Result<PolicySeed, Status> {
    let mut policy = checked_policy(policy)?;
    policy.version = 1;
    Ok(PolicySeed {
        version: 1,
        hash: policy_hash(&policy),
        encoded: policy.encode_to_vec(),
    })
}

pub(super) fn validate_setting(
    key: &str,
    value: Option<&SettingValue>,
    delete: bool,
) -> Result<(), Status> {
    if !key_ok(key) {
        return Err(Status::invalid_argument(format!(
            "setting_key {} is invalid: 1..{MAX_KEY_LEN} of [A-Za-z0-9_.-], starting \
             with a letter or digit",
            quote(key)
        )));
    }
    if delete {
        if value.is_some() {
            return Err(Status::invalid_argument(
                "delete_setting takes no setting_value",
            ));
        }
        return Ok(());
    }
    match value.and_then(|v| v.value.as_ref()) {
        None => Err(Status::invalid_argument(
            "setting_value is required (or set delete_setting)",
        )),
        Some(setting_value::Value::StringValue(s)) if s.len() > MAX_SETTING_STRING => {
            Err(Status::invalid_argument(format!(
                "setting_value is {} bytes; string values are limited to {MAX_SETTING_STRING}",
                s.len()
            )))
        }
        Some(setting_value::Value::BytesValue(b)) if b.len() > MAX_SETTING_BYTES => {
            Err(Status::invalid_argument(format!(
                "setting_value is {} bytes; bytes values are limited to {MAX_SETTING_BYTES}",
                b.len()
            )))
        }
        Some(_) => Ok(()),
    }
}

/// Provider names follow sandbox names (DNS labels).
pub(super) fn validate_provider(provider: Option<&Provider>) -> Result<&Provider, Status> {
    let provider = provider.ok_or_else(|| Status::invalid_argument("provider is required"))?;
    provider_name(&provider.name)?;
    validate::environment("provider.environment", &provider.environment)?;
    if let Some((key, _)) = provider
        .environment
        .iter()
        .find(|(_, v)| v.len() > MAX_ENV_VALUE || v.contains('\0'))
    {
        return Err(Status::invalid_argument(format!(
            "provider.environment[{}]: values must be at most {MAX_ENV_VALUE} bytes \
             without NUL",
            quote(key)
        )));
    }
    Ok(provider)
}

pub(super) fn provider_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("provider name is required"));
    }
    validate::sandbox_name(name).map_err(|_| {
        Status::invalid_argument(
            "provider name must be a DNS label (1..63 of [a-z0-9-], starting and ending with \
             a letter or digit)",
        )
    })
}

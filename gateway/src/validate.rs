//! Input checks for client requests. Every failure is INVALID_ARGUMENT with a
//! message that names the field and never echoes a value that could be secret
//! (environment values, tokens). Any input an error message does show goes
//! through [`quote`], so no request can make an error (or the log line that
//! repeats it) longer than a few lines.

use std::collections::HashMap;
use std::net::IpAddr;

use openshell_proto::datamodel::{WorkspaceSelector, workspace_selector::Selection};
use openshell_proto::{CreateSandboxRequest, SandboxRestartPolicy};
use tonic::Status;

pub const MAX_NAME_LEN: usize = 63;
/// Largest data chunk accepted in one forward frame or interactive stdin message.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
const MAX_LABELS: usize = 64;
const MAX_ENV: usize = 256;
const MAX_ARGV: usize = 4096;

/// Most characters of one input an error message shows.
pub const MAX_QUOTED_CHARS: usize = 64;

/// How an error message shows a client's input: Debug-quoted, at most
/// [`MAX_QUOTED_CHARS`] characters of it (cut on a character boundary),
/// followed by `...` when it was cut.
pub fn quote(input: &str) -> String {
    match input.char_indices().nth(MAX_QUOTED_CHARS) {
        None => format!("{input:?}"),
        Some((cut, _)) => format!("{:?}...", &input[..cut]),
    }
}

/// DNS-label-like: 1..=63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn sandbox_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("sandbox name is required"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(Status::invalid_argument(format!(
            "sandbox name is {} characters long; the limit is {MAX_NAME_LEN}",
            name.len()
        )));
    }
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !ok_chars || !ends_ok(name.bytes().next()) || !ends_ok(name.bytes().last()) {
        return Err(Status::invalid_argument(format!(
            "sandbox name {} is not a DNS label: use lowercase letters, digits and '-', \
             starting and ending with a letter or digit",
            quote(name)
        )));
    }
    Ok(())
}

/// Shell-identifier keys (`[A-Za-z_][A-Za-z0-9_]*`); values are never echoed.
pub fn environment(field: &str, env: &HashMap<String, String>) -> Result<(), Status> {
    if env.len() > MAX_ENV {
        return Err(Status::invalid_argument(format!(
            "{field} has {} entries; the limit is {MAX_ENV}",
            env.len()
        )));
    }
    for key in env.keys() {
        let mut bytes = key.bytes();
        let first_ok = bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') || key.len() > 256 {
            return Err(Status::invalid_argument(format!(
                "{field} key {} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)",
                quote(key)
            )));
        }
    }
    Ok(())
}

pub fn labels(field: &str, labels: &HashMap<String, String>) -> Result<(), Status> {
    if labels.len() > MAX_LABELS {
        return Err(Status::invalid_argument(format!(
            "{field} has {} entries; the limit is {MAX_LABELS}",
            labels.len()
        )));
    }
    for (key, value) in labels {
        if key.is_empty() || key.len() > 63 || value.len() > 253 {
            return Err(Status::invalid_argument(format!(
                "{field}: keys must be 1..63 characters and values at most 253"
            )));
        }
        if key.contains([',', '=']) || value.contains([',', '=']) {
            return Err(Status::invalid_argument(format!(
                "{field}: keys and values must not contain ',' or '='"
            )));
        }
    }
    Ok(())
}

pub fn command(field: &str, argv: &[String], required: bool) -> Result<(), Status> {
    if argv.is_empty() {
        if required {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        return Ok(());
    }
    if argv[0].is_empty() {
        return Err(Status::invalid_argument(format!(
            "{field}[0] must not be empty"
        )));
    }
    if argv.len() > MAX_ARGV {
        return Err(Status::invalid_argument(format!(
            "{field} has {} arguments; the limit is {MAX_ARGV}",
            argv.len()
        )));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Status::invalid_argument(format!(
            "{field} must not contain NUL bytes"
        )));
    }
    Ok(())
}

/// Public create-time inputs the reference gateway does not model: refused,
/// naming the field, rather than dropped (a caller relying on one must
/// learn it had no effect). `spec.policy` and `spec.template.image` are
/// handled by the caller; `spec.providers` is refused separately.
pub fn unmodeled_create_inputs(req: &CreateSandboxRequest) -> Result<(), Status> {
    let unsupported = |field: &str, why: &str| {
        Err(Status::invalid_argument(format!(
            "{field} is not supported by this gateway: {why}"
        )))
    };
    if req.await_main_process_attachment {
        return unsupported(
            "await_main_process_attachment",
            "create answers once the sandbox record exists; watch the sandbox for READY",
        );
    }
    if !req.workload_template.is_empty() {
        return unsupported("workload_template", "it has no workload templates");
    }
    if !req.service_exposures.is_empty() {
        return unsupported("service_exposures", "it exposes no sandbox services");
    }
    let Some(spec) = &req.spec else {
        return Ok(());
    };
    if spec.resource_requirements.is_some() {
        return unsupported(
            "spec.resource_requirements",
            "the process driver sets no resource limits and has no GPUs",
        );
    }
    match SandboxRestartPolicy::try_from(spec.restart_policy) {
        Ok(SandboxRestartPolicy::Unspecified | SandboxRestartPolicy::Never) => Ok(()),
        _ => unsupported(
            "spec.restart_policy",
            "the main process is never restarted (only NEVER is accepted)",
        ),
    }
}

/// Only the default workspace exists in the reference gateway.
pub fn workspace(selector: Option<&WorkspaceSelector>) -> Result<(), Status> {
    match selector.and_then(|s| s.selection.as_ref()) {
        None => Ok(()),
        Some(Selection::Workspace(name)) if name.is_empty() || name == "default" => Ok(()),
        Some(Selection::Workspace(name)) => Err(Status::not_found(format!(
            "workspace {} not found",
            quote(name)
        ))),
        Some(Selection::AllWorkspaces(_)) => Ok(()),
    }
}

/// Parses `k=v,k2=v2`.
pub fn label_selector(selector: &str) -> Result<Vec<(String, String)>, Status> {
    let mut pairs = Vec::new();
    for part in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| {
            Status::invalid_argument(format!(
                "label_selector term {} is not key=value",
                quote(part)
            ))
        })?;
        pairs.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok(pairs)
}

/// Loopback forward target: `localhost` means 127.0.0.1; port 1..=65535.
pub fn forward_target(host: &str, port: u32) -> Result<String, Status> {
    if port == 0 || port > 65535 {
        return Err(Status::invalid_argument(format!(
            "forward port {port} is out of range (1..65535)"
        )));
    }
    let host = if host.is_empty() || host.eq_ignore_ascii_case("localhost") {
        "127.0.0.1"
    } else {
        host
    };
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_loopback() => Ok(ip.to_string()),
        _ => Err(Status::invalid_argument(
            "forward target must be a loopback address (127.0.0.0/8, ::1 or localhost)",
        )),
    }
}

pub fn frame_size(what: &str, len: usize) -> Result<(), Status> {
    if len > MAX_FRAME_BYTES {
        return Err(Status::resource_exhausted(format!(
            "{what} of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit"
        )));
    }
    Ok(())
}

/// An SSH host key fingerprint as OpenSSH prints a SHA-256 one:
/// `SHA256:` and 43 characters of unpadded base64 (or empty: none).
pub fn host_key_fingerprint(value: &str) -> bool {
    value.is_empty()
        || value.strip_prefix("SHA256:").is_some_and(|b64| {
            b64.len() == 43
                && b64
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(sandbox_name("dev-1").is_ok());
        assert!(sandbox_name("a").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"x".repeat(64)] {
            assert_eq!(
                sandbox_name(bad).unwrap_err().code(),
                tonic::Code::InvalidArgument
            );
        }
    }

    #[test]
    fn env_keys_never_echo_values() {
        let mut env = HashMap::new();
        env.insert("1BAD".to_owned(), "secret-value".to_owned());
        let err = environment("environment", &env).unwrap_err();
        assert!(!err.message().contains("secret-value"));
        env.clear();
        env.insert("GOOD_1".to_owned(), "x".to_owned());
        assert!(environment("environment", &env).is_ok());
    }

    #[test]
    fn targets() {
        assert_eq!(forward_target("localhost", 80).unwrap(), "127.0.0.1");
        assert_eq!(forward_target("::1", 80).unwrap(), "::1");
        assert!(forward_target("10.0.0.1", 80).is_err());
        assert!(forward_target("example.com", 80).is_err());
        assert!(forward_target("127.0.0.1", 0).is_err());
        assert!(forward_target("127.0.0.1", 65536).is_err());
    }

    #[test]
    fn quotes_are_bounded_and_cut_on_a_character_boundary() {
        assert_eq!(quote("box"), "\"box\"");
        let exact = "a".repeat(MAX_QUOTED_CHARS);
        assert_eq!(quote(&exact), format!("{exact:?}"));
        let long = "é".repeat(10_000);
        let shown = quote(&long);
        assert_eq!(shown, format!("{:?}...", "é".repeat(MAX_QUOTED_CHARS)));
        let err = label_selector(&"x".repeat(10_000)).unwrap_err();
        assert!(err.message().len() < 200, "{}", err.message());
    }

    #[test]
    fn selectors() {
        assert_eq!(label_selector("a=1, b=2").unwrap().len(), 2);
        assert!(label_selector("a").is_err());
        assert!(label_selector("").unwrap().is_empty());
    }
}

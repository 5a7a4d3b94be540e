//! Applying the sandbox's configuration (pushed or polled; the supervisor
//! cannot tell which, see `openshell_sdk::config_session`).
//!
//! A configuration is checked, then written to `.openshell/config.json` in
//! the sandbox's working directory (atomically: a temporary file renamed
//! over the old one), where every process the sandbox runs can read it. The
//! provider environment goes into the environment of later execs (below
//! the request's own variables); the file names its keys, never its values.
//!
//! Checks: a `log_level` setting must be one of error, warn, info, debug or
//! trace. A configuration that fails a check, or cannot be written, is
//! rejected and the previous one stays in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openshell_proto::sandbox::{PolicySource, SettingScope, setting_value};
use openshell_sdk::{ApplyOutcome, ConfigSnapshot};
use serde_json::{Value, json};
use tracing::info;

use crate::exec::ExecSettings;

/// Directory (under the sandbox workdir) and file the configuration goes to.
pub const CONFIG_DIR: &str = ".openshell";
pub const CONFIG_FILE: &str = "config.json";
const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

pub fn config_path(workdir: &Path) -> PathBuf {
    workdir.join(CONFIG_DIR).join(CONFIG_FILE)
}

/// Checks what this supervisor understands; the reason never quotes values.
fn check(snapshot: &ConfigSnapshot) -> Result<(), String> {
    if let Some(setting) = snapshot.sandbox_config.settings.get("log_level") {
        let ok = matches!(
            setting.value.as_ref().and_then(|v| v.value.as_ref()),
            Some(setting_value::Value::StringValue(level)) if LOG_LEVELS.contains(&level.as_str())
        );
        if !ok {
            return Err(
                "setting log_level must be a string: one of error, warn, info, debug, trace".into(),
            );
        }
    }
    Ok(())
}

fn setting_json(value: Option<&setting_value::Value>) -> Value {
    match value {
        Some(setting_value::Value::StringValue(s)) => json!(s),
        Some(setting_value::Value::BoolValue(b)) => json!(b),
        Some(setting_value::Value::IntValue(i)) => json!(i),
        Some(setting_value::Value::BytesValue(b)) => json!({ "bytes_hex": hex(b) }),
        None => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The file's content: the configuration, and the provider environment's
/// identity and keys (values stay out of files).
pub fn render(snapshot: &ConfigSnapshot) -> Value {
    let config = &snapshot.sandbox_config;
    let env = &snapshot.provider_environment;
    let policy = config.policy.clone().unwrap_or_default();
    let rules: BTreeMap<&String, Value> = policy
        .network_policies
        .iter()
        .map(|(name, rule)| {
            let endpoints: Vec<Value> = rule
                .endpoints
                .iter()
                .map(|e| json!({ "host": e.host, "port": e.port, "protocol": e.protocol }))
                .collect();
            let binaries: Vec<&String> = rule.binaries.iter().map(|b| &b.path).collect();
            (
                name,
                json!({ "endpoints": endpoints, "binaries": binaries }),
            )
        })
        .collect();
    let settings: BTreeMap<&String, Value> = config
        .settings
        .iter()
        .map(|(key, setting)| {
            let scope = match SettingScope::try_from(setting.scope) {
                Ok(SettingScope::Global) => "global",
                Ok(SettingScope::Sandbox) => "sandbox",
                _ => "unspecified",
            };
            let value = setting_json(setting.value.as_ref().and_then(|v| v.value.as_ref()));
            (key, json!({ "value": value, "scope": scope }))
        })
        .collect();
    let source = match PolicySource::try_from(config.policy_source) {
        Ok(PolicySource::Global) => "global",
        Ok(PolicySource::Sandbox) => "sandbox",
        _ => "unspecified",
    };
    let mut keys: Vec<&String> = env.environment.keys().collect();
    keys.sort();
    json!({
        "config_revision": config.config_revision,
        "policy_version": config.version,
        "policy_hash": config.policy_hash,
        "policy_source": source,
        "global_policy_version": config.global_policy_version,
        "network_policies": rules,
        "settings": settings,
        "provider_env_revision": config.provider_env_revision,
        "provider_attachment_epoch": config.provider_attachment_epoch,
        "provider_environment_keys": keys,
    })
}

/// Writes `content` to `<workdir>/.openshell/config.json` through
/// descriptors, never following a symlink: sandbox processes own the
/// workdir and could otherwise point `.openshell` (or the file) anywhere the
/// supervisor may write.
fn write_atomically(path: &Path, content: &[u8]) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::io::Write as _;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let last_error = std::io::Error::last_os_error;
    let c = |s: &[u8]| CString::new(s).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL));
    let dir = path.parent().expect("config path has a directory");
    let workdir = dir.parent().expect("config dir has a parent");
    let name = c(CONFIG_DIR.as_bytes())?;
    let file = c(CONFIG_FILE.as_bytes())?;
    let tmp = c(format!(".{CONFIG_FILE}.tmp").as_bytes())?;
    let nofollow_dir = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let base = std::fs::File::open(workdir)?;
    // SAFETY: plain syscalls on NUL-terminated names and open descriptors;
    // every descriptor returned is owned at once.
    unsafe {
        if libc::mkdirat(base.as_raw_fd(), name.as_ptr(), 0o755) != 0
            && last_error().raw_os_error() != Some(libc::EEXIST)
        {
            return Err(last_error());
        }
        let fd = libc::openat(base.as_raw_fd(), name.as_ptr(), nofollow_dir);
        if fd < 0 {
            return Err(last_error());
        }
        let dir = OwnedFd::from_raw_fd(fd);
        libc::unlinkat(dir.as_raw_fd(), tmp.as_ptr(), 0);
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        let fd = libc::openat(dir.as_raw_fd(), tmp.as_ptr(), flags, 0o644);
        if fd < 0 {
            return Err(last_error());
        }
        let mut out = std::fs::File::from_raw_fd(fd);
        out.write_all(content)?;
        drop(out);
        if libc::renameat(
            dir.as_raw_fd(),
            tmp.as_ptr(),
            dir.as_raw_fd(),
            file.as_ptr(),
        ) != 0
        {
            return Err(last_error());
        }
    }
    Ok(())
}

/// The apply function handed to the config session.
pub fn applier(exec: Arc<ExecSettings>) -> openshell_sdk::ApplyFn {
    Arc::new(move |snapshot: ConfigSnapshot| apply(&exec, &snapshot))
}

pub fn apply(exec: &ExecSettings, snapshot: &ConfigSnapshot) -> ApplyOutcome {
    if let Err(reason) = check(snapshot) {
        return ApplyOutcome::Rejected(reason);
    }
    // Outbound access first: a policy whose network cannot be set up is
    // rejected, and the previous configuration stays in force.
    if let Some(egress) = &exec.egress {
        let applied = crate::egress::wanted(snapshot.sandbox_config.policy.as_ref())
            .map_err(anyhow::Error::msg)
            .and_then(|wanted| egress.apply(&wanted));
        if let Err(err) = applied {
            return ApplyOutcome::Rejected(format!("network policy: {err:#}"));
        }
    }
    let path = config_path(&exec.workdir);
    let mut text = serde_json::to_vec_pretty(&render(snapshot)).expect("JSON values serialize");
    text.push(b'\n');
    // The environment first: once the file names a revision, every exec
    // that starts has its environment (code in the sandbox may watch the
    // file, then exec). A failed write puts the previous one back.
    let previous = exec
        .provider_env
        .replace(snapshot.provider_environment.environment.clone());
    if let Err(err) = write_atomically(&path, &text) {
        exec.provider_env.replace(previous);
        return ApplyOutcome::Rejected(format!(
            "writing {CONFIG_DIR}/{CONFIG_FILE} failed: {}",
            crate::os_error::describe(&err)
        ));
    }
    info!(
        config_revision = snapshot.sandbox_config.config_revision,
        provider_env_revision = snapshot.provider_environment.provider_env_revision,
        "configuration applied"
    );
    ApplyOutcome::Applied
}

#[cfg(test)]
mod tests {
    use super::*;
    use openshell_proto::sandbox::{EffectiveSetting, SettingValue};

    fn settings(workdir: &Path) -> ExecSettings {
        ExecSettings::new("sb-1".into(), workdir.to_path_buf())
    }

    fn with_setting(key: &str, value: setting_value::Value) -> ConfigSnapshot {
        let mut snapshot = ConfigSnapshot::default();
        snapshot.sandbox_config.config_revision = 4;
        snapshot.sandbox_config.settings.insert(
            key.into(),
            EffectiveSetting {
                value: Some(SettingValue { value: Some(value) }),
                scope: SettingScope::Sandbox as i32,
            },
        );
        snapshot
            .provider_environment
            .environment
            .insert("API_KEY".into(), "secret-value-123".into());
        snapshot
    }

    #[test]
    fn applied_config_is_written_without_environment_values() {
        let dir = tempfile::tempdir().unwrap();
        let exec = settings(dir.path());
        let snapshot = with_setting(
            "log_level",
            setting_value::Value::StringValue("debug".into()),
        );
        assert_eq!(apply(&exec, &snapshot), ApplyOutcome::Applied);
        let text = std::fs::read_to_string(config_path(dir.path())).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["config_revision"], 4);
        assert_eq!(value["settings"]["log_level"]["value"], "debug");
        assert_eq!(value["provider_environment_keys"][0], "API_KEY");
        assert!(!text.contains("secret-value-123"));
        assert_eq!(
            exec.provider_env.get().get("API_KEY").map(String::as_str),
            Some("secret-value-123")
        );
    }

    #[test]
    fn a_failed_write_keeps_the_previous_environment() {
        let dir = tempfile::tempdir().unwrap();
        let exec = settings(dir.path());
        exec.provider_env
            .replace([("API_KEY".to_owned(), "old".to_owned())].into());
        // A file where the config directory should be: the write fails.
        std::fs::write(dir.path().join(CONFIG_DIR), b"not a directory").unwrap();
        let snapshot = with_setting(
            "log_level",
            setting_value::Value::StringValue("info".into()),
        );
        let ApplyOutcome::Rejected(reason) = apply(&exec, &snapshot) else {
            panic!("an unwritable config file must reject the config");
        };
        assert!(reason.contains("failed"), "{reason}");
        assert!(!reason.contains("secret-value-123"));
        assert_eq!(
            exec.provider_env.get().get("API_KEY").map(String::as_str),
            Some("old")
        );
    }

    #[test]
    fn bad_log_levels_are_rejected_and_nothing_changes() {
        let dir = tempfile::tempdir().unwrap();
        let exec = settings(dir.path());
        let snapshot = with_setting(
            "log_level",
            setting_value::Value::StringValue("loud".into()),
        );
        let ApplyOutcome::Rejected(reason) = apply(&exec, &snapshot) else {
            panic!("a bad log level must be rejected");
        };
        assert!(!reason.contains("loud"));
        assert!(!config_path(dir.path()).exists());
        assert!(exec.provider_env.get().is_empty());
        let snapshot = with_setting("log_level", setting_value::Value::IntValue(3));
        assert!(matches!(apply(&exec, &snapshot), ApplyOutcome::Rejected(_)));
    }
}

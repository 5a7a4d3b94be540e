//! Where the gateway is and how to authenticate, in order of precedence:
//! flags (`--endpoint`, `--token` / `--token-file`, `--ca-file`), then the
//! environment (`OPENSHELL_ENDPOINT`, `OPENSHELL_TOKEN`, `OPENSHELL_CA_FILE`;
//! an empty variable counts as unset, as in the SDKs), then
//! `$XDG_CONFIG_HOME/openshell/config.toml` (`~/.config` when
//! `XDG_CONFIG_HOME` is unset), then the default endpoint of `make up`.
//!
//! The config file holds `endpoint`, `token` and `ca_file`; any other key is
//! an error (a typo must not silently fall back to a default). A file that
//! holds a token and is readable by other users gets a warning.

use std::path::{Path, PathBuf};
use std::time::Duration;

use openshell_sdk::{Client, ClientConfig};
use serde::Deserialize;

use crate::args::GlobalArgs;
use crate::failure::{Failure, io};

/// `make up`'s edge, the SDKs' default too.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:17670";

/// Deadline of unary calls.
const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// The resolved connection settings.
#[derive(Clone, Default)]
pub struct Settings {
    pub endpoint: String,
    pub token: Option<String>,
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    endpoint: Option<String>,
    token: Option<String>,
    ca_file: Option<PathBuf>,
}

/// `$XDG_CONFIG_HOME/openshell` (or `~/.config/openshell`).
pub fn config_dir() -> Result<PathBuf, Failure> {
    if let Some(dir) = env("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(dir).join("openshell"));
    }
    match env("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".config").join("openshell")),
        None => Err(Failure::new(
            "invalid_config",
            "neither XDG_CONFIG_HOME nor HOME is set: cannot find the config directory",
        )),
    }
}

/// A non-empty environment variable.
fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn read_file_settings(path: &Path) -> Result<FileSettings, Failure> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FileSettings::default());
        }
        Err(err) => return Err(io(&format!("reading {}", path.display()), &err)),
    };
    let parsed: FileSettings = toml::from_str(&text).map_err(|err| {
        // toml's message names the key and line, never a value.
        let first = err.message().lines().next().unwrap_or("invalid TOML");
        let line = err
            .span()
            .map(|span| format!(" (line {})", text[..span.start].matches('\n').count() + 1))
            .unwrap_or_default();
        Failure::new(
            "invalid_config",
            format!("{}{line}: {first}", path.display()),
        )
    })?;
    if parsed.token.is_some() {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            eprintln!(
                "warning: {} holds a token and is readable by other users: chmod 600 it",
                path.display()
            );
        }
    }
    Ok(parsed)
}

/// Flags, then environment, then the config file, then the default.
pub fn resolve(global: &GlobalArgs) -> Result<Settings, Failure> {
    let needs_file = global.endpoint.is_none() && env("OPENSHELL_ENDPOINT").is_none()
        || global.token.is_none()
            && global.token_file.is_none()
            && env("OPENSHELL_TOKEN").is_none()
        || global.ca_file.is_none() && env("OPENSHELL_CA_FILE").is_none();
    let file = if needs_file {
        match config_dir() {
            Ok(dir) => read_file_settings(&dir.join("config.toml"))?,
            Err(_) => FileSettings::default(),
        }
    } else {
        FileSettings::default()
    };
    let endpoint = global
        .endpoint
        .clone()
        .or_else(|| env("OPENSHELL_ENDPOINT"))
        .or(file.endpoint)
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
    let token = match (&global.token, &global.token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(read_token_file(path)?),
        (None, None) => env("OPENSHELL_TOKEN").or(file.token),
    };
    // A CA from the environment or the file belongs to an https endpoint;
    // only an explicit flag with an http endpoint is an error.
    let ca_file = global.ca_file.clone().or_else(|| {
        env("OPENSHELL_CA_FILE")
            .map(PathBuf::from)
            .or(file.ca_file)
            .filter(|_| endpoint.starts_with("https://"))
    });
    Ok(Settings {
        endpoint,
        token: token.filter(|t| !t.trim().is_empty()),
        ca_file,
    })
}

fn read_token_file(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| io(&format!("reading the token file {}", path.display()), &err))?;
    let token = text.lines().next().unwrap_or_default().trim().to_owned();
    if token.is_empty() {
        return Err(Failure::new(
            "invalid_config",
            format!("the token file {} is empty", path.display()),
        ));
    }
    Ok(token)
}

impl Settings {
    /// The core's configuration for these settings.
    pub fn client_config(&self) -> Result<ClientConfig, Failure> {
        let mut builder = ClientConfig::builder(self.endpoint.clone())
            .connect_timeout(Duration::from_secs(10))
            .default_deadline(Some(CALL_DEADLINE));
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|err| io(&format!("reading the CA file {}", ca.display()), &err))?;
            builder = builder.ca_pem(pem);
        }
        Ok(builder.build()?)
    }

    /// A client connected now (fails with `connect` or `tls` at once).
    pub async fn connect(&self) -> Result<Client, Failure> {
        Ok(Client::connect(self.client_config()?).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_settings_refuse_unknown_keys_and_report_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "endpoint = \"http://h:1\"\nendpont = \"x\"\n").unwrap();
        let err = read_file_settings(&path).unwrap_err();
        assert_eq!(err.code, "invalid_config");
        assert!(err.message.contains("line 2"), "{}", err.message);
        std::fs::write(&path, "endpoint = \"http://h:1\"\n").unwrap();
        let ok = read_file_settings(&path).unwrap();
        assert_eq!(ok.endpoint.as_deref(), Some("http://h:1"));
        let missing = read_file_settings(&dir.path().join("nope.toml")).unwrap();
        assert!(missing.endpoint.is_none());
    }

    #[test]
    fn debug_hides_the_token() {
        let settings = Settings {
            endpoint: DEFAULT_ENDPOINT.into(),
            token: Some("tok-secret-123".into()),
            ca_file: None,
        };
        assert!(!format!("{settings:?}").contains("tok-secret-123"));
    }
}

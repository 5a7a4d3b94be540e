//! `openshell provider create|attach|detach`: named environment sets
//! (`CreateProvider`, `AttachProvider`, `DetachProvider`). Values are
//! secrets: read from flags or a file, sent, never printed.

use std::collections::HashMap;

use openshell_sdk::proto::{
    AttachProviderRequest, AttachProviderResponse, CreateProviderRequest, DetachProviderRequest,
    Provider, ProviderResponse,
};
use serde_json::json;

use super::unary;
use crate::args::{ProviderAttachArgs, ProviderCommand, ProviderCreateArgs};
use crate::failure::{Failure, io};
use crate::output::print_json;
use crate::settings::Settings;

const CREATE: &str = "/openshell.v1.OpenShell/CreateProvider";
const ATTACH: &str = "/openshell.v1.OpenShell/AttachProvider";
const DETACH: &str = "/openshell.v1.OpenShell/DetachProvider";

pub async fn run(command: ProviderCommand, settings: &Settings) -> Result<u8, Failure> {
    match command {
        ProviderCommand::Create(args) => create(args, settings).await,
        ProviderCommand::Attach(args) => attach(args, settings, true).await,
        ProviderCommand::Detach(args) => attach(args, settings, false).await,
    }
    .map(|()| 0)
}

/// `KEY=VALUE` lines; `#` comments and blank lines skipped. Errors name the
/// line number, never its content.
fn parse_env_file(text: &str) -> Result<Vec<(String, String)>, Failure> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                out.push((key.trim().to_owned(), value.to_owned()));
            }
            _ => {
                return Err(Failure::invalid(format!(
                    "env file line {}: expected KEY=VALUE",
                    i + 1
                )));
            }
        }
    }
    Ok(out)
}

async fn create(args: ProviderCreateArgs, settings: &Settings) -> Result<(), Failure> {
    let mut environment: HashMap<String, String> = HashMap::new();
    if let Some(path) = &args.env_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| io(&format!("reading {}", path.display()), &e))?;
        environment.extend(parse_env_file(&text)?);
    }
    environment.extend(args.env.iter().cloned());
    let client = settings.connect().await?;
    let response: ProviderResponse = unary(
        &client,
        CREATE,
        &CreateProviderRequest {
            provider: Some(Provider {
                name: args.name.clone(),
                environment,
                ..Default::default()
            }),
        },
    )
    .await?;
    let provider = response.provider.unwrap_or_default();
    let mut keys = provider.environment_keys.clone();
    keys.sort();
    if args.json {
        print_json(&json!({
            "name": provider.name,
            "revision": provider.revision,
            "environment_keys": keys,
        }));
    } else {
        println!(
            "provider {} created (revision {}, keys: {})",
            provider.name,
            provider.revision,
            if keys.is_empty() {
                "-".to_owned()
            } else {
                keys.join(",")
            }
        );
    }
    Ok(())
}

async fn attach(
    args: ProviderAttachArgs,
    settings: &Settings,
    attach: bool,
) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let response: AttachProviderResponse = if attach {
        let request = AttachProviderRequest {
            sandbox: args.sandbox.clone(),
            provider: args.provider.clone(),
        };
        unary(&client, ATTACH, &request).await?
    } else {
        let request = DetachProviderRequest {
            sandbox: args.sandbox.clone(),
            provider: args.provider.clone(),
        };
        unary(&client, DETACH, &request).await?
    };
    if args.json {
        print_json(&json!({
            "sandbox": args.sandbox,
            "providers": response.providers,
            "provider_attachment_epoch": response.provider_attachment_epoch,
        }));
    } else {
        println!(
            "provider {} {} sandbox {} (providers: {})",
            args.provider,
            if attach {
                "attached to"
            } else {
                "detached from"
            },
            args.sandbox,
            if response.providers.is_empty() {
                "-".to_owned()
            } else {
                response.providers.join(",")
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files() {
        let env = parse_env_file("# c\n\nA=1\n  B = x=y\n").unwrap();
        assert_eq!(
            env,
            vec![("A".into(), "1".into()), ("B".into(), " x=y".into())]
        );
        let err = parse_env_file("A=1\nsecret-without-equals\n").unwrap_err();
        assert_eq!(err.message, "env file line 2: expected KEY=VALUE");
    }
}

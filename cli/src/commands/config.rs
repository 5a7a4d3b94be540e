//! `openshell config get|set|unset`: a sandbox's effective settings
//! (`GetSandboxConfig`) and writes to the sandbox or global scope
//! (`UpdateConfig`).

use openshell_sdk::proto::sandbox::{self as sbx, setting_value::Value as SettingKind};
use openshell_sdk::proto::{UpdateConfigRequest, UpdateConfigResponse};
use openshell_sdk::{CallOptions, Client};
use serde_json::{Value, json};

use super::unary;
use crate::args::{ConfigCommand, ConfigGetArgs, ConfigSetArgs, ConfigUnsetArgs, SettingType};
use crate::failure::Failure;
use crate::output::{print_json, table};
use crate::settings::Settings;

const GET_SANDBOX_CONFIG: &str = "/openshell.v1.OpenShell/GetSandboxConfig";
const UPDATE_CONFIG: &str = "/openshell.v1.OpenShell/UpdateConfig";

pub async fn run(command: ConfigCommand, settings: &Settings) -> Result<u8, Failure> {
    match command {
        ConfigCommand::Get(args) => get(args, settings).await,
        ConfigCommand::Set(args) => set(args, settings).await,
        ConfigCommand::Unset(args) => unset(args, settings).await,
    }
    .map(|()| 0)
}

fn value_json(value: Option<&sbx::SettingValue>) -> Value {
    match value.and_then(|v| v.value.as_ref()) {
        Some(SettingKind::StringValue(s)) => json!(s),
        Some(SettingKind::BoolValue(b)) => json!(b),
        Some(SettingKind::IntValue(i)) => json!(i),
        Some(SettingKind::BytesValue(b)) => json!({ "bytes_len": b.len() }),
        None => Value::Null,
    }
}

fn value_text(value: Option<&sbx::SettingValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(SettingKind::StringValue(s)) => s.clone(),
        Some(SettingKind::BoolValue(b)) => b.to_string(),
        Some(SettingKind::IntValue(i)) => i.to_string(),
        Some(SettingKind::BytesValue(b)) => format!("<{} bytes>", b.len()),
        None => String::new(),
    }
}

fn scope_name(scope: i32) -> &'static str {
    match sbx::SettingScope::try_from(scope) {
        Ok(sbx::SettingScope::Sandbox) => "sandbox",
        Ok(sbx::SettingScope::Global) => "global",
        _ => "-",
    }
}

async fn get(args: ConfigGetArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let sandbox = client
        .sandboxes()
        .get(&args.sandbox, CallOptions::new())
        .await?;
    let config: sbx::GetSandboxConfigResponse = unary(
        &client,
        GET_SANDBOX_CONFIG,
        &sbx::GetSandboxConfigRequest {
            sandbox_id: sandbox.id.clone(),
        },
    )
    .await?;
    let mut keys: Vec<&String> = config.settings.keys().collect();
    keys.sort();
    if let Some(key) = &args.key {
        let Some(setting) = config.settings.get(key) else {
            return Err(Failure::new(
                "not_found",
                format!("setting {key:?} is not set for sandbox {:?}", args.sandbox),
            ));
        };
        if args.json {
            print_json(&json!({
                "key": key,
                "value": value_json(setting.value.as_ref()),
                "scope": scope_name(setting.scope),
            }));
        } else {
            println!("{}", value_text(setting.value.as_ref()));
        }
        return Ok(());
    }
    if args.json {
        let settings: serde_json::Map<String, Value> = keys
            .iter()
            .map(|k| {
                let s = &config.settings[*k];
                (
                    (*k).clone(),
                    json!({"value": value_json(s.value.as_ref()), "scope": scope_name(s.scope)}),
                )
            })
            .collect();
        print_json(&json!({
            "sandbox": args.sandbox,
            "settings": settings,
            "policy_version": config.version,
            "policy_hash": config.policy_hash,
            "config_revision": config.config_revision,
        }));
    } else {
        let rows: Vec<Vec<String>> = keys
            .iter()
            .map(|k| {
                let s = &config.settings[*k];
                vec![
                    (*k).clone(),
                    value_text(s.value.as_ref()),
                    scope_name(s.scope).to_owned(),
                ]
            })
            .collect();
        print!("{}", table(&["KEY", "VALUE", "SCOPE"], &rows));
    }
    Ok(())
}

/// `[SANDBOX] KEY [VALUE]` words: the sandbox only without --global.
fn scope_words(
    words: &[String],
    global: bool,
    with_value: bool,
) -> Result<(String, Vec<String>), Failure> {
    let rest = usize::from(with_value) + 1;
    match (global, words.len()) {
        (true, n) if n == rest => Ok((String::new(), words.to_vec())),
        (false, n) if n == rest + 1 => Ok((words[0].clone(), words[1..].to_vec())),
        (true, _) => Err(Failure::invalid(if with_value {
            "with --global give KEY VALUE (no sandbox)"
        } else {
            "with --global give KEY (no sandbox)"
        })),
        (false, _) => Err(Failure::invalid(if with_value {
            "give SANDBOX KEY VALUE (or --global KEY VALUE)"
        } else {
            "give SANDBOX KEY (or --global KEY)"
        })),
    }
}

fn typed(kind: SettingType, text: &str) -> Result<sbx::SettingValue, Failure> {
    let value = match kind {
        SettingType::String => SettingKind::StringValue(text.to_owned()),
        SettingType::Bool => match text {
            "true" => SettingKind::BoolValue(true),
            "false" => SettingKind::BoolValue(false),
            _ => return Err(Failure::invalid("a bool setting is true or false")),
        },
        SettingType::Int => SettingKind::IntValue(
            text.parse()
                .map_err(|_| Failure::invalid("an int setting is a 64-bit integer"))?,
        ),
    };
    Ok(sbx::SettingValue { value: Some(value) })
}

async fn write(
    client: &Client,
    request: UpdateConfigRequest,
    json: bool,
    what: String,
) -> Result<(), Failure> {
    let response: UpdateConfigResponse = unary(client, UPDATE_CONFIG, &request).await?;
    if json {
        print_json(&json!({
            "sandbox": request.sandbox,
            "global": request.global,
            "key": request.setting_key,
            "settings_revision": response.settings_revision,
            "deleted": response.deleted,
        }));
    } else {
        println!("{what} (settings revision {})", response.settings_revision);
    }
    Ok(())
}

async fn set(args: ConfigSetArgs, settings: &Settings) -> Result<(), Failure> {
    let (sandbox, rest) = scope_words(&args.words, args.global, true)?;
    let value = typed(args.kind, &rest[1])?;
    let client = settings.connect().await?;
    let scope = if args.global {
        "global".to_owned()
    } else {
        format!("sandbox {sandbox}")
    };
    let request = UpdateConfigRequest {
        sandbox,
        setting_key: rest[0].clone(),
        setting_value: Some(value),
        global: args.global,
        ..Default::default()
    };
    let what = format!("{} set for {scope}", rest[0]);
    write(&client, request, args.json, what).await
}

async fn unset(args: ConfigUnsetArgs, settings: &Settings) -> Result<(), Failure> {
    let (sandbox, rest) = scope_words(&args.words, args.global, false)?;
    let client = settings.connect().await?;
    let scope = if args.global {
        "global".to_owned()
    } else {
        format!("sandbox {sandbox}")
    };
    let request = UpdateConfigRequest {
        sandbox,
        setting_key: rest[0].clone(),
        delete_setting: true,
        global: args.global,
        ..Default::default()
    };
    let what = format!("{} unset for {scope}", rest[0]);
    write(&client, request, args.json, what).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_types() {
        let w = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            scope_words(&w(&["box", "k", "v"]), false, true).unwrap().0,
            "box"
        );
        assert_eq!(scope_words(&w(&["k", "v"]), true, true).unwrap().0, "");
        assert!(scope_words(&w(&["k", "v"]), false, true).is_err());
        assert!(scope_words(&w(&["box", "k", "v"]), true, true).is_err());
        assert_eq!(
            scope_words(&w(&["box", "k"]), false, false).unwrap().1,
            w(&["k"])
        );
        assert!(typed(SettingType::Bool, "yes").is_err());
        assert!(typed(SettingType::Int, "1.5").is_err());
        assert_eq!(
            typed(SettingType::Int, "-7").unwrap().value,
            Some(SettingKind::IntValue(-7))
        );
    }
}

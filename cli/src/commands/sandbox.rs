//! `openshell sandbox create|get|list|delete|watch`.

use std::time::Duration;

use futures::StreamExt;
use openshell_sdk::{
    CallOptions, CreateSandbox, DeletionOutcome, ListSandboxes, Sandbox, WatchEvent, WatchOptions,
};
use serde_json::json;

use super::until_signal;
use crate::args::{CreateArgs, DeleteArgs, GetArgs, ListArgs, SandboxCommand, WatchArgs};
use crate::failure::Failure;
use crate::output::{Spinner, phase_name, print_json, sandbox_json, sandbox_table};
use crate::settings::Settings;

pub async fn run(command: SandboxCommand, settings: &Settings) -> Result<u8, Failure> {
    let result = match command {
        SandboxCommand::Create(args) => until_signal(create(args, settings)).await,
        SandboxCommand::Get(args) => until_signal(get(args, settings)).await,
        SandboxCommand::List(args) => until_signal(list(args, settings)).await,
        SandboxCommand::Delete(args) => until_signal(delete(args, settings)).await,
        SandboxCommand::Watch(args) => until_signal(watch(args, settings)).await,
        SandboxCommand::Upload(args) => until_signal(super::files::upload(args, settings)).await,
        SandboxCommand::Download(args) => {
            until_signal(super::files::download(args, settings)).await
        }
    };
    match result {
        Ok(result) => result.map(|()| 0),
        Err(signal_exit) => Ok(signal_exit),
    }
}

fn show(sandboxes: &[Sandbox], json: bool) {
    if json {
        print_json(&serde_json::Value::Array(
            sandboxes.iter().map(sandbox_json).collect(),
        ));
    } else {
        print!("{}", sandbox_table(sandboxes));
    }
}

fn show_one(sandbox: &Sandbox, json: bool) {
    if json {
        print_json(&sandbox_json(sandbox));
    } else {
        print!("{}", sandbox_table(std::slice::from_ref(sandbox)));
    }
}

async fn create(args: CreateArgs, settings: &Settings) -> Result<(), Failure> {
    if args.timeout == 0 {
        return Err(Failure::invalid("--timeout must be at least 1 second"));
    }
    let client = settings.connect().await?;
    let mut request = CreateSandbox::new();
    if let Some(name) = &args.name {
        request = request.name(name);
    }
    if let Some(image) = &args.image {
        request = request.image(image);
    }
    for (k, v) in &args.env {
        request = request.env(k, v);
    }
    for (k, v) in &args.labels {
        request = request.label(k, v);
    }
    let pids = args.pids.map(|n| n.to_string());
    for (resource, quantity) in [
        ("memory", &args.memory),
        ("cpu", &args.cpu),
        ("pids", &pids),
    ] {
        if let Some(quantity) = quantity {
            request = request.limit(resource, quantity);
        }
    }
    if !args.command.is_empty() {
        request = request.command(args.command.clone());
    }
    let sandboxes = client.sandboxes();
    let created = sandboxes.create(request, CallOptions::new()).await?;
    let sandbox = if args.no_wait {
        created
    } else {
        let _spinner = Spinner::start(format!("waiting for sandbox {} to be ready", created.name));
        sandboxes
            .wait_ready(
                &created.name,
                CallOptions::new().deadline(Duration::from_secs(args.timeout)),
            )
            .await?
    };
    show_one(&sandbox, args.json);
    Ok(())
}

async fn get(args: GetArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let (sandbox, owner) = client
        .sandboxes()
        .get_with_owner(&args.name, CallOptions::new())
        .await?;
    if args.json {
        let mut value = sandbox_json(&sandbox);
        value["owner"] = json!(owner);
        print_json(&value);
    } else {
        show_one(&sandbox, false);
        if let Some(owner) = owner {
            println!("owner replica: {owner}");
        }
    }
    Ok(())
}

async fn list(args: ListArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let filter = ListSandboxes {
        label_selector: args.selector.clone(),
        ..ListSandboxes::default()
    };
    let mut sandboxes = client.sandboxes().list(filter, CallOptions::new()).await?;
    sandboxes.sort_by(|a, b| a.name.cmp(&b.name));
    show(&sandboxes, args.json);
    Ok(())
}

fn outcome_name(outcome: DeletionOutcome) -> &'static str {
    outcome
        .as_str_name()
        .strip_prefix("DELETION_OUTCOME_")
        .unwrap_or("UNSPECIFIED")
}

async fn delete(args: DeleteArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let sandboxes = client.sandboxes();
    let mut results = Vec::new();
    for name in &args.names {
        let outcome = sandboxes.delete(name, CallOptions::new()).await?;
        if args.wait {
            let _spinner = Spinner::start(format!("waiting for sandbox {name} to be deleted"));
            sandboxes
                .wait_deleted(name, CallOptions::new().deadline(Duration::from_secs(120)))
                .await?;
        }
        results.push((name.clone(), outcome_name(outcome)));
        if !args.json {
            println!(
                "sandbox {name} deleted ({})",
                outcome_name(outcome).to_lowercase()
            );
        }
    }
    if args.json {
        print_json(&serde_json::Value::Array(
            results
                .iter()
                .map(|(name, outcome)| json!({"name": name, "outcome": outcome}))
                .collect(),
        ));
    }
    Ok(())
}

async fn watch(args: WatchArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    // Resumes after the last change it printed when a replica goes away.
    let mut events = client
        .sandboxes()
        .events(&args.name, WatchOptions::new(), CallOptions::new());
    let mut first = true;
    while let Some(event) = events.next().await {
        match event {
            Ok(WatchEvent::Sandbox { sandbox, cursor }) => {
                if args.json {
                    let mut object = sandbox_json(&sandbox);
                    object["cursor"] = json!(cursor);
                    println!("{object}");
                } else {
                    if first {
                        println!("NAME\tPHASE\tRESOURCE_VERSION");
                    }
                    println!(
                        "{}\t{}\t{}",
                        sandbox.name,
                        phase_name(sandbox.phase),
                        sandbox.resource_version
                    );
                }
                first = false;
            }
            Ok(WatchEvent::Log { .. }) => {}
            // The sandbox is gone: the watch is over, not failed.
            Err(err) if err.code() == "not_found" && !first => {
                if args.json {
                    println!("{}", json!({"name": args.name, "phase": "DELETED"}));
                } else {
                    println!("{}\tDELETED\t-", args.name);
                }
                return Ok(());
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

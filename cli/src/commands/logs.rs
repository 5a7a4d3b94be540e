//! `openshell logs NAME`: the lines the gateway recorded about a sandbox
//! (its own and the sandbox's supervisor's), and with `-f` every new one as
//! it is recorded, resuming by itself when a replica goes away.

use std::time::SystemTime;

use futures::StreamExt;
use openshell_sdk::{CallOptions, LogLine, LogQuery, WatchEvent, WatchOptions};
use serde_json::json;

use super::until_signal;
use crate::args::LogsArgs;
use crate::failure::Failure;
use crate::settings::Settings;

pub async fn run(args: LogsArgs, settings: &Settings) -> Result<u8, Failure> {
    match until_signal(logs(args, settings)).await {
        Ok(result) => result.map(|()| 0),
        Err(signal_exit) => Ok(signal_exit),
    }
}

fn query(args: &LogsArgs) -> LogQuery {
    let mut query = LogQuery::new();
    if let Some(tail) = args.tail {
        query = query.tail(tail);
    }
    if let Some(since) = args.since {
        query = query.since(SystemTime::now() - since);
    }
    for source in &args.source {
        query = query.source(source.clone());
    }
    if let Some(level) = &args.level {
        query = query.min_level(level.clone());
    }
    query
}

fn print(line: &LogLine, as_json: bool) {
    if as_json {
        let time = line.time.map(openshell_sdk::logs::rfc3339_millis);
        println!(
            "{}",
            json!({
                "time": time,
                "level": line.level,
                "source": line.source,
                "target": line.target,
                "message": line.message,
                "fields": line.fields,
            })
        );
    } else {
        println!("{line}");
    }
}

async fn logs(args: LogsArgs, settings: &Settings) -> Result<(), Failure> {
    let client = settings.connect().await?;
    let sandboxes = client.sandboxes();
    if !args.follow {
        let logs = sandboxes
            .logs(&args.name, &query(&args), CallOptions::new())
            .await?;
        for line in &logs.lines {
            print(line, args.json);
        }
        return Ok(());
    }
    let mut events = sandboxes.events(
        &args.name,
        WatchOptions::new().status(false).logs(query(&args)),
        CallOptions::new(),
    );
    while let Some(event) = events.next().await {
        match event {
            Ok(WatchEvent::Log { line, .. }) => print(&line, args.json),
            Ok(WatchEvent::Sandbox { .. }) => {}
            // The sandbox is gone: following is over, not failed.
            Err(err) if err.code() == "not_found" && events.cursor().is_some() => return Ok(()),
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

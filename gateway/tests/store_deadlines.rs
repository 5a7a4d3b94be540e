//! Store calls on the request path are bounded: a frozen PostgreSQL server
//! (SIGSTOP to the postmaster and its backends) makes create, get,
//! sandbox-token auth and a call caught inside a statement fail within the
//! store deadline with UNAVAILABLE naming the store and nothing secret, and
//! the next calls after SIGCONT succeed without a restart. Unknown sandbox tokens are answered from a short
//! negative cache, forgotten when a token is written. The pool size flag
//! sizes the config build permits.

mod common;

use std::future::Future;
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::*;
use openshell_testkit::cluster::Postgres;
use openshell_testkit::{
    Gateway, GatewayOptions, eventually, metric_value, sandbox_token, wait_until,
};
use tonic::Code;

/// The deadline the gateways here run with (`--database-timeout-ms`).
const DEADLINE: Duration = Duration::from_millis(1500);
/// What a failed call may take beyond the deadline (scheduling on a busy
/// machine, the gRPC round trip).
const SLACK: Duration = Duration::from_millis(2500);

fn gateway(database_url: Option<String>, extra: &[&str]) -> Gateway {
    let mut extra_args: Vec<String> = [
        "--allow-test-flags",
        "--driver",
        "none",
        "--database-timeout-ms",
        &DEADLINE.as_millis().to_string(),
    ]
    .map(String::from)
    .to_vec();
    extra_args.extend(extra.iter().map(|a| a.to_string()));
    Gateway::start(GatewayOptions {
        database_url,
        extra_args,
        ..GatewayOptions::with_token(TOKEN)
    })
}

/// Runs a call, bounded on the test's side so that a gateway that hangs
/// fails the test instead of stalling it.
async fn timed<T>(
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> (Result<T, tonic::Status>, Duration) {
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(15), call)
        .await
        .unwrap_or_else(|_| Err(tonic::Status::internal("TEST: no answer within 15 s")));
    (result, started.elapsed())
}

async fn create(client: &mut Client, name: &str) -> Result<Sandbox, tonic::Status> {
    client
        .create_sandbox(CreateSandboxRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().sandbox.expect("sandbox"))
}

async fn get(client: &mut Client, name: &str) -> Result<Sandbox, tonic::Status> {
    client
        .get_sandbox(GetSandboxRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().sandbox.expect("sandbox"))
}

/// A call authenticated by a sandbox token (looked up in the store).
async fn config_as(client: &mut Client, sandbox_id: &str) -> Result<(), tonic::Status> {
    client
        .get_sandbox_config(sandbox::GetSandboxConfigRequest {
            sandbox_id: sandbox_id.into(),
        })
        .await
        .map(|_| ())
}

/// A call's outcome and how long it took.
type Timed = (Result<(), tonic::Status>, Duration);

fn lookups(gw: &Gateway, source: &str) -> f64 {
    metric_value(
        &gw.metrics(),
        &format!(r#"openshell_server_sandbox_token_lookups_total{{source="{source}"}}"#),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_frozen_postgres_fails_calls_within_the_deadline_and_they_succeed_after() {
    let pg = Postgres::start();
    let url = pg.url();
    let password = url
        .split_once("postgres:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(password, _)| password.to_owned())
        .expect("password in the URL");
    let gw = gateway(Some(url.clone()), &[]);
    let mut client = client(&gw).await;
    let before = create(&mut client, "before").await.expect("create before");
    let id = before.metadata.unwrap().id;
    let token = sandbox_token(&gw.store_dir(), &id).expect("sandbox token");
    let mut as_sandbox = client_with(&gw, Some(&token)).await;
    config_as(&mut as_sandbox, &id)
        .await
        .expect("sandbox token works before the freeze");

    // A call waiting inside a statement when the server freezes must end
    // too: the frozen server's own statement_timeout cannot fire. Here an
    // UpdateConfig waits for the sandbox's row lock, which a psql session
    // holds for a few seconds.
    let mut holder = pg
        .psql()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    holder
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"BEGIN;\nSELECT 1 FROM sandboxes WHERE name = 'before' FOR UPDATE;\n\
              SELECT pg_sleep(4);\nCOMMIT;\n",
        )
        .unwrap();
    let activity = |condition: &str| {
        let out = pg
            .psql()
            .arg("-c")
            .arg(format!(
                "SELECT count(*) FROM pg_stat_activity WHERE {condition}"
            ))
            .output()
            .expect("psql");
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    };
    assert!(
        wait_until(Duration::from_secs(10), || activity(
            "query LIKE 'SELECT pg_sleep%' AND state = 'active'"
        )),
        "psql never took the lock"
    );
    let mut updater = client.clone();
    let call_started = Instant::now();
    let blocked = tokio::spawn(async move {
        timed(async {
            updater
                .update_config(UpdateConfigRequest {
                    sandbox: "before".into(),
                    setting_key: "frozen".into(),
                    setting_value: Some(sandbox::SettingValue {
                        value: Some(sandbox::setting_value::Value::StringValue("x".into())),
                    }),
                    ..Default::default()
                })
                .await
                .map(|_| ())
        })
        .await
    });
    assert!(
        eventually(Duration::from_secs(10), || activity(
            "wait_event_type = 'Lock'"
        ))
        .await,
        "UpdateConfig never waited for the row lock"
    );
    pg.pause();
    assert!(
        call_started.elapsed() < DEADLINE,
        "too slow to freeze the server while the statement waits ({:?})",
        call_started.elapsed()
    );
    let mut figures = Vec::new();
    let (result, took) = blocked.await.unwrap();
    let err = result.expect_err("UpdateConfig succeeded against a frozen store");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        took <= DEADLINE + SLACK,
        "a statement in flight at the freeze took {took:?}: {err:?}"
    );
    figures.push(format!(
        "update_config (mid-statement) {} ms",
        took.as_millis()
    ));
    // Several rounds: connections cut off mid-call pile up in the pool
    // while the server is frozen; every later call must still be bounded.
    for round in 0..3 {
        let attempts: [(&str, Timed); 3] = [
            (
                "create",
                timed(async {
                    create(&mut client, &format!("during-{round}"))
                        .await
                        .map(|_| ())
                })
                .await,
            ),
            (
                "get",
                timed(async { get(&mut client, "before").await.map(|_| ()) }).await,
            ),
            ("auth", timed(config_as(&mut as_sandbox, &id)).await),
        ];
        for (call, (result, took)) in attempts {
            let err = result.expect_err(&format!("{call} succeeded against a frozen store"));
            assert!(
                matches!(err.code(), Code::Unavailable | Code::DeadlineExceeded),
                "{call}: {err:?}"
            );
            let message = err.message();
            assert!(message.contains("store"), "{call}: {message}");
            for secret in [password.as_str(), url.as_str(), &token, TOKEN] {
                assert!(
                    !message.contains(secret),
                    "{call} leaks a secret: {message}"
                );
            }
            assert!(
                took <= DEADLINE + SLACK,
                "{call} took {took:?} (deadline {DEADLINE:?}): {message}"
            );
            figures.push(format!("{call} {:?} {} ms", err.code(), took.as_millis()));
        }
    }
    pg.resume();
    // The lock holder finishes its sleep and commits.
    let done = wait_until(Duration::from_secs(20), || {
        matches!(holder.try_wait(), Ok(Some(_)))
    });
    if !done {
        let _ = holder.kill();
    }
    let status = holder.wait().unwrap();
    assert!(done && status.success(), "psql lock holder: {status}");
    eprintln!(
        "frozen store, deadline {DEADLINE:?}: {}",
        figures.join(", ")
    );

    // The very next calls succeed, on the same gateway process.
    let pid = gw.pid();
    let (created, took) = timed(create(&mut client, "after")).await;
    created.unwrap_or_else(|err| panic!("create after SIGCONT: {err:?}\n{}", gw.log()));
    eprintln!("first create after SIGCONT: {} ms", took.as_millis());
    get(&mut client, "before").await.expect("get after SIGCONT");
    config_as(&mut as_sandbox, &id)
        .await
        .expect("sandbox token after SIGCONT");
    // The creates cut off during the freeze were rolled back: their names
    // are free again.
    for round in 0..3 {
        let name = format!("during-{round}");
        match get(&mut client, &name).await {
            Err(err) if err.code() == Code::NotFound => {}
            other => panic!("{name} after the freeze: {other:?}"),
        }
        create(&mut client, &name)
            .await
            .expect("create after SIGCONT");
    }
    // Many calls in a row: no connection was left broken in the pool.
    for _ in 0..40 {
        get(&mut client, "after").await.expect("get after SIGCONT");
        config_as(&mut as_sandbox, &id)
            .await
            .expect("auth after SIGCONT");
    }
    assert_eq!(gw.pid(), pid, "the gateway was restarted");
    let log = gw.log();
    assert!(log.contains("did not answer within 1.5 s"), "{log}");
    assert!(
        !log.contains(&password),
        "the gateway log holds the password"
    );
}

#[tokio::test]
async fn repeated_unknown_tokens_cost_one_store_query_and_a_token_write_clears_them() {
    let gw = gateway(None, &[]);
    let mut client = client(&gw).await;
    let unknown = format!("ossb_{}", "0f".repeat(32));
    let mut stranger = client_with(&gw, Some(&unknown)).await;
    let store_before = lookups(&gw, "store");
    let started = Instant::now();
    let calls = 200;
    for _ in 0..calls {
        let err = config_as(&mut stranger, "no-such-sandbox")
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    }
    let elapsed = started.elapsed();
    let queries = lookups(&gw, "store") - store_before;
    // One query per 2 s window at most (the cache's lifetime).
    let bound = (elapsed.as_secs_f64() / 2.0).ceil() + 1.0;
    assert!(
        queries >= 1.0 && queries <= bound,
        "{queries} store queries for {calls} calls in {elapsed:?}"
    );
    assert!(lookups(&gw, "unknown_cache") >= calls as f64 - bound);
    eprintln!(
        "{calls} calls with an unknown token in {} ms: {queries} store queries",
        elapsed.as_millis()
    );

    // Remembered now...
    let cached = lookups(&gw, "unknown_cache");
    let store = lookups(&gw, "store");
    let asked = Instant::now();
    config_as(&mut stranger, "no-such-sandbox")
        .await
        .unwrap_err();
    assert_eq!(lookups(&gw, "unknown_cache"), cached + 1.0);
    assert_eq!(lookups(&gw, "store"), store);
    // ...and forgotten once a sandbox (a token) is created: the next
    // request with it asks the store again.
    let sandbox = create(&mut client, "fresh").await.expect("create");
    config_as(&mut stranger, "no-such-sandbox")
        .await
        .unwrap_err();
    assert!(
        asked.elapsed() < Duration::from_millis(1500),
        "too slow to tell a cleared cache from an expired one ({:?})",
        asked.elapsed()
    );
    assert_eq!(
        lookups(&gw, "store"),
        store + 1.0,
        "the cache was not cleared"
    );

    // The fresh sandbox's token works at once, and so does its session.
    let id = sandbox.metadata.unwrap().id;
    let token = sandbox_token(&gw.store_dir(), &id).expect("token");
    let mut supervisor = client_with(&gw, Some(&token)).await;
    config_as(&mut supervisor, &id)
        .await
        .expect("the new sandbox's token is accepted at once");
    let hello = SupervisorMessage {
        payload: Some(supervisor_message::Payload::Hello(SupervisorHello {
            sandbox_id: id.clone(),
            instance_id: "store-deadlines-test".into(),
            connection_epoch: 1,
            ..Default::default()
        })),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello).await.unwrap();
    let mut session = supervisor
        .connect_supervisor(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("session")
        .into_inner();
    let first = session.message().await.unwrap().unwrap();
    assert!(
        matches!(
            first.payload,
            Some(gateway_message::Payload::SessionAccepted(_))
        ),
        "{first:?}"
    );
}

#[tokio::test]
async fn build_permits_follow_the_pool_size() {
    for (connections, permits) in [(1, 4), (6, 12)] {
        let gw = gateway(
            None,
            &["--database-max-connections", &connections.to_string()],
        );
        let mut client = client(&gw).await;
        create(&mut client, "works").await.expect("create");
        let log = gw.log();
        assert!(
            log.contains(&format!("database_max_connections={connections}"))
                && log.contains(&format!("build_permits={permits}")),
            "{log}"
        );
    }
}

#[test]
fn a_pool_of_no_connections_is_refused() {
    let out = std::process::Command::new(openshell_testkit::bin("openshell-gateway"))
        .args(["serve", "--dev", "--database-max-connections", "0"])
        .output()
        .expect("run openshell-gateway");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--database-max-connections"), "{stderr}");
}

//! No secret (a token, an environment value given to create or exec) shows
//! in any error's Display or Debug, in Debug of the request and response
//! types, or in the client's tracing output (captured at TRACE level, every
//! target, by a subscriber installed for this test binary only).

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures::future::BoxFuture;
use openshell_sdk::{
    AccessToken, CallOptions, Client, ClientConfig, CreateSandbox, Error, ExecRequest,
    ListSandboxes, Metadata, TokenProvider,
};
use openshell_testkit::{Gateway, GatewayOptions};

const GOOD_TOKEN: &str = "tok-SECRET-a91f3c77";
const WRONG_TOKEN: &str = "tok-SECRET-wrong-5d20";
const STALE_TOKEN: &str = "tok-SECRET-stale-33e8";
const SANDBOX_ENV: &str = "env-SECRET-sandbox-1f2e";
const EXEC_ENV: &str = "env-SECRET-exec-9c8b";
const SECRETS: [&str; 5] = [GOOD_TOKEN, WRONG_TOKEN, STALE_TOKEN, SANDBOX_ENV, EXEC_ENV];

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows a secret: {text}");
    }
    // Not even a recognisable piece of one.
    assert!(
        !text.contains("SECRET"),
        "{what} shows part of a secret: {text}"
    );
}

fn check_error(what: &str, err: &Error) {
    assert_no_secret(what, &format!("{err}"));
    assert_no_secret(what, &format!("{err:?}"));
    assert_no_secret(what, &err.message());
    if let Some(metadata) = err.metadata() {
        assert_no_secret(what, &format!("{metadata:?}"));
    }
}

struct StaleFirst;

impl TokenProvider for StaleFirst {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async move {
            Ok(AccessToken::new(if force_refresh {
                GOOD_TOKEN
            } else {
                STALE_TOKEN
            }))
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_errors_debug_or_tracing_output() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let gw = Gateway::start(GatewayOptions::with_token(GOOD_TOKEN));
    let config = ClientConfig::builder(gw.url.clone())
        .token(GOOD_TOKEN)
        .build()
        .unwrap();
    assert_no_secret("ClientConfig Debug", &format!("{config:?}"));
    let client = within(10, "connect", Client::connect(config))
        .await
        .unwrap();
    assert_no_secret("Client Debug", &format!("{client:?}"));
    let sandboxes = client.sandboxes();

    // Create with a secret environment value; get and watch return the spec.
    let create = CreateSandbox::new()
        .name("vault")
        .env("API_KEY", SANDBOX_ENV);
    assert_no_secret("CreateSandbox Debug", &format!("{create:?}"));
    let created = within(10, "create", sandboxes.create(create, CallOptions::new()))
        .await
        .expect("create");
    assert_no_secret("Sandbox Debug", &format!("{created:?}"));
    let ready = within(
        40,
        "wait_ready",
        sandboxes.wait_ready("vault", CallOptions::new()),
    )
    .await
    .expect("ready");
    assert_no_secret("Sandbox Debug", &format!("{ready:?}"));
    let listed = within(
        10,
        "list",
        sandboxes.list(ListSandboxes::default(), CallOptions::new()),
    )
    .await
    .unwrap();
    assert_no_secret("list Debug", &format!("{listed:?}"));

    // Validation failures with a secret value next to a bad key.
    let err = within(
        10,
        "create",
        sandboxes.create(
            CreateSandbox::new()
                .name("bad-env")
                .env("1-not-an-identifier", SANDBOX_ENV),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "invalid_argument", "{err}");
    check_error("create invalid env", &err);

    let request = ExecRequest::new("vault", ["sh", "-c", "test \"$API_KEY\" = \"$PASS\""])
        .env("PASS", EXEC_ENV);
    assert_no_secret("ExecRequest Debug", &format!("{request:?}"));
    let out = within(30, "exec", client.exec(request, CallOptions::new()))
        .await
        .unwrap();
    assert_eq!(out.exit_code, 1, "the two values differ");
    assert_no_secret("ExecOutput Debug", &format!("{out:?}"));

    // Exec errors of every kind, each with a secret in the request.
    let exec_errors = [
        (
            "invalid_argument",
            ExecRequest::new("vault", ["true"]).env("bad key", EXEC_ENV),
            CallOptions::new(),
        ),
        (
            "not_found",
            ExecRequest::new("missing", ["true"]).env("PASS", EXEC_ENV),
            CallOptions::new(),
        ),
        (
            "deadline_exceeded",
            ExecRequest::new("vault", ["sleep", "5"]).env("PASS", EXEC_ENV),
            CallOptions::new().deadline(Duration::from_millis(300)),
        ),
        (
            "output_limit",
            ExecRequest::new("vault", ["sh", "-c", "while :; do echo \"$PASS\"; done"])
                .env("PASS", EXEC_ENV)
                .output_limit(4096),
            CallOptions::new(),
        ),
    ];
    for (code, request, options) in exec_errors {
        let err = within(30, code, client.exec(request, options))
            .await
            .unwrap_err();
        assert_eq!(err.code(), code, "{err}");
        check_error(code, &err);
    }

    // A wrong static token, and a provider whose first token is stale.
    let wrong = within(
        10,
        "connect",
        Client::connect(
            ClientConfig::builder(gw.url.clone())
                .token(WRONG_TOKEN)
                .build()
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    let err = within(
        10,
        "get",
        wrong.sandboxes().get("vault", CallOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "unauthenticated");
    check_error("wrong token", &err);
    let err = within(
        10,
        "exec",
        wrong.exec(
            ExecRequest::new("vault", ["true"]).env("PASS", EXEC_ENV),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    check_error("wrong token exec", &err);
    let provided = within(
        10,
        "connect",
        Client::connect(
            ClientConfig::builder(gw.url.clone())
                .token_provider(Arc::new(StaleFirst))
                .build()
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert_no_secret("Client Debug", &format!("{provided:?}"));
    within(
        10,
        "get",
        provided.sandboxes().get("vault", CallOptions::new()),
    )
    .await
    .expect("refreshed");

    // Raw calls with a caller authorization pair.
    let metadata = Metadata::new().with("authorization", format!("Bearer {WRONG_TOKEN}"));
    assert_no_secret("Metadata Debug", &format!("{metadata:?}"));
    let err = within(
        10,
        "raw",
        client.raw_unary(
            "/openshell.v1.OpenShell/ListSandboxes",
            bytes::Bytes::new(),
            metadata,
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    check_error("raw wrong authorization", &err);
    let err = within(
        10,
        "raw",
        client.raw_unary(
            "/openshell.v1.OpenShell/ListSandboxes",
            bytes::Bytes::new(),
            Metadata::new().with("authorization", format!("Bearer bad\n{WRONG_TOKEN}")),
            CallOptions::new(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "invalid_config");
    check_error("raw invalid authorization", &err);
    // A token that cannot be a header fails as config, without echoing it.
    let err = ClientConfig::builder(gw.url.clone())
        .token(format!("{GOOD_TOKEN}\n"))
        .build()
        .unwrap_err();
    check_error("config with a bad token", &err);

    // The client did log (the capture works), and none of it is a secret.
    let log = captured.text();
    assert!(
        log.contains("unary call failed"),
        "nothing captured:\n{log}"
    );
    assert!(log.contains("TRACE") || log.contains("DEBUG"), "{log}");
    assert_no_secret("tracing output", &log);
}

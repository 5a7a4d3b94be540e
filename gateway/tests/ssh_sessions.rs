//! `CreateSshSession` tokens against a real gateway and supervisors: scoped
//! to their sandbox, refused after revoke and after the TTL, limited per
//! token, and never in a log line. Run against SQLite and PostgreSQL.

mod common;

use std::time::{Duration, SystemTime};

use common::forward::*;
use common::*;
use openshell_proto::*;
use openshell_testkit::cluster::Postgres;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::Code;

/// TTL of the gateway under test: long enough to run every check before it.
const TTL_SECS: u64 = 8;

fn gateway(database_url: Option<String>) -> Gateway {
    Gateway::start(GatewayOptions {
        database_url,
        extra_args: vec![
            "--ssh-session-ttl-secs".into(),
            TTL_SECS.to_string(),
            "--ssh-session-purge-secs".into(),
            "1".into(),
        ],
        ..GatewayOptions::with_token(TOKEN)
    })
}

async fn create_session(client: &mut Client, sandbox: &str) -> CreateSshSessionResponse {
    client
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: sandbox.into(),
            ..Default::default()
        })
        .await
        .expect("create ssh session")
        .into_inner()
}

async fn tokens_are_scoped_revocable_limited_and_expire(database_url: Option<String>) {
    let gw = gateway(database_url);
    let mut user = client(&gw).await;
    let mut anonymous = client_with(&gw, None).await;
    let alpha = create_ready(&mut user, "alpha").await;
    create_ready(&mut user, "beta").await;
    let port = echo_service(&mut user, &["alpha", "beta"]).await;

    let before = SystemTime::now();
    let session = create_session(&mut user, "alpha").await;
    assert_eq!(session.sandbox_id, alpha.metadata.as_ref().unwrap().id);
    assert!(uuid_like(&session.token), "a UUIDv4 token");
    assert_eq!(session.gateway_scheme, "http");
    assert_eq!(session.gateway_host, "127.0.0.1");
    assert_eq!(session.gateway_port, u32::from(gw.grpc_addr.port()));
    // A replica not told to trust the edge's header ignores a client's copy.
    let mut spoofed = tonic::Request::new(CreateSshSessionRequest {
        sandbox: "alpha".into(),
        ..Default::default()
    });
    spoofed.metadata_mut().insert(
        "x-openshell-forwarded-authority",
        "evil.example:1".parse().unwrap(),
    );
    let spoofed = user.create_ssh_session(spoofed).await.unwrap().into_inner();
    assert_eq!(
        (spoofed.gateway_host.as_str(), spoofed.gateway_port),
        ("127.0.0.1", u32::from(gw.grpc_addr.port()))
    );
    let expires = session.expiration_time.expect("an expiry with a TTL");
    let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(expires.seconds as u64);
    let ttl = expires.duration_since(before).unwrap_or_default();
    assert!(
        ttl <= Duration::from_secs(TTL_SECS + 2) && ttl >= Duration::from_secs(TTL_SECS - 2),
        "expiry {ttl:?} from now"
    );
    // The supervisor's host key, as the sandbox reports it too.
    assert!(
        session.host_key_fingerprint.starts_with("SHA256:"),
        "{}",
        session.host_key_fingerprint
    );
    let got = user
        .get_sandbox(GetSandboxRequest {
            name: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(got.host_key_fingerprint, session.host_key_fingerprint);
    let token = session.token.clone();

    // With the token alone: this sandbox, nothing else.
    let held = echo(&mut anonymous, init("alpha", port, &token))
        .await
        .expect("token-only forward to its sandbox");
    assert_eq!(
        code(echo(&mut anonymous, init("beta", port, &token)).await),
        Code::Unauthenticated,
        "another sandbox"
    );
    assert_eq!(
        code(echo(&mut anonymous, init("no-such-sandbox", port, &token)).await),
        Code::Unauthenticated,
        "a token-only caller learns nothing of other names"
    );
    assert_eq!(
        code(echo(&mut anonymous, init("alpha", port, "")).await),
        Code::Unauthenticated,
        "no token and no user"
    );
    assert_eq!(
        code(echo(&mut anonymous, init("alpha", port, "not-a-token")).await),
        Code::Unauthenticated
    );
    let get = anonymous
        .get_sandbox(GetSandboxRequest {
            name: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(get.code(), Code::Unauthenticated);
    let exec = anonymous
        .exec_sandbox(exec_request("alpha", &["true"]))
        .await
        .unwrap_err();
    assert_eq!(exec.code(), Code::Unauthenticated);
    let create = anonymous
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: "alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(create.code(), Code::Unauthenticated);
    let revoke = anonymous
        .revoke_ssh_session(RevokeSshSessionRequest {
            token: token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(revoke.code(), Code::Unauthenticated);
    // A user keeps forwarding without a token, and with a wrong one is refused.
    let plain = echo(&mut user, init("beta", port, ""))
        .await
        .expect("tokenless user forward");
    drop(plain);
    assert_eq!(
        code(echo(&mut user, init("beta", port, &token)).await),
        Code::Unauthenticated,
        "a user with another sandbox's token"
    );

    // Three concurrent forwards per token; the fourth is refused.
    let second = echo(&mut anonymous, init("alpha", port, &token))
        .await
        .unwrap();
    let third = echo(&mut anonymous, init("alpha", port, &token))
        .await
        .unwrap();
    let fourth = echo(&mut anonymous, init("alpha", port, &token)).await;
    let Err(status) = fourth else {
        panic!("a fourth forward of one token was admitted")
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(!status.message().contains(&token));
    drop((second, third));

    // Revoked: refused; revoking again is harmless.
    let other = create_session(&mut user, "alpha").await;
    let revoked = user
        .revoke_ssh_session(RevokeSshSessionRequest {
            token: other.token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(revoked.revoked);
    assert_eq!(
        code(echo(&mut anonymous, init("alpha", port, &other.token)).await),
        Code::Unauthenticated,
        "a revoked token"
    );
    let again = user
        .revoke_ssh_session(RevokeSshSessionRequest {
            token: other.token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!again.revoked);
    let empty = user
        .revoke_ssh_session(RevokeSshSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    let missing = user
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: "no-such-sandbox".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    let bad = user
        .create_ssh_session(CreateSshSessionRequest::default())
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);

    // Past the TTL: refused.
    drop(held);
    let wait = expires
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + Duration::from_millis(1500);
    tokio::time::sleep(wait).await;
    assert_eq!(
        code(echo(&mut anonymous, init("alpha", port, &token)).await),
        Code::Unauthenticated,
        "an expired token"
    );

    // A deleted sandbox takes its tokens along.
    let fresh = create_session(&mut user, "beta").await;
    echo(&mut anonymous, init("beta", port, &fresh.token))
        .await
        .expect("fresh token");
    user.delete_sandbox(DeleteSandboxRequest {
        name: "beta".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    wait_gone(&mut user, "beta").await;
    create_ready(&mut user, "beta").await;
    assert_eq!(
        code(echo(&mut anonymous, init("beta", port, &fresh.token)).await),
        Code::Unauthenticated,
        "a token of a deleted sandbox, for its successor"
    );

    // No token in any log of the gateway or its supervisors.
    let mut logs = gw.log();
    for entry in std::fs::read_dir(gw.store_dir().join("sandboxes")).unwrap() {
        let log = entry.unwrap().path().join("supervisor.log");
        logs.push_str(&std::fs::read_to_string(log).unwrap_or_default());
    }
    for secret in [&token, &other.token, &fresh.token] {
        assert!(!logs.contains(secret.as_str()), "a token in the logs");
    }
    assert!(logs.contains("ssh session created"), "the logs were read");
    // The purge of ended sessions (every second here) runs on this store.
    assert!(
        !logs.contains("could not purge ended ssh sessions"),
        "{logs}"
    );
}

async fn wait_gone(client: &mut Client, name: &str) {
    for _ in 0..300 {
        let got = client
            .get_sandbox(GetSandboxRequest {
                name: name.into(),
                ..Default::default()
            })
            .await;
        if matches!(&got, Err(status) if status.code() == Code::NotFound) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("sandbox {name} still there after 30 s");
}

fn uuid_like(token: &str) -> bool {
    let parts: Vec<&str> = token.split('-').collect();
    parts.iter().map(|p| p.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && token.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit())
        && parts[2].starts_with('4')
}

#[tokio::test]
async fn tokens_on_sqlite() {
    tokens_are_scoped_revocable_limited_and_expire(None).await;
}

#[tokio::test]
async fn tokens_on_postgres() {
    let pg = Postgres::start();
    tokens_are_scoped_revocable_limited_and_expire(Some(pg.url())).await;
}

//! The end of an SSH session against a real 2-replica cluster and its edge:
//! forwards opened with its token end when it is revoked (at once on the
//! replica holding the forward, within the re-check interval on the other)
//! and when it expires; ended sessions are deleted from the store; and
//! `CreateSshSession` through the edge names the edge's address.

mod common;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use common::forward::*;
use common::*;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::Edge;
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use tonic::Code;

/// Long enough to run the revoke checks before the second token expires.
const TTL_SECS: u64 = 10;
/// The gateway's re-check interval of an open forward's session.
const RECHECK: Duration = Duration::from_secs(5);

/// Waits up to `limit` for the forward to end with an error; returns it
/// and how long it took.
async fn ended(forward: &mut Forward, limit: Duration) -> (tonic::Status, Duration) {
    let start = Instant::now();
    loop {
        let next =
            tokio::time::timeout(limit.saturating_sub(start.elapsed()), forward.rx.message())
                .await
                .unwrap_or_else(|_| panic!("the forward was still open after {limit:?}"));
        match next {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the forward ended without a status"),
            Err(status) => return (status, start.elapsed()),
        }
    }
}

async fn ssh_session_rows(db: &Path) -> i64 {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(db)
        .read_only(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    let count: (i64,) = sqlx::query_as("SELECT COUNT(*) FROM ssh_sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count.0
}

async fn revoke(client: &mut Client, token: &str) -> bool {
    client
        .revoke_ssh_session(RevokeSshSessionRequest {
            token: token.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .revoked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_end_with_their_session_and_ended_sessions_go() {
    let cluster = TestCluster::start(ClusterOptions {
        replicas: 2,
        tokens: vec![TOKEN.into()],
        extra_args: [
            "--ssh-session-ttl-secs",
            &TTL_SECS.to_string(),
            "--ssh-session-purge-secs",
            "1",
            "--trust-forwarded-authority",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    let (gw0, gw1) = (&cluster.replicas[0], &cluster.replicas[1]);
    let edge = Edge::start(&[("gw-0", gw0.url.as_str()), ("gw-1", gw1.url.as_str())]);
    let mut user = client(gw0).await;
    let mut anonymous0 = client_with(gw0, None).await;
    let mut anonymous1 = client_with(gw1, None).await;
    create_ready(&mut user, "ends").await;
    let port = echo_service(&mut user, &["ends"]).await;
    let db = gw0.store_dir().join("store/gateway.db");

    // Through the edge, the answer names the edge, whatever the client says.
    let channel = tonic::transport::Channel::from_shared(edge.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut via_edge = OpenShellClient::with_interceptor(channel, Bearer(Some(TOKEN.into())));
    let mut request = tonic::Request::new(CreateSshSessionRequest {
        sandbox: "ends".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "x-openshell-forwarded-authority",
        "evil.example:1".parse().unwrap(),
    );
    let session = via_edge
        .create_ssh_session(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (session.gateway_host.as_str(), session.gateway_port),
        ("127.0.0.1", u32::from(edge.grpc_addr.port())),
        "the edge's address"
    );
    let token = session.token;

    // Revoked on gw-0: gw-0's forward ends at once, gw-1's within the
    // re-check interval.
    let mut here = echo(&mut anonymous0, init("ends", port, &token))
        .await
        .unwrap();
    let mut there = echo(&mut anonymous1, init("ends", port, &token))
        .await
        .unwrap();
    assert!(revoke(&mut user, &token).await);
    let (status, took) = ended(&mut here, Duration::from_secs(2)).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{status:?}");
    assert!(!status.message().contains(&token));
    eprintln!("revoked here: forward ended after {took:?}");
    let (status, took) = ended(&mut there, RECHECK + Duration::from_secs(3)).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("revoked"), "{status:?}");
    assert!(!status.message().contains(&token));
    eprintln!("revoked on the other replica: forward ended after {took:?}");
    // A forward that is still open keeps working meanwhile: a new token.
    let session = user
        .create_ssh_session(CreateSshSessionRequest {
            sandbox: "ends".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let expires = session.expiration_time.expect("an expiry");
    let expires =
        SystemTime::UNIX_EPOCH + Duration::new(expires.seconds as u64, expires.nanos as u32);
    let mut held = echo(&mut anonymous1, init("ends", port, &session.token))
        .await
        .unwrap();
    // The revoked row is gone (the purge runs every second).
    let mut rows = 0;
    for _ in 0..50 {
        rows = ssh_session_rows(&db).await;
        if rows == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rows, 1, "the revoked session was not purged");

    // Expired: the forward ends at the expiry, not before.
    let left = expires
        .duration_since(SystemTime::now())
        .expect("the token outlived the revoke checks");
    let (status, took) = ended(&mut held, left + Duration::from_secs(3)).await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
    assert!(!status.message().contains(&session.token));
    assert!(
        took + Duration::from_secs(1) >= left,
        "ended {took:?} into {left:?}"
    );
    eprintln!(
        "expired: forward ended {:?} after the expiry",
        took.saturating_sub(left)
    );
    let refused = echo(&mut anonymous0, init("ends", port, &session.token)).await;
    assert_eq!(code(refused), Code::Unauthenticated);

    // And the expired row goes too.
    for _ in 0..50 {
        rows = ssh_session_rows(&db).await;
        if rows == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rows, 0, "the expired session was not purged");
    drop(edge);
}

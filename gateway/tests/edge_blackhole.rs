//! The built-in edge in front of two real replicas and a blackholed one: a
//! listener whose accept queue is full, so the kernel drops every further
//! SYN and a connect to it hangs until the edge's connect timeout. Calls
//! to the other replicas, hinted or not, must not wait behind the dial to
//! the blackholed one, and concurrent calls to it must all fail after about
//! one connect timeout instead of queueing behind each other's dials.

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use openshell_proto::HealthRequest;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_testkit::{Edge, Gateway, GatewayOptions};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const CONNECT_TIMEOUT: Duration = Duration::from_millis(1500);
/// A call that waited for a dial to the blackholed replica takes at least
/// the connect timeout; a prompt one is far below it.
const PROMPT: Duration = Duration::from_millis(700);

/// A loopback listener that never accepts, its queue filled: further
/// connects get no SYN-ACK. Returns its address and what must stay open.
async fn blackhole() -> (SocketAddr, tokio::net::TcpListener, Vec<TcpStream>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(stream) => fillers.push(stream),
            Err(_) => return (addr, listener, fillers),
        }
    }
    panic!("the listener's queue never filled");
}

async fn health(
    client: &mut OpenShellClient<Channel>,
    replica: Option<&str>,
) -> Result<Option<String>, Status> {
    let request = match replica {
        Some(replica) => hinted(HealthRequest {}, replica),
        None => Request::new(HealthRequest {}),
    };
    let response = client.health(request).await?;
    Ok(response
        .metadata()
        .get("x-openshell-served-by")
        .map(|v| v.to_str().unwrap().to_owned()))
}

#[tokio::test]
async fn a_blackholed_replica_delays_no_other_call() {
    let gw0 = Gateway::start(GatewayOptions {
        replica_id: Some("gw-0".into()),
        ..GatewayOptions::dev()
    });
    let gw1 = Gateway::start(GatewayOptions {
        replica_id: Some("gw-1".into()),
        ..GatewayOptions::dev()
    });
    let (hole, _listener, _fillers) = blackhole().await;
    // The queue really is full: a connect now times out.
    assert!(TcpStream::connect_timeout(&hole, Duration::from_millis(300)).is_err());
    let hole_url = format!("http://{hole}");
    let timeout_ms = CONNECT_TIMEOUT.as_millis().to_string();
    let edge = Edge::start_with(
        &[
            ("gw-0", gw0.url.as_str()),
            ("gw-1", gw1.url.as_str()),
            ("gw-2", hole_url.as_str()),
        ],
        &["--connect-timeout-ms", &timeout_ms],
    );
    let channel = Channel::from_shared(edge.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = OpenShellClient::new(channel);

    // Eight concurrent calls to the blackholed replica.
    let mut to_hole = Vec::new();
    for _ in 0..8 {
        let mut client = client.clone();
        to_hole.push(tokio::spawn(async move {
            let started = Instant::now();
            let result = client
                .health(hinted(HealthRequest {}, "gw-2"))
                .await
                .map(|_| ());
            (result, started.elapsed())
        }));
    }

    // While they are pending (and after they fail), calls to the other
    // replicas are answered promptly, hinted or not.
    let mut others = client.clone();
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    let mut unhinted_served = std::collections::BTreeSet::new();
    while !to_hole.iter().all(|t| t.is_finished()) {
        assert!(calls < 2_000, "the blackholed calls never ended");
        for replica in [Some("gw-0"), Some("gw-1"), None, None] {
            let started = Instant::now();
            let served_by =
                tokio::time::timeout(Duration::from_secs(10), health(&mut others, replica))
                    .await
                    .expect("answered within 10 s")
                    .unwrap_or_else(|status| panic!("call to {replica:?}: {status:?}"));
            let took = started.elapsed();
            slowest = slowest.max(took);
            assert!(
                took < PROMPT,
                "a call to {replica:?} took {took:?} while gw-2 was blackholed"
            );
            match replica {
                Some(id) => assert_eq!(served_by.as_deref(), Some(id)),
                None => {
                    unhinted_served.insert(served_by.expect("served-by"));
                }
            }
            calls += 1;
        }
    }
    assert!(
        calls >= 8,
        "only {calls} calls ran next to the blackholed ones"
    );
    assert!(
        unhinted_served.iter().all(|r| r == "gw-0" || r == "gw-1"),
        "{unhinted_served:?}"
    );

    let mut latest = Duration::ZERO;
    for task in to_hole {
        let (result, took) = task.await.unwrap();
        let status = result.expect_err("the blackholed replica cannot answer");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(
            status
                .metadata()
                .get("x-openshell-edge")
                .map(|v| v.to_str().unwrap()),
            Some("not-forwarded"),
            "{status:?}"
        );
        latest = latest.max(took);
    }
    // One connect timeout (plus scheduling), not one per queued call.
    assert!(
        latest < CONNECT_TIMEOUT + Duration::from_millis(1000),
        "the last blackholed call failed after {latest:?}"
    );
    let failures = edge
        .metric("openshell_edge_connect_failures_total")
        .unwrap_or(0.0);
    assert!(failures >= 1.0);

    // Right after a connect timed out, a hinted call is answered at once,
    // not forwarded, rather than waiting out another connect timeout.
    let begun = Instant::now();
    let status = client
        .clone()
        .health(hinted(HealthRequest {}, "gw-2"))
        .await
        .expect_err("the blackholed replica cannot answer");
    let quick = begun.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("x-openshell-edge")
            .map(|v| v.to_str().unwrap()),
        Some("not-forwarded")
    );
    assert!(
        quick < CONNECT_TIMEOUT / 2,
        "a hinted call right after a timed-out connect took {quick:?}"
    );
    eprintln!(
        "FIGURE blackholed replica: 8 concurrent calls failed within {latest:?} (connect timeout \
         {CONNECT_TIMEOUT:?}, {failures} dial failures); {calls} calls to other replicas, slowest \
         {slowest:?}"
    );
}

fn hinted<T>(message: T, replica: &str) -> Request<T> {
    let mut request = Request::new(message);
    let value: MetadataValue<_> = replica.parse().unwrap();
    request.metadata_mut().insert("x-openshell-replica", value);
    request
}

//! Outbound access of isolated sandboxes follows their network policy,
//! against a real machine "outside" (a network namespace joined by a veth
//! pair, `openshell_testkit::outside`) and real slirp4netns:
//!
//! - without network rules a sandbox reaches nothing but its own loopback;
//! - a rule naming an address reaches that address and no other outside
//!   address;
//! - a rule for `*` reaches the outside, and still never this host's own
//!   addresses, its loopback (through slirp4netns's gateway), link-local
//!   addresses or a network the gateway denies (`--sandbox-egress-deny`);
//! - a policy update opens and closes the way out while the sandbox runs;
//! - a rule naming one of this host's addresses is rejected, and the
//!   previous policy stays in force.
//!
//! Every refusal has a positive control: the same connect from the test
//! process (or from an allowed sandbox) gets through.

mod common;
mod config_util;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::sandbox::{NetworkEndpoint, NetworkPolicyRule, SandboxPolicy};
use openshell_proto::{CreateSandboxRequest, SandboxSpec, UpdateConfigRequest};
use openshell_testkit::outside::Outside;
use openshell_testkit::{Gateway, GatewayOptions};

/// Connects to argv[1]:argv[2] within 3 s, sends "ping" and expects it
/// back: prints "ok" or the error, exit 0 only on "ok".
const PING: &str = r#"
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as s:
        s.sendall(b"ping")
        s.shutdown(socket.SHUT_WR)
        back = s.recv(16)
    print("ok" if back == b"ping" else f"got {back!r}")
    sys.exit(0 if back == b"ping" else 1)
except OSError as err:
    print(err)
    sys.exit(1)
"#;

fn serve_echo(listener: TcpListener) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 64];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

fn rule(hosts: &[&str]) -> SandboxPolicy {
    SandboxPolicy {
        network_policies: [(
            "out".to_owned(),
            NetworkPolicyRule {
                name: "out".into(),
                endpoints: hosts
                    .iter()
                    .map(|h| NetworkEndpoint {
                        host: (*h).into(),
                        port: 443,
                        protocol: "tcp".into(),
                    })
                    .collect(),
                binaries: Vec::new(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

async fn create(client: &mut Client, name: &str, policy: Option<SandboxPolicy>) {
    client
        .create_sandbox(CreateSandboxRequest {
            name: name.into(),
            spec: Some(SandboxSpec {
                policy,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("create");
    wait_phase(client, name, openshell_proto::SandboxPhase::Ready).await;
}

/// What PING printed from inside `sandbox`, and whether it got through.
async fn ping(client: &mut Client, sandbox: &str, to: SocketAddr) -> (bool, String) {
    let out = exec(
        client,
        exec_request(
            sandbox,
            &[
                "python3",
                "-c",
                PING,
                &to.ip().to_string(),
                &to.port().to_string(),
            ],
        ),
    )
    .await
    .expect("exec");
    (
        out.exit_code == Some(0),
        out.stdout_text().trim().to_owned(),
    )
}

/// Waits (at most 15 s) until PING from `sandbox` to `to` gets through
/// (`want`) or not: a policy update reaches the supervisor asynchronously.
async fn until(client: &mut Client, sandbox: &str, to: SocketAddr, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (through, said) = ping(client, sandbox, to).await;
        if through == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sandbox} -> {to}: still {said:?} after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn host_address() -> Ipv4Addr {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|a| {
            a.parse::<Ipv4Addr>()
                .ok()
                .filter(|a| !a.is_loopback() && !a.is_link_local())
        })
        .expect("a non-loopback IPv4 address on this host")
}

#[tokio::test]
async fn outbound_access_follows_the_network_policy() {
    let outside = Outside::start().expect("an outside namespace (needs root and iproute2)");
    let listener = outside.listen((Ipv4Addr::UNSPECIFIED, 0).into()).unwrap();
    let port = listener.local_addr().unwrap().port();
    serve_echo(listener);
    let allowed = SocketAddr::from((outside.addr, port));
    let other = SocketAddr::from((outside.other, port));
    // Allowed by no rule but `*`, denied by nothing.
    let spare = SocketAddr::from((outside.spare, port));
    // A denied network: the outside's second address, by the gateway's flag.
    let denied_net = format!("{}/32", outside.other);
    let gw = Gateway::start(GatewayOptions {
        extra_args: [
            vec!["--sandbox-egress-deny".into(), denied_net],
            config_util::push_args(None),
        ]
        .concat(),
        ..GatewayOptions::with_token(TOKEN)
    });
    assert_eq!(
        gw.metric(r#"openshell_server_sandbox_isolation{mode="namespaces"}"#),
        Some(1.0),
        "egress needs --isolation namespaces"
    );
    // A service on every address of this host: the gateway-like target.
    let host_service = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let host_port = host_service.local_addr().unwrap().port();
    serve_echo(host_service);
    let host_addr = SocketAddr::from((host_address(), host_port));
    let host_loopback = SocketAddr::from(([10, 0, 2, 2], host_port));
    let metadata = SocketAddr::from(([169, 254, 169, 254], 80));

    // Positive controls from the test process itself.
    for target in [allowed, other, spare, host_addr] {
        let mut conn = TcpStream::connect_timeout(&target, Duration::from_secs(3))
            .unwrap_or_else(|err| panic!("control {target}: {err}"));
        conn.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        conn.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping");
    }

    let mut client = client(&gw).await;
    create(&mut client, "eg-none", None).await;
    create(
        &mut client,
        "eg-one",
        Some(rule(&[&outside.addr.to_string()])),
    )
    .await;
    create(&mut client, "eg-any", Some(rule(&["*"]))).await;

    let (through, said) = ping(&mut client, "eg-none", allowed).await;
    assert!(!through, "no policy, yet reached {allowed}: {said}");

    assert_eq!(
        ping(&mut client, "eg-one", allowed).await,
        (true, "ok".into())
    );
    let (through, said) = ping(&mut client, "eg-one", spare).await;
    assert!(
        !through,
        "eg-one reached {spare}, not in its policy: {said}"
    );

    assert_eq!(
        ping(&mut client, "eg-any", allowed).await,
        (true, "ok".into())
    );
    assert_eq!(
        ping(&mut client, "eg-any", spare).await,
        (true, "ok".into())
    );
    for target in [other, host_addr, host_loopback, metadata] {
        let (through, said) = ping(&mut client, "eg-any", target).await;
        assert!(!through, "eg-any reached the denied {target}: {said}");
    }

    // Opened and closed while it runs.
    let update = |policy: SandboxPolicy| UpdateConfigRequest {
        sandbox: "eg-none".into(),
        policy: Some(policy),
        ..Default::default()
    };
    client
        .update_config(update(rule(&[&outside.addr.to_string()])))
        .await
        .expect("allow");
    until(&mut client, "eg-none", allowed, true).await;
    client
        .update_config(update(SandboxPolicy::default()))
        .await
        .expect("close");
    until(&mut client, "eg-none", allowed, false).await;

    // A rule for this host's own address is refused by the supervisor; the
    // previous policy (the outside address) stays in force.
    client
        .update_config(UpdateConfigRequest {
            sandbox: "eg-one".into(),
            policy: Some(rule(&[&host_address().to_string()])),
            ..Default::default()
        })
        .await
        .expect("update");
    let id = config_util::id(
        &client
            .get_sandbox(openshell_proto::GetSandboxRequest {
                name: "eg-one".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sandbox
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = config_util::supervisor_log(&gw.store_dir(), &id);
        if log.contains("configuration rejected") {
            assert!(log.contains("overlaps"), "{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the update was not rejected:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        ping(&mut client, "eg-one", allowed).await,
        (true, "ok".into())
    );
    let (through, _) = ping(&mut client, "eg-one", host_addr).await;
    assert!(!through, "the rejected rule took effect");
}

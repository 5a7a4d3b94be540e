//! The gateway serving TLS: clients and supervisors verify it with a CA the
//! test makes, and everything (sessions, relays, exec) runs over TLS.

mod common;

use common::*;
use openshell_proto::open_shell_client::OpenShellClient;
use openshell_testkit::tls::make_pki;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[tokio::test]
async fn supervisors_and_clients_run_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let gw = Gateway::start(GatewayOptions {
        tokens: vec![TOKEN.into()],
        tls: Some((pki.server_cert.clone(), pki.server_key.clone())),
        supervisor_ca: Some(pki.ca_cert.clone()),
        ..Default::default()
    });
    assert!(gw.url.starts_with("https://"), "{}", gw.url);
    let ca = Certificate::from_pem(std::fs::read(&pki.ca_cert).unwrap());
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .tls_config(ClientTlsConfig::new().ca_certificate(ca))
        .unwrap()
        .connect()
        .await
        .expect("TLS connect");
    let mut client = OpenShellClient::with_interceptor(channel, Bearer(Some(TOKEN.into())));
    create_ready(&mut client, "secure").await;
    assert_eq!(
        sh(&mut client, "secure", "echo over tls")
            .await
            .stdout_text(),
        "over tls\n"
    );

    // A client that does not trust the CA cannot connect.
    let untrusted = Channel::from_shared(gw.url.clone())
        .unwrap()
        .tls_config(ClientTlsConfig::new())
        .unwrap()
        .connect()
        .await;
    let refused = match untrusted {
        Err(_) => true,
        Ok(channel) => OpenShellClient::new(channel)
            .health(openshell_proto::HealthRequest {})
            .await
            .is_err(),
    };
    assert!(refused);
}

/// A CA certificate as the server certificate (what a plain
/// `openssl req -x509` makes) is refused at start-up with a message saying
/// how to make a CA and a leaf, instead of a gateway nobody can reach.
#[test]
fn a_ca_certificate_is_refused_as_the_server_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let output = std::process::Command::new(openshell_testkit::bin("openshell-gateway"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(&pki.ca_cert)
        .arg("--tls-key")
        .arg(&pki.ca_key)
        .env("OPENSHELL_GATEWAY_TOKENS", TOKEN)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is a CA certificate"), "{stderr}");
    assert!(stderr.contains("--supervisor-ca"), "{stderr}");
}

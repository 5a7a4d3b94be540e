//! A throwaway CA and a server certificate for 127.0.0.1/localhost (and,
//! through [`make_pki_for`], further IP addresses such as a lab host's),
//! written as PEM files, for TLS tests.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

pub struct TestPki {
    pub ca_cert: PathBuf,
    /// The CA's own key (tests that misuse the CA as a server certificate).
    pub ca_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// A CA and a server certificate for `localhost` and `127.0.0.1`.
pub fn make_pki(dir: &Path) -> TestPki {
    make_pki_for(dir, &[])
}

/// A CA and a server certificate whose names are `localhost`, `127.0.0.1`
/// and each of `ips` (the addresses a gateway serves on in a
/// [`Lab`](crate::lab::Lab), for example).
pub fn make_pki_for(dir: &Path, ips: &[IpAddr]) -> TestPki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "openshell test CA");
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");

    let key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
    let loopback = IpAddr::from([127, 0, 0, 1]);
    for ip in std::iter::once(&loopback).chain(ips.iter().filter(|ip| **ip != loopback)) {
        params.subject_alt_names.push(SanType::IpAddress(*ip));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "openshell test gateway");
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).expect("server cert");

    let pki = TestPki {
        ca_cert: dir.join("ca.pem"),
        ca_key: dir.join("ca.key"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
    };
    std::fs::write(&pki.ca_cert, ca.pem()).unwrap();
    std::fs::write(&pki.ca_key, ca_key_pem).unwrap();
    std::fs::write(&pki.server_cert, cert.pem()).unwrap();
    std::fs::write(&pki.server_key, key.serialize_pem()).unwrap();
    pki
}

//! `openshell forward SANDBOX [[ADDRESS:]LOCAL:]PORT`: a local listener
//! whose connections reach PORT on loopback inside the sandbox, until
//! Ctrl-C (or SIGTERM / SIGHUP), which ends it normally (exit 0).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use openshell_sdk::CallOptions;

use super::signals::Interrupts;
use crate::args::ForwardArgs;
use crate::failure::Failure;
use crate::settings::Settings;

/// `PORT`, `LOCAL:PORT`, `ADDRESS:LOCAL:PORT` (`[v6]:LOCAL:PORT`).
pub fn parse_spec(spec: &str) -> Result<(SocketAddr, u16), Failure> {
    let bad = || {
        Failure::invalid(format!(
            "forward {spec:?}: expected PORT, LOCAL:PORT or ADDRESS:LOCAL:PORT (ports 1-65535, LOCAL may be 0)"
        ))
    };
    let port = |text: &str, zero_ok: bool| -> Result<u16, Failure> {
        match text.parse::<u16>() {
            Ok(0) if !zero_ok => Err(bad()),
            Ok(p) => Ok(p),
            Err(_) => Err(bad()),
        }
    };
    let (head, remote) = match spec.rsplit_once(':') {
        Some((head, remote)) => (Some(head), port(remote, false)?),
        None => (None, port(spec, false)?),
    };
    let local = match head {
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), remote),
        Some(head) => match head.rsplit_once(':') {
            None => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port(head, true)?),
            Some((address, local)) => {
                let address = address.trim_start_matches('[').trim_end_matches(']');
                let ip: IpAddr = address.parse().map_err(|_| bad())?;
                SocketAddr::new(ip, port(local, true)?)
            }
        },
    };
    Ok((local, remote))
}

pub async fn run(args: ForwardArgs, settings: &Settings) -> Result<u8, Failure> {
    let (local, remote) = parse_spec(&args.spec)?;
    let mut interrupts = Interrupts::new()?;
    let client = settings.connect().await?;
    // Fails early for a missing sandbox, and primes the owner cache.
    client
        .sandboxes()
        .get_with_owner(&args.sandbox, CallOptions::new())
        .await?;
    let handle = client
        .forward(&args.sandbox, remote, local, CallOptions::new())
        .await?;
    println!(
        "Forwarding from {} -> {}:{remote} (Ctrl-C to stop)",
        handle.local_addr(),
        args.sandbox
    );
    let _ = std::io::stdout().flush();
    interrupts.recv().await;
    handle.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), handle.closed()).await;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let (l, r) = parse_spec("8080").unwrap();
        assert_eq!((l.to_string().as_str(), r), ("127.0.0.1:8080", 8080));
        let (l, r) = parse_spec("0:80").unwrap();
        assert_eq!((l.to_string().as_str(), r), ("127.0.0.1:0", 80));
        let (l, r) = parse_spec("0.0.0.0:9000:80").unwrap();
        assert_eq!((l.to_string().as_str(), r), ("0.0.0.0:9000", 80));
        let (l, _) = parse_spec("[::1]:9000:80").unwrap();
        assert_eq!(l.to_string(), "[::1]:9000");
        for bad in ["", "0", "x", "70000", "1:0", "a:1", "nohost:1:2", "1:2:3:4"] {
            assert_eq!(
                parse_spec(bad).unwrap_err().code,
                "invalid_argument",
                "{bad}"
            );
        }
    }
}

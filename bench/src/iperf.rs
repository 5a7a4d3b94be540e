//! iperf3 and plain TCP relays: the program on both ends of every forward
//! figure of `openshell-bench languages`, and the two limits measured in
//! the same run (raw loopback, and a chain of socat relays with as many
//! hops as the SDK's path).
//!
//! Every process here is started by this module and stopped by its own PID
//! (SIGTERM, then SIGKILL after 5 s).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openshell_testkit::netns::SandboxNet;

/// socat's read/write buffer: 1 MiB, as the relay chain.
const SOCAT_BUFFER: &str = "1048576";
const SIGTERM: i32 = 15;

/// A free loopback port (bound, read, released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding a free loopback port")
        .port()
}

/// A child process stopped by its PID on drop.
pub struct Process {
    child: Child,
    what: String,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        openshell_testkit::signal(self.child.id() as i32, SIGTERM);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(5) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{} (pid {}) ignored SIGTERM: killing it",
            self.what,
            self.pid()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `program -V` runs (iperf3 and socat both take it).
pub fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// `iperf3 -s` on the host's 127.0.0.1:`port`, once it says it listens: a
/// limit's server (raw loopback, relay chains). A forward cannot reach it
/// from an isolated sandbox: see [`iperf3_server_in`].
pub fn iperf3_server(port: u16) -> Process {
    start_iperf3_server(None, port)
}

/// `iperf3 -s` on 127.0.0.1:`port` inside a sandbox's network (started by
/// this process in that namespace only, so nothing but the namespace
/// differs from [`iperf3_server`]): where the sandbox's forwards to
/// 127.0.0.1:`port` arrive. Pick `port` free on the host
/// ([`free_port`]) so that it is free without isolation too.
pub fn iperf3_server_in(net: &SandboxNet, port: u16) -> Process {
    start_iperf3_server(Some(net), port)
}

fn start_iperf3_server(net: Option<&SandboxNet>, port: u16) -> Process {
    let mut command = Command::new("iperf3");
    command
        .args(["-s", "--forceflush", "-B", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = match net {
        Some(net) => net.spawn(&mut command),
        None => command.spawn(),
    }
    .expect("starting iperf3 -s (make bench installs iperf3: scripts/bench-setup.sh)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut told = false;
        // Drains the rest so the server never blocks on a full pipe.
        while let Some(Ok(line)) = lines.next() {
            if !told && line.contains("Server listening") {
                let _ = tx.send(());
                told = true;
            }
        }
    });
    let process = Process {
        child,
        what: "iperf3 -s".into(),
    };
    rx.recv_timeout(Duration::from_secs(10))
        .expect("iperf3 -s did not listen within 10 s");
    process
}

/// One `iperf3 -c` run of `seconds` (one stream) to 127.0.0.1:`port`:
/// the receiver's Gbit/s (10^9 bits per second).
pub fn iperf3_gbit_s(port: u16, seconds: u64) -> Result<f64, String> {
    iperf3_gbit_s_streams(port, seconds, 1)
}

/// As [`iperf3_gbit_s`], with `streams` parallel streams (`-P`): their sum.
pub fn iperf3_gbit_s_streams(port: u16, seconds: u64, streams: usize) -> Result<f64, String> {
    let output = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-J", "-p"])
        .arg(port.to_string())
        .arg("-t")
        .arg(seconds.to_string())
        .arg("-P")
        .arg(streams.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running iperf3 -c: {e}"))?;
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("iperf3 -c to port {port}: no JSON report ({e})"))?;
    if let Some(error) = report["error"].as_str() {
        return Err(format!("iperf3 -c to port {port}: {error}"));
    }
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|bps| bps / 1e9)
        .ok_or_else(|| format!("iperf3 -c to port {port}: no sum_received in the report"))
}

/// A chain of `hops` socat relays in front of 127.0.0.1:`target`: each
/// listens on its own port and connects to the next (`-b 1048576`, a
/// process per connection). The first relay's port is what a client dials.
pub struct RelayChain {
    pub port: u16,
    _relays: Vec<Process>,
}

pub fn relay_chain(hops: usize, target: u16) -> RelayChain {
    let mut next = target;
    let mut relays = Vec::with_capacity(hops);
    for _ in 0..hops {
        let port = free_port();
        let child = Command::new("socat")
            .args(["-b", SOCAT_BUFFER])
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("TCP:127.0.0.1:{next}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // iperf3 ends its connections with a reset: socat's "broken
            // pipe" reports are noise here.
            .stderr(Stdio::null())
            .spawn()
            .expect("starting socat (make bench installs socat: scripts/bench-setup.sh)");
        relays.push(Process {
            child,
            what: "socat".into(),
        });
        wait_listening(port);
        next = port;
    }
    RelayChain {
        port: next,
        _relays: relays,
    }
}

/// Whether a socket listens on 127.0.0.1:`port` (`/proc/net/tcp`, state
/// 0A), found without connecting: a test connection would travel the chain
/// to the iperf3 server at its end.
fn listening(port: u16) -> bool {
    let local = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
        })
}

fn wait_listening(port: u16) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        if listening(port) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing listens on 127.0.0.1:{port} after 10 s");
}

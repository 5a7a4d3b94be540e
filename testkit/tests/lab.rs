//! The lab: hosts in network namespaces on one switch, and cables that
//! fail. Real namespaces, real processes, real sockets; every test prints
//! why and returns when the machine cannot host a lab (not root).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openshell_testkit::lab::Lab;
use openshell_testkit::netns::SandboxNet;
use openshell_testkit::tls::make_pki_for;

const PORT: u16 = 7000;
/// Long enough for a frame through two cables and a bridge, short enough
/// that a dropped SYN shows as a timeout quickly.
const CONNECT: Duration = Duration::from_secs(1);

fn start(hosts: &[&str]) -> Option<Lab> {
    if let Some(reason) = Lab::skip_reason() {
        eprintln!("{reason}");
        return None;
    }
    Some(Lab::start(hosts).expect("start the lab"))
}

fn at(lab: &Lab, host: &str) -> SocketAddr {
    SocketAddr::from((lab.addr(host), PORT))
}

/// An echo service on `PORT` in a host, served by threads of the test that
/// end when it is dropped (the listener with them: a socket would keep the
/// host's namespace alive).
struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(lab: &Lab, host: &str) -> Self {
        let listener = lab
            .listen(host, SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)))
            .expect("listen in the host");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || serve(listener, &flag));
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

fn serve(listener: TcpListener, stop: &Arc<AtomicBool>) {
    let mut connections = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let stop = stop.clone();
                connections.push(std::thread::spawn(move || echo(conn, &stop)));
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => break,
        }
    }
    for connection in connections {
        let _ = connection.join();
    }
}

/// Sends back what arrives until the peer closes or the test ends.
fn echo(mut conn: TcpStream, stop: &AtomicBool) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = [0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => return,
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One byte there and back on an echo connection.
fn round_trip(conn: &mut TcpStream) -> Duration {
    let started = Instant::now();
    conn.write_all(b"x").unwrap();
    let mut byte = [0u8; 1];
    conn.read_exact(&mut byte).unwrap();
    started.elapsed()
}

/// The median of a few round trips.
fn median_round_trip(conn: &mut TcpStream) -> Duration {
    let mut samples: Vec<_> = (0..5).map(|_| round_trip(conn)).collect();
    samples.sort();
    samples[2]
}

fn connect(lab: &Lab, from: &str, to: &str) -> io::Result<TcpStream> {
    lab.connect(from, at(lab, to), CONNECT)
}

/// Whether `from` gets an answer from the echo service of `to` at the
/// first try.
fn reaches(lab: &Lab, from: &str, to: &str) -> bool {
    let Ok(mut conn) = connect(lab, from, to) else {
        return false;
    };
    conn.set_read_timeout(Some(CONNECT)).unwrap();
    conn.set_nodelay(true).unwrap();
    let mut reply = [0u8; 4];
    conn.write_all(b"ping").is_ok() && conn.read_exact(&mut reply).is_ok() && &reply == b"ping"
}

/// Waits for `from` to reach `to`: a link that just came back may have
/// lost a SYN or an ARP request held from before (each retried after 1 s).
fn assert_reaches(lab: &Lab, from: &str, to: &str, what: &str) {
    let reached = openshell_testkit::wait_until(Duration::from_secs(10), || reaches(lab, from, to));
    assert!(reached, "{from} does not reach {to}: {what}");
}

fn assert_times_out(result: io::Result<TcpStream>, what: &str) {
    match result {
        Ok(_) => panic!("{what}: connected"),
        Err(err) => assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{what}: {err}"),
    }
}

/// The TAP devices of the test's own namespace.
fn own_taps() -> Vec<String> {
    let mut taps: Vec<_> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|link| link.path().join("tun_flags").exists())
        .map(|link| link.file_name().to_string_lossy().into_owned())
        .collect();
    taps.sort();
    taps
}

#[test]
fn tcp_between_hosts_through_the_cables() {
    let before = own_taps();
    let Some(lab) = start(&["a", "b"]) else {
        return;
    };
    assert_eq!(
        own_taps(),
        before,
        "the lab made a device in the test's namespace"
    );
    assert_eq!(lab.addr("a"), Ipv4Addr::new(198, 18, 251, 10));
    assert_eq!(lab.addr("b"), Ipv4Addr::new(198, 18, 251, 11));
    let _echo = Echo::start(&lab, "b");
    assert_reaches(&lab, "a", "b", "a healthy lab");

    // An in-process async client, as tests run an SDK from a host.
    let target = at(&lab, "b");
    let reply = lab.run_in("a", || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut conn = tokio::net::TcpStream::connect(target).await?;
            assert_eq!(conn.local_addr()?.ip(), lab.addr("a"));
            conn.write_all(b"hello").await?;
            let mut reply = [0u8; 5];
            conn.read_exact(&mut reply).await?;
            io::Result::Ok(reply)
        })
    });
    assert_eq!(&reply.unwrap(), b"hello");

    // Throughput: bytes from a to b (a's cable, the bridge, b's cable).
    let sink = lab
        .listen("b", SocketAddr::from((lab.addr("b"), PORT + 1)))
        .unwrap();
    let counter = std::thread::spawn(move || {
        let (mut conn, _) = sink.accept().unwrap();
        let total = io::copy(&mut conn, &mut io::sink()).unwrap();
        conn.write_all(&total.to_be_bytes()).unwrap();
    });
    let mut conn = lab
        .connect("a", SocketAddr::from((lab.addr("b"), PORT + 1)), CONNECT)
        .unwrap();
    // For a second (the machine may be busy: a longer run averages it).
    let chunk = vec![7u8; 1 << 16];
    let started = Instant::now();
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_secs(1) {
        conn.write_all(&chunk).unwrap();
        sent += chunk.len() as u64;
    }
    conn.shutdown(Shutdown::Write).unwrap();
    let mut total = [0u8; 8];
    conn.read_exact(&mut total).unwrap();
    let elapsed = started.elapsed();
    counter.join().unwrap();
    assert_eq!(u64::from_be_bytes(total), sent);
    println!(
        "lab cable throughput: {:.0} MB/s ({} MiB in {:.2} s)",
        sent as f64 / 1e6 / elapsed.as_secs_f64(),
        sent >> 20,
        elapsed.as_secs_f64()
    );
}

#[test]
fn a_host_reaches_nothing_outside() {
    let Some(lab) = start(&["a"]) else {
        return;
    };
    // A service on the test's own loopback is not the host's loopback.
    let own = TcpListener::bind("127.0.0.1:0").unwrap();
    let own_addr = own.local_addr().unwrap();
    let err = lab.connect("a", own_addr, CONNECT).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    // No default route: anything off the switch is unreachable at once.
    let started = Instant::now();
    let err = lab
        .connect("a", "192.0.2.1:80".parse().unwrap(), CONNECT)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NetworkUnreachable, "{err}");
    assert!(started.elapsed() < CONNECT);
}

#[test]
fn cut_is_silent_and_heal_restores() {
    let Some(lab) = start(&["a", "b", "c"]) else {
        return;
    };
    let _echoes: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|host| Echo::start(&lab, host))
        .collect();
    assert_reaches(&lab, "a", "b", "before the cut");
    // A connection made before the cut, held across it.
    let mut held = connect(&lab, "a", "b").unwrap();
    held.set_nodelay(true).unwrap();
    round_trip(&mut held);

    lab.cut("a", "b");
    assert_times_out(connect(&lab, "a", "b"), "a to b after the cut");
    assert_times_out(connect(&lab, "b", "a"), "b to a after the cut");
    for (from, to) in [("c", "a"), ("c", "b"), ("a", "c"), ("b", "c")] {
        assert_reaches(&lab, from, to, "beside the cut");
    }
    held.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    held.write_all(b"x").unwrap();
    let mut byte = [0u8; 1];
    let err = held.read_exact(&mut byte).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "a held connection over the cut: {err}"
    );

    lab.heal("a", "b");
    assert_reaches(&lab, "a", "b", "after heal");
    assert_reaches(&lab, "b", "a", "after heal");
    // The held connection recovers by retransmission.
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    held.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");

    // One way: a's frames to b are lost, b's to a arrive.
    lab.cut_one_way("a", "b");
    assert_times_out(connect(&lab, "a", "b"), "a to b, cut one way");
    assert_times_out(connect(&lab, "b", "a"), "b to a, its answers cut");
    lab.heal_all();
    assert_reaches(&lab, "a", "b", "after heal_all");
}

#[test]
fn shape_delays_each_frame_and_unshape_removes_it() {
    let Some(lab) = start(&["a", "b"]) else {
        return;
    };
    let _echo = Echo::start(&lab, "b");
    let mut conn = connect(&lab, "a", "b").unwrap();
    conn.set_nodelay(true).unwrap();
    let plain = median_round_trip(&mut conn);

    let delay = Duration::from_millis(200);
    lab.shape("a", "b", delay, 0.0);
    let shaped = median_round_trip(&mut conn);
    lab.unshape("a", "b");
    // The first round trip may still meet frames queued before.
    round_trip(&mut conn);
    let after = median_round_trip(&mut conn);
    println!("lab round trip: {plain:?} plain, {shaped:?} with 200 ms each way, {after:?} after");
    // Each frame is held `delay` at least; the work around it overlaps.
    assert!(shaped >= 2 * delay, "shaped {shaped:?}");
    assert!(
        shaped >= plain + delay,
        "shaped {shaped:?} against {plain:?}"
    );
    assert!(
        shaped < 2 * delay + Duration::from_millis(300),
        "{shaped:?}"
    );
    assert!(
        after < Duration::from_millis(100),
        "after unshape: {after:?}"
    );

    // Loss alone: every frame lost is a cut.
    lab.shape("a", "b", Duration::ZERO, 1.0);
    assert_times_out(connect(&lab, "a", "b"), "a to b at 100 % loss");
    lab.unshape("a", "b");
    assert_reaches(&lab, "a", "b", "after unshape");
}

#[test]
fn isolate_cuts_every_link() {
    let Some(lab) = start(&["a", "b", "c"]) else {
        return;
    };
    let _echoes: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|host| Echo::start(&lab, host))
        .collect();
    assert_reaches(&lab, "a", "b", "before isolation");
    lab.isolate("a");
    for (from, to) in [("a", "b"), ("a", "c"), ("b", "a"), ("c", "a")] {
        assert!(!reaches(&lab, from, to), "{from} to {to} with a isolated");
    }
    assert_reaches(&lab, "b", "c", "beside the isolated host");
    lab.rejoin("a");
    assert_reaches(&lab, "a", "b", "after rejoin");
    assert_reaches(&lab, "c", "a", "after rejoin");
}

#[test]
fn processes_start_inside_their_host() {
    let Some(lab) = start(&["a", "b"]) else {
        return;
    };
    let holder = lab.holder_pids()[1];
    let host_ns = std::fs::read_link(format!("/proc/{holder}/ns/net")).unwrap();

    // The launcher execs the program: the child's pid is the program's.
    let launcher = lab.launcher("a");
    let mut sleeper = Command::new(&launcher[0])
        .args(&launcher[1..])
        .args(["sleep", "30"])
        .spawn()
        .unwrap();
    let pid = sleeper.id();
    let in_host = openshell_testkit::wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "sleep")
    });
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/net"));
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(in_host, "the launcher did not exec sleep");
    assert_eq!(ns.unwrap(), host_ns);

    let output = lab
        .command("a", "readlink")
        .arg("/proc/self/ns/net")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        host_ns.to_string_lossy()
    );

    // A real server process in b, reached from a.
    if !Path::new("/usr/bin/socat").exists() {
        eprintln!("socat is missing: the server process part is skipped");
        return;
    }
    let mut server = lab
        .command("b", "socat")
        .args([&format!("TCP-LISTEN:{PORT},reuseaddr,fork"), "PIPE"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let reached = openshell_testkit::wait_until(Duration::from_secs(5), || reaches(&lab, "a", "b"));
    let _ = server.kill();
    let _ = server.wait();
    assert!(reached, "a did not reach socat in b");
}

#[test]
fn drop_removes_every_holder_even_on_panic() {
    if let Some(reason) = Lab::skip_reason() {
        eprintln!("{reason}");
        return;
    }
    let seen = std::sync::Mutex::new(Vec::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = Lab::start(&["zz0", "zz1"]).expect("start the lab");
        for pid in lab.holder_pids() {
            let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
            seen.lock().unwrap().push((pid, link));
        }
        assert!(reaches_nothing_yet(&lab));
        panic!("a test fails with the lab up");
    }));
    assert!(outcome.is_err());
    let seen = seen.into_inner().unwrap();
    assert_eq!(seen.len(), 3);
    for (pid, link) in seen {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "holder {pid} is still there"
        );
        let err = SandboxNet::from_link(&link.to_string_lossy()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
    let cables: Vec<_> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .filter(|comm| comm.starts_with("lab-cable-zz"))
        .collect();
    assert!(cables.is_empty(), "cable threads left: {cables:?}");
}

/// Nothing listens yet: a connect is refused, through both cables.
fn reaches_nothing_yet(lab: &Lab) -> bool {
    let err = lab
        .connect("zz0", SocketAddr::from((lab.addr("zz1"), PORT)), CONNECT)
        .unwrap_err();
    err.kind() == io::ErrorKind::ConnectionRefused
}

#[test]
fn a_certificate_for_a_lab_address_verifies_from_another_host() {
    let Some(lab) = start(&["a", "b"]) else {
        return;
    };
    let tools = ["/usr/bin/openssl", "/usr/bin/curl"];
    if let Some(tool) = tools.iter().find(|tool| !Path::new(tool).exists()) {
        eprintln!("{tool} is missing: skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki_for(dir.path(), &[IpAddr::V4(lab.addr("b"))]);
    let mut server = lab
        .command("b", "openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(PORT.to_string())
        .arg("-cert")
        .arg(&pki.server_cert)
        .arg("-key")
        .arg(&pki.server_key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("https://{}:{PORT}/", lab.addr("b"));
    let fetch = |ca: &Path| {
        lab.command("a", "curl")
            .args(["--silent", "--output", "/dev/null", "--max-time", "2"])
            .arg("--cacert")
            .arg(ca)
            .arg(&url)
            .status()
            .unwrap()
    };
    let verified =
        openshell_testkit::wait_until(Duration::from_secs(10), || fetch(&pki.ca_cert).success());
    // Another CA's certificate does not verify: the check is real.
    let other = tempfile::tempdir().unwrap();
    let stranger = make_pki_for(other.path(), &[IpAddr::V4(lab.addr("b"))]);
    let refused = fetch(&stranger.ca_cert);
    let _ = server.kill();
    let _ = server.wait();
    assert!(verified, "curl from a did not verify b's certificate");
    assert!(!refused.success(), "a stranger CA verified: {refused}");
}

//! Hosts made of network namespaces, joined by cables that can fail: a
//! "multi-host" cluster on one machine, for tests of what a gateway does
//! when a peer is slow, unreachable or cut off.
//!
//! ```text
//!   host "a"  eth0 ──cable── p0 ┐
//!   host "b"  eth0 ──cable── p1 ┼─ br0   (the switch namespace)
//!   host "c"  eth0 ──cable── p2 ┘
//! ```
//!
//! Every host and the switch is a network namespace of its own, held by an
//! `unshare --net sleep 1800` child this struct owns (as
//! [`Outside`](crate::outside::Outside) does). A host has `lo` and `eth0`,
//! a TAP device made inside it, addressed `198.18.251.(10+i)/24` for the
//! `i`-th host. The switch has a bridge `br0` with one TAP port `p<i>` per
//! host. The cable between `eth0` and `p<i>` is a pair of threads of this
//! process that copy frames and apply the faults
//! ([`Lab::cut`], [`Lab::shape`], [`Lab::isolate`]); it is userspace because
//! the kernel has no `sch_netem`. The TAPs take segmentation and checksum
//! offload, so a TCP burst of up to 64 KiB crosses a cable as one frame,
//! header included, as it would cross a veth: a debug build carries from
//! 0.4 to 1.7 GB/s between two hosts on a busy two-core machine, against
//! about 0.27 GB/s for 1500-byte frames (the test `tcp_between_hosts_*`
//! prints the figure).
//!
//! Nothing leaves the machine and nothing changes in the test's own
//! namespace: the hosts have no default route and no link to it, so a
//! host's `127.0.0.1` is its own loopback. The subnet is fixed (two labs, in
//! one process or two, never share a namespace, so their addresses cannot
//! meet); `.251` is outside the /24s that `Outside` picks.
//!
//! Processes run in a host through [`Lab::launcher`] (a command prefix, as
//! `GatewayOptions::launcher` takes) or [`Lab::command`]; in-process code
//! through [`Lab::run_in`], on a thread that joined the host's namespace
//! (threads it spawns, a tokio runtime's included, inherit it).
//!
//! Dropping the lab stops the cables (their TAP devices go with their
//! descriptors), then kills and reaps every holder by its pid, which removes
//! the namespaces and the bridge. Stop the processes started in a host
//! first (declare the lab before them): a namespace lives as long as a
//! process or a socket is inside it. A test process that dies without
//! unwinding leaves only the `sleep` holders, which end by themselves after
//! 30 minutes.
//!
//! Needs root, `/dev/net/tun`, `unshare`, `nsenter` and `ip`; tests call
//! [`Lab::skip_reason`] first.

mod cable;

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cable::{Cable, Shape, SharedRules, lock};

/// The hosts' /24, in 198.18.0.0/15 (the benchmarking range).
const SUBNET: [u8; 3] = [198, 18, 251];
/// The first host's last octet.
const FIRST_HOST: u8 = 10;
/// How long a holder outlives a test process that died without cleaning up.
const HOLD_SECONDS: &str = "1800";

/// A namespace held by an `unshare --net sleep` child, with a descriptor
/// of it open. Dropping it kills and reaps the child.
struct Holder {
    child: Child,
    ns: OwnedFd,
}

impl Holder {
    fn start() -> Result<Self, String> {
        let mut child = Command::new("unshare")
            .args(["--net", "sleep", HOLD_SECONDS])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("unshare: {err}"))?;
        match Self::open_namespace(&mut child) {
            Ok(ns) => {
                let holder = Self { child, ns };
                holder.quiet_ipv6()?;
                Ok(holder)
            }
            Err(err) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(err)
            }
        }
    }

    /// The child's namespace, once it is no longer the one it was forked
    /// in (this thread's, which may not be the process's).
    fn open_namespace(child: &mut Child) -> Result<OwnedFd, String> {
        let own = std::fs::read_link("/proc/thread-self/ns/net").map_err(|e| e.to_string())?;
        let path = format!("/proc/{}/ns/net", child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(pipe) = child.stderr.as_mut() {
                    let _ = pipe.read_to_string(&mut stderr);
                }
                return Err(format!("unshare --net: {status}: {}", stderr.trim()));
            }
            if std::fs::read_link(&path).is_ok_and(|ns| ns != own) {
                return std::fs::File::open(&path)
                    .map(OwnedFd::from)
                    .map_err(|err| format!("{path}: {err}"));
            }
            if Instant::now() > deadline {
                return Err("unshare did not make a namespace within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `f` on a thread of its own that has joined the namespace (and
    /// ends with `f`); a panic in `f` goes on in the caller.
    fn inside<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        let ns = self.ns.as_raw_fd();
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || {
                // SAFETY: setns on a namespace descriptor we hold open moves
                // only this thread, which ends with the scope.
                if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(f())
            });
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Runs `ip -batch -` inside the namespace (forked from a thread that
    /// has joined it, so the child is there too).
    fn ip(&self, commands: &[String]) -> Result<(), String> {
        let script = commands.join("\n");
        let output = self
            .inside(|| {
                let mut child = Command::new("ip")
                    .args(["-batch", "-"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()?;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(script.as_bytes())?;
                }
                child.wait_with_output()
            })
            .and_then(|output| output)
            .map_err(|err| format!("ip: {err}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip -batch ({}): {}",
                commands.join("; "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Switches IPv6 off for the devices made from now on, so that only
    /// what the test sends crosses the cables (no router solicitations).
    fn quiet_ipv6(&self) -> Result<(), String> {
        self.inside(|| {
            for scope in ["all", "default"] {
                // Absent when the kernel has no IPv6: nothing to quiet.
                let _ =
                    std::fs::write(format!("/proc/sys/net/ipv6/conf/{scope}/disable_ipv6"), "1");
            }
        })
        .map_err(|err| format!("join a namespace: {err}"))
    }

    /// Makes a TAP device `name` in the namespace.
    fn tap(&self, name: &str) -> Result<OwnedFd, String> {
        self.inside(|| open_tap(name))
            .and_then(|tap| tap)
            .map_err(|err| format!("TAP {name}: {err}"))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `struct ifreq` as TUNSETIFF reads it: a name and the flags.
#[repr(C)]
struct TapRequest {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// A non-blocking TAP descriptor for a new device `name` in the calling
/// thread's namespace: Ethernet frames behind a `virtio_net_hdr`
/// (`IFF_VNET_HDR`), with checksum and TCP segmentation offload, so that
/// large TCP writes come out as one frame. The device lives as long as the
/// descriptor.
fn open_tap(name: &str) -> io::Result<OwnedFd> {
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    // SAFETY: opens a device by a NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let tap = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut request = TapRequest {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
        _rest: [0; 22],
    };
    request.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one ifreq-sized struct we own.
    if unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETIFF, &mut request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let offloads = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes its flags by value.
    if unsafe {
        libc::ioctl(
            tap.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(offloads),
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(tap)
}

struct Host {
    name: String,
    addr: Ipv4Addr,
    rules: SharedRules,
    holder: Holder,
}

/// Hosts on a switch, each a network namespace; see the module doc.
pub struct Lab {
    stop: Arc<AtomicBool>,
    cables: Vec<Cable>,
    hosts: Vec<Host>,
    switch: Holder,
}

impl Lab {
    /// Why a lab cannot start here (not root, no `/dev/net/tun`, a tool
    /// missing), for a test to print before it returns; `None` when it can.
    pub fn skip_reason() -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("the lab needs root (network namespaces, TAP devices): skipped".into());
        }
        if !Path::new("/dev/net/tun").exists() {
            return Some("the lab needs root and /dev/net/tun, which is missing: skipped".into());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        for tool in ["unshare", "nsenter", "ip"] {
            if !std::env::split_paths(&path).any(|dir| dir.join(tool).exists()) {
                return Some(format!(
                    "the lab needs root and `{tool}`, which is not on PATH: skipped"
                ));
            }
        }
        None
    }

    /// Starts a switch and one host per name, all cables healthy. The
    /// `i`-th name gets `198.18.251.(10+i)`.
    pub fn start(hosts: &[&str]) -> Result<Self, String> {
        if hosts.is_empty() || hosts.len() > 240 {
            return Err(format!("a lab has 1 to 240 hosts, not {}", hosts.len()));
        }
        for (i, name) in hosts.iter().enumerate() {
            if name.is_empty() || hosts[..i].contains(name) {
                return Err(format!(
                    "host names must be unique and non-empty: {hosts:?}"
                ));
            }
        }
        let switch = Holder::start()?;
        switch.ip(&["link add br0 type bridge".into(), "link set br0 up".into()])?;
        // From here on, dropping the lab undoes whatever was made.
        let mut lab = Self {
            stop: Arc::new(AtomicBool::new(false)),
            cables: Vec::new(),
            hosts: Vec::new(),
            switch,
        };
        for (i, name) in hosts.iter().enumerate() {
            lab.add_host(i, name)?;
        }
        Ok(lab)
    }

    fn add_host(&mut self, index: usize, name: &str) -> Result<(), String> {
        let [a, b, c] = SUBNET;
        let addr = Ipv4Addr::new(a, b, c, FIRST_HOST + index as u8);
        let holder = Holder::start()?;
        let eth0 = holder.tap("eth0");
        let rules = SharedRules::default();
        self.hosts.push(Host {
            name: name.to_owned(),
            addr,
            rules: rules.clone(),
            holder,
        });
        let holder = &self.hosts[index].holder;
        let eth0 = eth0?;
        holder.ip(&[
            "link set lo up".into(),
            format!("addr add {addr}/24 dev eth0"),
            "link set eth0 up".into(),
        ])?;
        let port_name = format!("p{index}");
        let port = self.switch.tap(&port_name)?;
        self.switch.ip(&[
            format!("link set {port_name} master br0"),
            format!("link set {port_name} up"),
        ])?;
        let cable = Cable::start(name, eth0, port, rules, self.stop.clone())
            .map_err(|err| format!("cable of {name}: {err}"))?;
        self.cables.push(cable);
        Ok(())
    }

    fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("the lab has no host {name:?}"))
    }

    /// The host's address on the switch.
    pub fn addr(&self, host: &str) -> Ipv4Addr {
        self.host(host).addr
    }

    /// A command prefix that runs a program in the host's namespace:
    /// `nsenter` joins it and execs the program, so the child's pid is the
    /// program's. Only the network namespace is the host's.
    pub fn launcher(&self, host: &str) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net=/proc/{}/ns/net", self.host(host).holder.pid()),
            "--".into(),
        ]
    }

    /// A command whose child joins the host's namespace before it execs
    /// `program`. The command holds the namespace open until it is dropped.
    pub fn command(&self, host: &str, program: impl AsRef<OsStr>) -> Command {
        let ns = Arc::new(
            self.host(host)
                .holder
                .ns
                .try_clone()
                .expect("duplicate a namespace descriptor"),
        );
        let mut command = Command::new(program);
        // SAFETY: the hook makes one system call (async-signal-safe) on a
        // descriptor the closure keeps open.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        }
        command
    }

    /// Runs `f` on a fresh thread that has joined the host's namespace and
    /// returns its result: sockets it makes (a tokio runtime built there
    /// included) are the host's. Panics when the namespace cannot be joined;
    /// a panic in `f` goes on in the caller.
    pub fn run_in<T: Send>(&self, host: &str, f: impl FnOnce() -> T + Send) -> T {
        self.host(host)
            .holder
            .inside(f)
            .unwrap_or_else(|err| panic!("join the namespace of {host}: {err}"))
    }

    /// A (blocking) listener on `addr` in the host's namespace.
    pub fn listen(&self, host: &str, addr: SocketAddr) -> io::Result<TcpListener> {
        self.run_in(host, || TcpListener::bind(addr))
    }

    /// A connection from the host to `addr`, within `timeout`.
    pub fn connect(
        &self,
        host: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> io::Result<TcpStream> {
        self.run_in(host, || TcpStream::connect_timeout(&addr, timeout))
    }

    /// Drops every frame between `a` and `b`, both ways, silently: a
    /// connect times out, it is not refused. ARP still passes.
    pub fn cut(&self, a: &str, b: &str) {
        self.cut_one_way(a, b);
        self.cut_one_way(b, a);
    }

    /// Drops the frames from `from` to `to` only (on both cables); the
    /// other way still works.
    pub fn cut_one_way(&self, from: &str, to: &str) {
        let (from, to) = (self.host(from), self.host(to));
        lock(&from.rules).outbound.dropped.insert(to.addr);
        lock(&to.rules).inbound.dropped.insert(from.addr);
    }

    /// Undoes [`Lab::cut`] and [`Lab::cut_one_way`] between `a` and `b`
    /// (a shape stays).
    pub fn heal(&self, a: &str, b: &str) {
        let (a, b) = (self.host(a), self.host(b));
        for (host, peer) in [(a, b), (b, a)] {
            let mut rules = lock(&host.rules);
            rules.outbound.dropped.remove(&peer.addr);
            rules.inbound.dropped.remove(&peer.addr);
        }
    }

    /// Delays every frame between `a` and `b` by `delay` (each way, so a
    /// round trip gains twice that) and drops each with probability `loss`
    /// (`0.0..=1.0`), both ways. Order is kept. A frame may be a TCP burst
    /// of up to 64 KiB (segmentation offload), lost as a whole, as netem
    /// would lose it.
    pub fn shape(&self, a: &str, b: &str, delay: Duration, loss: f64) {
        let shape = Shape {
            delay,
            loss: loss.clamp(0.0, 1.0),
        };
        let (a, b) = (self.host(a), self.host(b));
        // Applied where frames leave a host, so each frame meets it once.
        lock(&a.rules).outbound.shaped.insert(b.addr, shape);
        lock(&b.rules).outbound.shaped.insert(a.addr, shape);
    }

    /// Undoes [`Lab::shape`] (frames already delayed still arrive late).
    pub fn unshape(&self, a: &str, b: &str) {
        let (a, b) = (self.host(a), self.host(b));
        lock(&a.rules).outbound.shaped.remove(&b.addr);
        lock(&b.rules).outbound.shaped.remove(&a.addr);
    }

    /// Pulls the host's cable: every frame, ARP included, is dropped both
    /// ways.
    pub fn isolate(&self, host: &str) {
        lock(&self.host(host).rules).isolated = true;
    }

    /// Plugs the cable back in.
    pub fn rejoin(&self, host: &str) {
        lock(&self.host(host).rules).isolated = false;
    }

    /// Every cable healthy again: no cut, no shape, no isolation.
    pub fn heal_all(&self) {
        for host in &self.hosts {
            *lock(&host.rules) = Default::default();
        }
    }

    /// The pids of the processes that hold the namespaces (the switch's
    /// first), all gone once the lab is dropped.
    pub fn holder_pids(&self) -> Vec<u32> {
        std::iter::once(&self.switch)
            .chain(self.hosts.iter().map(|host| &host.holder))
            .map(Holder::pid)
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for cable in &mut self.cables {
            cable.join();
        }
        // The holders go with the fields: hosts, then the switch.
    }
}

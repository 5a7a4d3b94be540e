//! Outbound network access of an isolated sandbox, by its policy.
//!
//! A sandbox's network namespace holds only its loopback: no route leads
//! anywhere. When the sandbox's policy has network rules
//! (`network_policies`), the supervisor gives the namespace user-mode
//! networking: `slirp4netns` makes a `tap0` in it (10.0.2.100/24, gateway
//! 10.0.2.2, DNS forwarder 10.0.2.3) and carries its TCP and UDP out
//! through ordinary sockets of the host. Routes in the namespace say where
//! it may go:
//!
//! - an endpoint host `*` (or empty) allows every destination: the default
//!   route;
//! - an IPv4 address or CIDR allows that network; a name is resolved by the
//!   host when the policy is applied and allows its IPv4 addresses (one
//!   that does not resolve allows nothing, with a warning; ports and the
//!   rule's binaries are not enforced here: addresses only);
//! - whatever is denied wins over both: the host's own addresses (read when
//!   the sandbox starts), link-local addresses (cloud metadata services),
//!   the gateway's addresses, and the networks the gateway names with
//!   `--egress-deny`. They get `prohibit` routes, so a connect fails at
//!   once; slirp4netns runs with `--disable-host-loopback`, so 10.0.2.2
//!   never leads to the host's loopback.
//!
//! Sandbox processes cannot change the routes: they hold no capability in
//! the namespace's user namespace. A policy whose rules all go away stops
//! slirp4netns, and the namespace is back to loopback only. slirp4netns
//! ends with the supervisor (its exit descriptor is ours).

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::net::{Ipv4Addr, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use openshell_proto::sandbox::SandboxPolicy;

/// The tap device slirp4netns makes, and its addresses.
const TAP: &str = "tap0";
const SLIRP_GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// How long slirp4netns may take to configure the namespace.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// Descriptors slirp4netns gets: the namespace, ready and exit pipes.
const NETNS_FD: i32 = 3;
const READY_FD: i32 = 4;
const EXIT_FD: i32 = 5;

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Net {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Net {
    const ANY: Net = Net {
        addr: Ipv4Addr::UNSPECIFIED,
        prefix: 0,
    };

    fn host(addr: Ipv4Addr) -> Self {
        Self { addr, prefix: 32 }
    }

    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        }
    }

    fn overlaps(&self, other: &Net) -> bool {
        let mask = self.mask() & other.mask();
        u32::from(self.addr) & mask == u32::from(other.addr) & mask
    }

    /// `a.b.c.d` or `a.b.c.d/n` (host bits cleared).
    pub fn parse(text: &str) -> Option<Self> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, prefix.parse().ok().filter(|p| *p <= 32)?),
            None => (text, 32),
        };
        let addr: Ipv4Addr = addr.parse().ok()?;
        let net = Net { addr, prefix };
        Some(Net {
            addr: Ipv4Addr::from(u32::from(addr) & net.mask()),
            prefix,
        })
    }
}

impl std::fmt::Display for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Where a policy lets the sandbox go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// Nowhere: loopback only.
    Off,
    /// These networks ([`Net::ANY`]: everywhere not denied).
    To(BTreeSet<Net>),
}

/// What `policy` allows, its names resolved now. A name that does not
/// resolve (to an IPv4 address) allows nothing and is logged: the rest of
/// the policy still applies.
pub fn wanted(policy: Option<&SandboxPolicy>) -> Result<Wanted, String> {
    let Some(policy) = policy.filter(|p| !p.network_policies.is_empty()) else {
        return Ok(Wanted::Off);
    };
    let mut nets = BTreeSet::new();
    let mut unresolved = Vec::new();
    for (name, rule) in &policy.network_policies {
        if rule.endpoints.is_empty() {
            return Err(format!("network policy {} has no endpoints", quote(name)));
        }
        for endpoint in &rule.endpoints {
            let host = endpoint.host.trim();
            if host.is_empty() || host == "*" {
                nets.insert(Net::ANY);
            } else if let Some(net) = Net::parse(host) {
                nets.insert(net);
            } else {
                let port = u16::try_from(endpoint.port).unwrap_or(0);
                let resolved: Vec<Ipv4Addr> = (host, port)
                    .to_socket_addrs()
                    .map(|addrs| {
                        addrs
                            .filter_map(|addr| match addr.ip() {
                                std::net::IpAddr::V4(v4) => Some(v4),
                                std::net::IpAddr::V6(_) => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                if resolved.is_empty() {
                    unresolved.push(quote(host));
                }
                nets.extend(resolved.into_iter().map(Net::host));
            }
        }
    }
    if !unresolved.is_empty() {
        tracing::warn!(
            hosts = unresolved.join(", "),
            "network policy hosts without an IPv4 address (not resolvable now): they allow nothing"
        );
    }
    if nets.contains(&Net::ANY) {
        nets = BTreeSet::from([Net::ANY]);
    }
    if nets.is_empty() {
        return Ok(Wanted::Off);
    }
    Ok(Wanted::To(nets))
}

fn quote(text: &str) -> String {
    let cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

/// One sandbox's outbound access.
pub struct Egress {
    init: Arc<OwnedFd>,
    deny: Vec<Net>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    slirp: Option<Slirp>,
    /// The routes via the tap in force.
    routes: BTreeSet<Net>,
}

struct Slirp {
    child: Child,
    /// Closing it ends slirp4netns.
    _exit: OwnedFd,
}

impl Drop for Slirp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress").field("deny", &self.deny).finish()
    }
}

impl Egress {
    /// The sandbox whose PID 1 is `init`, never reaching `deny` (the
    /// gateway's), the host's own addresses or link-local ones.
    pub fn new(init: Arc<OwnedFd>, deny: &[Net]) -> Self {
        let mut all: Vec<Net> = deny.to_vec();
        all.extend(host_addresses().into_iter().map(Net::host));
        all.push(Net {
            addr: Ipv4Addr::new(169, 254, 0, 0),
            prefix: 16,
        });
        all.sort();
        all.dedup();
        Self {
            init,
            deny: all,
            state: Mutex::new(State::default()),
        }
    }

    /// Makes the namespace's routes what `wanted` says. Blocking (starting
    /// slirp4netns waits for it, at most [`READY_WITHIN`]).
    pub fn apply(&self, wanted: &Wanted) -> anyhow::Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let nets = match wanted {
            Wanted::Off => {
                // The tap, and every route over it, go with slirp4netns.
                state.slirp = None;
                state.routes.clear();
                return Ok(());
            }
            Wanted::To(nets) => nets,
        };
        for net in nets.iter().filter(|net| **net != Net::ANY) {
            if let Some(denied) = self.deny.iter().find(|d| d.overlaps(net)) {
                bail!(
                    "network policy destination {net} overlaps {denied}, which sandboxes may \
                     never reach (this host's or the gateway's addresses)"
                );
            }
        }
        let netlink = self.netlink()?;
        if state
            .slirp
            .as_mut()
            .is_some_and(|s| !matches!(s.child.try_wait(), Ok(None)))
        {
            state.slirp = None;
            state.routes.clear();
        }
        if state.slirp.is_none() {
            for denied in &self.deny {
                route(&netlink, Change::Prohibit, *denied, 0)
                    .with_context(|| format!("prohibit {denied} in the sandbox"))?;
            }
            state.slirp = Some(self.start_slirp()?);
            // `--configure` set the default route.
            state.routes = BTreeSet::from([Net::ANY]);
        }
        let tap = interface_index(&netlink, TAP)?;
        for gone in state.routes.difference(nets).copied().collect::<Vec<_>>() {
            route(&netlink, Change::Delete, gone, tap)
                .with_context(|| format!("remove the route to {gone}"))?;
            state.routes.remove(&gone);
        }
        for new in nets.difference(&state.routes.clone()) {
            route(&netlink, Change::Add, *new, tap)
                .with_context(|| format!("add a route to {new}"))?;
            state.routes.insert(*new);
        }
        Ok(())
    }

    /// A route netlink socket in the sandbox's namespace.
    fn netlink(&self) -> anyhow::Result<OwnedFd> {
        in_netns(&self.init, || {
            // SAFETY: socket takes plain integers; the result is owned at once.
            let fd = unsafe {
                libc::socket(
                    libc::AF_NETLINK,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
        .context("a netlink socket in the sandbox's network")
    }

    fn start_slirp(&self) -> anyhow::Result<Slirp> {
        let netns = in_netns(&self.init, || {
            std::fs::File::open("/proc/thread-self/ns/net").map(OwnedFd::from)
        })
        .context("the sandbox's network namespace")?;
        let (mut ready_read, ready_write) = pipe()?;
        let (exit_read, exit_write) = pipe()?;
        let mut command = Command::new("slirp4netns");
        command
            .args([
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                "--netns-type=path",
            ])
            .arg(format!("--ready-fd={READY_FD}"))
            .arg(format!("--exit-fd={EXIT_FD}"))
            .arg(format!("/proc/self/fd/{NETNS_FD}"))
            .arg(TAP)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let fds = [
            (netns.as_raw_fd(), NETNS_FD),
            (ready_write.as_raw_fd(), READY_FD),
            (exit_read.as_raw_fd(), EXIT_FD),
        ];
        // SAFETY: the hook only calls fcntl and dup2, which are
        // async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                // Out of the way first, so no target overwrites a source;
                // dup2 then clears close-on-exec on the targets.
                let mut high = [0; 3];
                for (slot, (from, _)) in high.iter_mut().zip(fds) {
                    *slot = libc::fcntl(from, libc::F_DUPFD_CLOEXEC, 64);
                    if *slot < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                for (from, (_, to)) in high.into_iter().zip(fds) {
                    if libc::dup2(from, to) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                bail!("outbound access needs slirp4netns, which this host does not have")
            }
            Err(err) => return Err(err).context("start slirp4netns"),
        };
        drop((ready_write, exit_read, netns));
        // Its stderr is read to the end on a thread of its own (a full pipe
        // would stall slirp4netns); the last line says why a start failed.
        let last_line = Arc::new(Mutex::new(String::new()));
        if let Some(stderr) = child.stderr.take() {
            let last_line = last_line.clone();
            let _ = std::thread::Builder::new()
                .name("slirp4netns-stderr".into())
                .spawn(move || {
                    use std::io::BufRead;
                    for line in io::BufReader::new(stderr).lines().map_while(Result::ok) {
                        if !line.trim().is_empty() {
                            *last_line.lock().unwrap_or_else(|p| p.into_inner()) = line;
                        }
                    }
                });
        }
        let ready = wait_readable(&ready_read, READY_WITHIN)
            .and_then(|()| {
                let mut byte = [0u8; 1];
                ready_read.read(&mut byte)
            })
            .is_ok_and(|n| n == 1);
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            // The reader thread has seen everything once the child is gone.
            std::thread::sleep(Duration::from_millis(50));
            let last = last_line.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let last = if last.is_empty() {
                "no output".into()
            } else {
                quote(&last)
            };
            bail!("slirp4netns did not configure the sandbox's network: {last}");
        }
        Ok(Slirp {
            child,
            _exit: exit_write,
        })
    }
}

/// `deny` and the IPv4 addresses the gateway URL's host has now.
pub fn deny_list(deny: &[Net], gateway_url: &str) -> Vec<Net> {
    let mut all = deny.to_vec();
    let host = gateway_url
        .split_once("://")
        .map_or(gateway_url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host_port = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_owned()
    } else {
        format!("{host}:443")
    };
    if let Ok(addrs) = host_port.to_socket_addrs() {
        for addr in addrs {
            if let std::net::IpAddr::V4(v4) = addr.ip() {
                all.push(Net::host(v4));
            }
        }
    }
    all
}

fn pipe() -> anyhow::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: fresh descriptors, owned once each.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

fn wait_readable(file: &std::fs::File, within: Duration) -> io::Result<()> {
    let mut poll = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one descriptor we hold.
    let n = unsafe { libc::poll(&mut poll, 1, within.as_millis() as i32) };
    match n {
        1 => Ok(()),
        0 => Err(io::Error::from(io::ErrorKind::TimedOut)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Runs `make` on a short-lived thread that joins the network namespace of
/// the sandbox whose PID 1 is `init`; descriptors it makes stay there.
fn in_netns<T: Send + 'static>(
    init: &Arc<OwnedFd>,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let init = init.clone();
    std::thread::Builder::new()
        .name("sandbox-netns".into())
        .spawn(move || {
            // SAFETY: setns on a pidfd we hold moves only this thread.
            if unsafe { libc::setns(init.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            make()
        })?
        .join()
        .map_err(|_| io::Error::other("the sandbox network thread panicked"))?
}

/// The host's own IPv4 addresses (every interface, loopback included).
fn host_addresses() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, walked read-only and freed once.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut at = list;
        while !at.is_null() {
            let addr = (*at).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let v4 = &*(addr as *const libc::sockaddr_in);
                out.push(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)));
            }
            at = (*at).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

#[derive(Clone, Copy)]
enum Change {
    Add,
    Delete,
    Prohibit,
}

/// Adds, removes or prohibits the route to `net` (over interface `oif`,
/// through slirp4netns's gateway) with one netlink request, and reads its
/// acknowledgement.
fn route(netlink: &OwnedFd, change: Change, net: Net, oif: u32) -> io::Result<()> {
    const NLMSG_HDR: usize = 16;
    const RTMSG: usize = 12;
    let (kind, flags, route_type) = match change {
        Change::Add => (
            libc::RTM_NEWROUTE,
            libc::NLM_F_CREATE | libc::NLM_F_REPLACE,
            libc::RTN_UNICAST,
        ),
        Change::Prohibit => (
            libc::RTM_NEWROUTE,
            libc::NLM_F_CREATE | libc::NLM_F_REPLACE,
            libc::RTN_PROHIBIT,
        ),
        Change::Delete => (libc::RTM_DELROUTE, 0, libc::RTN_UNICAST),
    };
    let mut message = vec![0u8; NLMSG_HDR + RTMSG];
    let mut attribute = |kind: u16, value: &[u8]| {
        let len = 4 + value.len();
        message.extend_from_slice(&(len as u16).to_ne_bytes());
        message.extend_from_slice(&kind.to_ne_bytes());
        message.extend_from_slice(value);
        message.resize(message.len().next_multiple_of(4), 0);
    };
    if net.prefix > 0 {
        attribute(libc::RTA_DST, &net.addr.octets());
    }
    if matches!(change, Change::Add) {
        attribute(libc::RTA_GATEWAY, &SLIRP_GATEWAY.octets());
        attribute(libc::RTA_OIF, &oif.to_ne_bytes());
    }
    let total = message.len() as u32;
    message[0..4].copy_from_slice(&total.to_ne_bytes());
    message[4..6].copy_from_slice(&kind.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK | flags) as u16;
    message[6..8].copy_from_slice(&flags.to_ne_bytes());
    message[8..12].copy_from_slice(&1u32.to_ne_bytes());
    let rtmsg = &mut message[NLMSG_HDR..NLMSG_HDR + RTMSG];
    rtmsg[0] = libc::AF_INET as u8;
    rtmsg[1] = net.prefix;
    rtmsg[4] = libc::RT_TABLE_MAIN;
    // A delete matches on what it names: any protocol and scope (the
    // default route slirp4netns made is not ours), the destination only.
    let (protocol, scope) = match change {
        Change::Delete => (libc::RTPROT_UNSPEC, libc::RT_SCOPE_NOWHERE),
        _ => (libc::RTPROT_STATIC, libc::RT_SCOPE_UNIVERSE),
    };
    rtmsg[5] = protocol;
    rtmsg[6] = scope;
    rtmsg[7] = route_type;
    request(netlink, &message).or_else(|err| match (change, err.raw_os_error()) {
        // Already gone.
        (Change::Delete, Some(libc::ESRCH)) => Ok(()),
        _ => Err(err),
    })
}

/// Sends one netlink request and returns its acknowledgement's error.
fn request(netlink: &OwnedFd, message: &[u8]) -> io::Result<()> {
    // SAFETY: send and recv of buffers we own on a socket we hold.
    unsafe {
        if libc::send(
            netlink.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
        ) < 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut answer = [0u8; 1024];
        let n = libc::recv(
            netlink.as_raw_fd(),
            answer.as_mut_ptr().cast(),
            answer.len(),
            0,
        );
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < 20 || u16::from_ne_bytes([answer[4], answer[5]]) != libc::NLMSG_ERROR as u16 {
            return Err(io::Error::other("unexpected netlink answer"));
        }
        let error = i32::from_ne_bytes([answer[16], answer[17], answer[18], answer[19]]);
        if error != 0 {
            return Err(io::Error::from_raw_os_error(-error));
        }
    }
    Ok(())
}

/// The index of interface `name` in the namespace `netlink` belongs to.
fn interface_index(netlink: &OwnedFd, name: &str) -> anyhow::Result<u32> {
    // SIOCGIFINDEX on any socket of the namespace: the netlink one will do.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    // SAFETY: an ioctl filling the ifreq we own.
    let rc = unsafe { libc::ioctl(netlink.as_raw_fd(), libc::SIOCGIFINDEX, &mut request) };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("no {name} in the sandbox"));
    }
    // SAFETY: SIOCGIFINDEX filled the index member.
    Ok(unsafe { request.ifr_ifru.ifru_ifindex } as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openshell_proto::sandbox::{NetworkEndpoint, NetworkPolicyRule};

    fn policy(hosts: &[&str]) -> SandboxPolicy {
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
                            protocol: String::new(),
                        })
                        .collect(),
                    binaries: Vec::new(),
                },
            )]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn networks_parse_and_overlap() {
        let net = Net::parse("198.51.100.7/24").unwrap();
        assert_eq!(net.to_string(), "198.51.100.0/24");
        assert!(net.overlaps(&Net::parse("198.51.100.200").unwrap()));
        assert!(!net.overlaps(&Net::parse("198.51.101.1").unwrap()));
        assert!(Net::ANY.overlaps(&net));
        for bad in ["", "1.2.3", "1.2.3.4/33", "example", "::1"] {
            assert_eq!(Net::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn policies_say_where_to_go() {
        assert_eq!(wanted(None), Ok(Wanted::Off));
        assert_eq!(wanted(Some(&SandboxPolicy::default())), Ok(Wanted::Off));
        let some = wanted(Some(&policy(&["198.51.100.1", "203.0.113.0/24"]))).unwrap();
        assert_eq!(
            some,
            Wanted::To(BTreeSet::from([
                Net::parse("198.51.100.1").unwrap(),
                Net::parse("203.0.113.0/24").unwrap()
            ]))
        );
        let any = wanted(Some(&policy(&["198.51.100.1", "*"]))).unwrap();
        assert_eq!(any, Wanted::To(BTreeSet::from([Net::ANY])));
        // A name that does not resolve allows nothing; the rest applies.
        assert_eq!(
            wanted(Some(&policy(&["no-such-host.invalid"]))),
            Ok(Wanted::Off)
        );
        assert_eq!(
            wanted(Some(&policy(&["no-such-host.invalid", "198.51.100.1"]))),
            Ok(Wanted::To(BTreeSet::from([
                Net::parse("198.51.100.1").unwrap()
            ])))
        );
        assert!(
            wanted(Some(&policy(&[])))
                .unwrap_err()
                .contains("no endpoints")
        );
    }
}

//! A machine "outside" this one, for tests of sandbox egress: a network
//! namespace of its own (kept by a `sleep` process this struct owns),
//! joined to the test's namespace by a veth pair. The outside end holds three
//! addresses, `.1`, `.3` and `.4` of a /24 in 198.18.0.0/15 (the benchmarking
//! range, never routed anywhere real); the test's end holds `.2`. Nothing
//! leaves the machine. Dropping it kills the holder by its pid, which
//! removes the namespace and with it both ends of the pair.
//!
//! Needs root (creating namespaces and links); `ip` from iproute2.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

pub struct Outside {
    holder: Child,
    /// The outside end's first address.
    pub addr: Ipv4Addr,
    /// Its second and third addresses.
    pub other: Ipv4Addr,
    pub spare: Ipv4Addr,
    /// The test's end of the pair.
    pub near: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("ip: {err}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Outside {
    /// A fresh outside machine; its /24 is picked from this process's pid.
    pub fn start() -> Result<Self, String> {
        let holder = Command::new("unshare")
            .args(["--net", "sleep", "600"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|err| format!("unshare: {err}"))?;
        let pid = holder.id();
        let subnet = 18 + (pid % 2) as u8;
        let third = ((pid / 2) % 250) as u8;
        let at = |host| Ipv4Addr::new(198, subnet, third, host);
        let mut outside = Self {
            holder,
            addr: at(1),
            other: at(3),
            spare: at(4),
            near: at(2),
        };
        // The holder must have its namespace before the link can go there.
        let own = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read_link(format!("/proc/{pid}/ns/net"))
            .ok()
            .as_ref()
            == Some(&own)
        {
            if std::time::Instant::now() > deadline {
                return Err("unshare did not make a namespace".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (near, far) = (format!("osn{pid}"), format!("osf{pid}"));
        let pid = pid.to_string();
        let setup = || -> Result<(), String> {
            ip(&[
                "link", "add", &near, "type", "veth", "peer", "name", &far, "netns", &pid,
            ])?;
            ip(&["addr", "add", &format!("{}/24", outside.near), "dev", &near])?;
            ip(&["link", "set", &near, "up"])?;
            let inside = |args: &[&str]| {
                Command::new("nsenter")
                    .args(["-t", &pid, "-n", "ip"])
                    .args(args)
                    .status()
                    .map_err(|e| e.to_string())
                    .and_then(|s| {
                        if s.success() {
                            Ok(())
                        } else {
                            Err(format!(
                                "ip {} in the outside namespace failed",
                                args.join(" ")
                            ))
                        }
                    })
            };
            inside(&["addr", "add", &format!("{}/24", outside.addr), "dev", &far])?;
            inside(&["addr", "add", &format!("{}/24", outside.other), "dev", &far])?;
            inside(&["addr", "add", &format!("{}/24", outside.spare), "dev", &far])?;
            inside(&["link", "set", &far, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
            Ok(())
        };
        if let Err(err) = setup() {
            let _ = outside.holder.kill();
            return Err(err);
        }
        Ok(outside)
    }

    /// A listener in the outside namespace (bound on a thread that joins
    /// it and ends).
    pub fn listen(&self, addr: SocketAddr) -> std::io::Result<TcpListener> {
        let netns = std::fs::File::open(format!("/proc/{}/ns/net", self.holder.id()))?;
        std::thread::spawn(move || {
            // SAFETY: setns moves only this thread, which ends right after.
            if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            TcpListener::bind(addr)
        })
        .join()
        .map_err(|_| std::io::Error::other("bind thread panicked"))?
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

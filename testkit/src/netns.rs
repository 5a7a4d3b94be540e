//! Servers inside a sandbox's network, held by the test.
//!
//! Under `--isolation namespaces` every sandbox has a network namespace of
//! its own, and a forward to `127.0.0.1:PORT` reaches the sandbox's own
//! loopback, not the host's. A test that wants to watch both ends of a
//! forward (count bytes, read slowly, close at a chosen moment) binds its
//! listener *inside* that namespace: [`SandboxNet::bind`] makes the socket on
//! a thread that joins the namespace and ends, so the listener is the
//! sandbox's while the test's own code serves it. [`SandboxNet::spawn`]
//! starts a program there the same way (a benchmark's `iperf3 -s`).
//!
//! The namespace is found from what a process in the sandbox sees: run
//! [`PRINT_NETNS`] there and hand its output to [`SandboxNet::from_link`].
//! Without isolation that output is the test's own namespace, and binding
//! works the same way, so one test runs under either mode.

use std::io;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command};
use std::time::Duration;

/// The command (argv) that prints a process's network namespace, as
/// `net:[INODE]`.
pub const PRINT_NETNS: [&str; 2] = ["readlink", "/proc/self/ns/net"];

/// A sandbox's network namespace, held open.
#[derive(Debug)]
pub struct SandboxNet {
    ns: OwnedFd,
    inode: u64,
}

impl SandboxNet {
    /// The namespace named by `link` (the output of [`PRINT_NETNS`] in the
    /// sandbox): the test's own, or that of a process that holds it (the
    /// sandbox's PID 1 always does). Reading other processes' namespaces
    /// needs root, which isolation needs anyway.
    pub fn from_link(link: &str) -> io::Result<Self> {
        let link = link.trim();
        let inode = link
            .strip_prefix("net:[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|inode| inode.parse::<u64>().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("not a network namespace link: {link:?}"),
                )
            })?;
        let own = std::iter::once("self".to_owned());
        let others = std::fs::read_dir("/proc")?
            .filter_map(Result::ok)
            .map(|entry| entry.file_name())
            .filter(|name| name.as_bytes().iter().all(u8::is_ascii_digit))
            .map(|name| name.to_string_lossy().into_owned());
        for pid in own.chain(others) {
            let path = format!("/proc/{pid}/ns/net");
            match std::fs::read_link(&path) {
                Ok(found) if found.as_os_str().as_bytes() == link.as_bytes() => {}
                _ => continue,
            }
            // The process may have gone, or its pid been reused, since the
            // readlink: the inode of what was opened decides.
            let Ok(file) = std::fs::File::open(&path) else {
                continue;
            };
            let ns = OwnedFd::from(file);
            if inode_of(&ns)? == inode {
                return Ok(Self { ns, inode });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no process holds the network namespace {link}"),
        ))
    }

    /// The namespace's inode, as in `net:[INODE]`.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// Whether this is the test's own network namespace (no isolation).
    pub fn is_own(&self) -> bool {
        std::fs::metadata("/proc/self/ns/net")
            .map(|meta| std::os::unix::fs::MetadataExt::ino(&meta) == self.inode)
            .unwrap_or(false)
    }

    /// A listener on `addr` inside the namespace (non-blocking, so
    /// [`SandboxNet::listen`] can hand it to tokio).
    pub fn bind(&self, addr: impl ToSocketAddrs + Send) -> io::Result<TcpListener> {
        let listener = self.inside(|| TcpListener::bind(addr))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// [`SandboxNet::bind`] as a tokio listener.
    pub fn listen(&self, addr: impl ToSocketAddrs + Send) -> io::Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::from_std(self.bind(addr)?)
    }

    /// A connection from inside the namespace (blocking, within `timeout`):
    /// what a process in the sandbox would get.
    pub fn connect(&self, addr: std::net::SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        self.inside(|| TcpStream::connect_timeout(&addr, timeout))
    }

    /// Starts `command` inside the namespace (forked from a thread that has
    /// joined it): a program of the test's, such as `iperf3 -s`, listening
    /// where the sandbox's forwards arrive. Only the network is the
    /// sandbox's; its user, mount and PID namespaces are not entered.
    pub fn spawn(&self, command: &mut Command) -> io::Result<Child> {
        self.inside(|| command.spawn())
    }

    /// Runs `f` on a thread of its own that has joined the namespace (and
    /// ends with `f`): sockets it makes belong to the namespace.
    fn inside<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let ns = self.ns.as_raw_fd();
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: setns on a namespace descriptor we hold open
                    // moves only this thread, which ends with the scope.
                    if unsafe { libc::setns(ns, libc::CLONE_NEWNET) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    f()
                })
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
        })
    }
}

fn inode_of(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: stat is plain data, valid zeroed.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes one stat struct for a descriptor we own.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.st_ino)
}

/// Serves `listener` as an echo service: each connection gets back what it
/// sent, and a half-close is passed on, until the test ends.
pub fn serve_echo(listener: tokio::net::TcpListener) {
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = conn.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
                let _ = tokio::io::AsyncWriteExt::shutdown(&mut write).await;
            });
        }
    });
}

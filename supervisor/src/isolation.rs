//! Sandbox isolation for the process driver (`--isolation namespaces`).
//!
//! The supervisor itself stays outside the sandbox: it holds the session,
//! the sandbox token and the relays. Only what it spawns for the sandbox
//! enters the sandbox's namespaces, in three steps:
//!
//! 1. At start the supervisor runs a copy of itself as the sandbox's *init*
//!    ([`init`]). While it is still privileged on the host, the init takes a
//!    private mount namespace and hides what the sandbox must not see: a
//!    fresh tmpfs over the gateway's data directory (the store, every other
//!    sandbox), the paths the gateway names with `--hide` (token files, TLS
//!    keys), `/tmp`, `/var/tmp` and `/dev/shm`; the sandbox's own working
//!    directory is bound back at its usual path. Only then does it create the
//!    sandbox's user, mount and PID namespaces, so the hiding mounts arrive
//!    there *locked*: no process of the sandbox can unmount them, not even as
//!    root of a user namespace of its own. Its first child is PID 1 of the
//!    sandbox: it mounts the namespace's own `/proc` and reaps orphans.
//! 2. The supervisor maps one uid and one gid inside the namespace
//!    ([`SANDBOX_ID`]) to an unprivileged host id derived from the sandbox id
//!    ([`host_id`]) and gives the working directory to it.
//! 3. Every exec starts as a small helper ([`enter`]) that joins the init's
//!    namespaces, forks, drops to that uid with no supplementary groups, no
//!    capabilities and `no_new_privs`, and runs the program. The helper stays
//!    outside the PID namespace, waits, and exits the way the program did, so
//!    the supervisor sees the usual exit status and kills the usual process
//!    group.
//!
//! The sandbox also gets a network namespace of its own, holding only its
//! loopback (up) and no route: nothing in it reaches the host's ports (the
//! gateway, the edge, the database, other sandboxes' servers) or beyond. A
//! forward's target is dialed from inside it ([`socket_in`]), so
//! `127.0.0.1:8080` is the sandbox's own port 8080. Every process involved
//! is non-dumpable, so the sandbox cannot ptrace or read the memory,
//! environment or descriptors of the init or the helpers.
//!
//! This needs root (or `CAP_SYS_ADMIN` with `CAP_SETUID`) on the host; the
//! gateway checks before it starts (`--isolation auto|namespaces|none`).

pub mod enter;
pub mod init;

pub(crate) use init::c_path;
pub mod spawner;

use std::ffi::{CString, OsString};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::limits::Cgroup;

/// First argument that runs the binary as a sandbox's init.
pub const INIT_COMMAND: &str = "__sandbox-init";
/// The standalone init binary's file name.
pub const STANDALONE_INIT: &str = "openshell-sandbox-init";
/// First argument that runs the binary as a host's fork server of inits
/// (when the standalone init is missing).
pub const ZYGOTE_COMMAND: &str = "__sandbox-zygote";
/// First argument that runs the binary as an exec helper.
pub const ENTER_COMMAND: &str = "__sandbox-enter";
/// First argument that runs the binary as the SSH server's SFTP server on
/// stdin and stdout, as whoever started it (`--isolation none`).
pub const SFTP_COMMAND: &str = "__sftp-server";
/// First argument that checks whether namespaces are available here (the
/// gateway asks before it starts; exit 0 or the reason on stderr).
pub const CHECK_COMMAND: &str = "__isolation-check";
/// The uid and gid of sandbox processes inside their user namespace.
pub const SANDBOX_ID: u32 = 1000;
/// Host ids of sandboxes: `HOST_ID_BASE + hash(sandbox id) % HOST_ID_SPAN`.
const HOST_ID_BASE: u32 = 200_000;
const HOST_ID_SPAN: u32 = 800_000;

/// How the supervisor runs sandbox processes (`--isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// In the supervisor's own namespaces, as its own user.
    None,
    /// In the sandbox's user, PID, mount and network namespaces (see the
    /// module doc).
    Namespaces,
}

/// The unprivileged host uid (and gid) of a sandbox's processes: stable for
/// a sandbox id, away from the ids of ordinary accounts.
pub fn host_id(sandbox_id: &str) -> u32 {
    // FNV-1a: stable across releases, unlike std's hasher.
    let hash = sandbox_id
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    HOST_ID_BASE + (hash % u64::from(HOST_ID_SPAN)) as u32
}

/// A running sandbox init; exec helpers join its namespaces.
#[derive(Debug)]
pub struct Sandbox {
    /// Host pid of the sandbox's PID 1.
    init_pid: i32,
    /// A pidfd of PID 1: the exec helper enters the sandbox through it, so
    /// a pid reused after PID 1 died can never lead into another process's
    /// namespaces (`setns` on the pidfd of a dead process fails).
    init_pidfd: Option<Arc<OwnedFd>>,
    /// The init's parent, which created the namespaces.
    outer: Outer,
}

/// How the init's parent is held.
#[derive(Debug)]
enum Outer {
    /// Our child (per-sandbox mode): reaped by us.
    Child(Child),
    /// Forked by a host's fork server, which the kernel reaps for: the
    /// parent during the handshake, and once it is done (the parent has
    /// left) PID 1 itself, a child of the fork server too. The pidfd names
    /// it without a pid reuse race.
    Forked { pid: i32, pidfd: OwnedFd },
}

impl Sandbox {
    /// Starts the init for `workdir`, hiding `hide` and the private temp
    /// directories. Blocking; call before the runtime starts.
    /// With `cgroup`, the init joins it before it forks PID 1, so every
    /// process of the sandbox is in it.
    pub fn start(
        sandbox_id: &str,
        workdir: &Path,
        hide: &[PathBuf],
        cgroup: Option<&Cgroup>,
        host_network: bool,
    ) -> anyhow::Result<Self> {
        let id = host_id(sandbox_id);
        give_to(workdir, id).with_context(|| format!("chown {}", workdir.display()))?;
        let exe = std::env::current_exe().context("locate own executable")?;
        let (ours, theirs) = UnixStream::pair().context("socketpair")?;
        let mut command = Command::new(exe);
        command
            .arg(INIT_COMMAND)
            .args(init_args(workdir, hide))
            .args(
                host_network
                    .then_some(["--network", "host"])
                    .into_iter()
                    .flatten(),
            )
            .env_clear()
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null());
        let outer = command.spawn().context("start the sandbox init")?;
        crate::sandbox_processes::track(outer.id() as i32);
        let mut sandbox = Self {
            init_pid: 0,
            init_pidfd: None,
            outer: Outer::Child(outer),
        };
        sandbox.handshake(ours, id, cgroup)?;
        // PID 1 is the init's child, alive until the init reaps it: its pid
        // is its own here.
        sandbox.init_pidfd = Some(Arc::new(
            pidfd_open(sandbox.init_pid).context("pidfd of the sandbox's PID 1")?,
        ));
        Ok(sandbox)
    }

    /// Starts the init for `workdir` as [`Sandbox::start`] does, but as a
    /// child of a fork server (see [`spawner`]): `send` hands the server the
    /// init's arguments and socket. Blocking.
    pub fn start_forked(
        sandbox_id: &str,
        workdir: &Path,
        hide: &[PathBuf],
        cgroup: Option<&Cgroup>,
        send: impl FnOnce(&[OsString], BorrowedFd<'_>) -> std::io::Result<()>,
    ) -> anyhow::Result<Self> {
        let id = host_id(sandbox_id);
        give_to(workdir, id).with_context(|| format!("chown {}", workdir.display()))?;
        let (ours, theirs) = UnixStream::pair().context("socketpair")?;
        send(&init_args(workdir, hide), theirs.as_fd()).context("start the sandbox init")?;
        drop(theirs);
        let mut reader = BufReader::new(ours.try_clone().context("socketpair")?);
        let pid: i32 = expect_line(&mut reader, "outer")?
            .parse()
            .context("sandbox init sent a bad pid")?;
        // The init is alive (it waits for our `mapped`), so the pid is
        // still its own.
        let pidfd = pidfd_open(pid).context("pidfd of the sandbox init")?;
        let mut sandbox = Self {
            init_pid: 0,
            init_pidfd: None,
            outer: Outer::Forked { pid, pidfd },
        };
        let mut writer = ours;
        sandbox.handshake_with(reader, &mut writer, id, cgroup)?;
        // The init has left; PID 1 (the fork server's child, reaped by the
        // kernel) waits for `watching` before anything can end it, so its
        // pid is still its own here.
        let pidfd = pidfd_open(sandbox.init_pid).context("pidfd of the sandbox's PID 1")?;
        sandbox.init_pidfd = Some(Arc::new(
            pidfd_open(sandbox.init_pid).context("pidfd of the sandbox's PID 1")?,
        ));
        writer.write_all(b"watching\n").context("sandbox init")?;
        sandbox.outer = Outer::Forked {
            pid: sandbox.init_pid,
            pidfd,
        };
        Ok(sandbox)
    }

    /// The id maps, then PID 1's pid.
    fn handshake(
        &mut self,
        socket: UnixStream,
        id: u32,
        cgroup: Option<&Cgroup>,
    ) -> anyhow::Result<()> {
        let reader = BufReader::new(socket.try_clone().context("socketpair")?);
        let mut writer = socket;
        self.handshake_with(reader, &mut writer, id, cgroup)
    }

    fn handshake_with(
        &mut self,
        mut reader: BufReader<UnixStream>,
        writer: &mut UnixStream,
        id: u32,
        cgroup: Option<&Cgroup>,
    ) -> anyhow::Result<()> {
        let outer_pid = self.outer_pid();
        expect_line(&mut reader, "userns")?;
        // The init forks PID 1 only after `mapped`: from here on everything
        // of the sandbox starts inside its group.
        if let Some(cgroup) = cgroup {
            cgroup
                .add(outer_pid)
                .context("move the sandbox init into its cgroup")?;
        }
        for (file, line) in [
            ("uid_map", format!("{SANDBOX_ID} {id} 1\n")),
            ("gid_map", format!("{SANDBOX_ID} {id} 1\n")),
        ] {
            std::fs::write(format!("/proc/{outer_pid}/{file}"), line)
                .with_context(|| format!("write {file} of the sandbox init"))?;
        }
        writer.write_all(b"mapped\n").context("sandbox init")?;
        let pid = expect_line(&mut reader, "pid")?;
        self.init_pid = pid
            .parse()
            .with_context(|| format!("sandbox init sent a bad pid {pid:?}"))?;
        Ok(())
    }

    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// The pidfd of PID 1 (set once the sandbox started) that execs enter
    /// the sandbox through.
    pub fn init_pidfd(&self) -> Arc<OwnedFd> {
        self.init_pidfd
            .clone()
            .expect("a started sandbox has its PID 1's pidfd")
    }

    /// Resolves once the sandbox has ended: the init's parent exited (per
    /// sandbox), or PID 1 did (forked).
    pub async fn exited(&self) {
        let Outer::Forked { pidfd, .. } = &self.outer else {
            return ended(Some(self.outer_pid())).await;
        };
        // A pidfd turns readable when its process exits: no polling.
        let watch = pidfd.try_clone().ok().and_then(|fd| {
            // SAFETY: `fd` is our own duplicate, owned by the AsyncFd and
            // never replaced or closed while it is registered.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
            .ok()
        });
        match watch {
            Some(watch) => {
                let _ = watch.readable().await;
            }
            None => ended(Some(self.outer_pid())).await,
        }
    }

    /// The host pid of the init's parent (forked: of PID 1 once started).
    pub fn outer_pid(&self) -> i32 {
        match &self.outer {
            Outer::Child(child) => child.id() as i32,
            Outer::Forked { pid, .. } => *pid,
        }
    }

    /// Ends every process of the sandbox: killing PID 1 of a PID namespace
    /// kills everything in it. Blocking until the init's parent (forked:
    /// PID 1) is gone.
    pub fn kill(&mut self) {
        match &mut self.outer {
            Outer::Child(child) => {
                // SAFETY: kill(2) has no memory-safety preconditions. PID 1
                // cannot have been reaped (its parent waits for it and is
                // alive until below), so its pid is still its own.
                unsafe {
                    libc::kill(self.init_pid, libc::SIGKILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                crate::sandbox_processes::untrack(child.id() as i32);
            }
            Outer::Forked { pidfd, .. } => {
                kill_by_pidfd(pidfd);
                // SAFETY: poll on a pidfd we own.
                unsafe {
                    let mut poll = libc::pollfd {
                        fd: pidfd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    libc::poll(&mut poll, 1, 5_000);
                }
            }
        }
    }
}

/// A pidfd of `pid`.
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

impl Drop for Sandbox {
    /// A forked sandbox dropped without [`Sandbox::kill`] (its start was
    /// abandoned, or its task went away) takes its PID 1, and so every
    /// process in it, with it instead of leaving it to the fork server.
    fn drop(&mut self) {
        if let Outer::Forked { pidfd, .. } = &self.outer {
            kill_by_pidfd(pidfd);
        }
    }
}

/// SIGKILL to the process `pidfd` names (no pid reuse race); one already
/// gone just makes the call fail.
fn kill_by_pidfd(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we own, with a null siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// The arguments of an init for `workdir`, hiding `hide` and the private
/// temp directories.
fn init_args(workdir: &Path, hide: &[PathBuf]) -> Vec<OsString> {
    let mut args = vec![OsString::from("--workdir"), workdir.as_os_str().to_owned()];
    for path in hide
        .iter()
        .map(PathBuf::as_path)
        .chain(init::PRIVATE_TMP.map(Path::new))
    {
        args.push("--hide".into());
        args.push(path.as_os_str().to_owned());
    }
    args
}

/// The standalone init binary (`openshell-sandbox-init`) next to this
/// executable, if there is one.
pub fn standalone_init() -> Option<PathBuf> {
    let path = std::env::current_exe()
        .ok()?
        .with_file_name(STANDALONE_INIT);
    path.is_file().then_some(path)
}

/// Resolves once the sandbox init (our child `outer_pid`) has exited;
/// never for `None`.
pub async fn ended(outer_pid: Option<i32>) {
    let Some(pid) = outer_pid else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let alive = state
            .as_deref()
            .and_then(|stat| stat.rsplit_once(')'))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X");
        if !alive {
            return;
        }
    }
}

/// A command that runs `argv` inside the sandbox whose init is `init_pid`,
/// in `cwd` (a path as the sandbox sees it); with `tty`, the program makes
/// its stdin (a pty slave) its controlling terminal. The caller sets
/// environment and stdio.
pub fn enter_command(
    init: &Arc<OwnedFd>,
    argv: &[String],
    cwd: &Path,
    tty: bool,
) -> std::io::Result<tokio::process::Command> {
    let exe = std::env::current_exe()?;
    let mut command = tokio::process::Command::new(exe);
    command.arg(ENTER_COMMAND);
    if tty {
        command.arg(enter::TTY_FLAG);
    }
    let init = pass_init(&mut command, init);
    command
        .arg(init)
        .arg(cwd)
        .args(argv)
        // The helper chdirs inside the sandbox; on the host it starts in a
        // directory that always exists.
        .current_dir("/");
    Ok(command)
}

/// A command that runs the built-in SFTP server inside the sandbox whose
/// init is `init_pid`, in `cwd`, as the sandbox's uid: the exec helper with
/// `--sftp`, which serves SFTP itself where it would exec a program.
pub fn enter_sftp_command(
    init: &Arc<OwnedFd>,
    cwd: &Path,
) -> std::io::Result<tokio::process::Command> {
    let exe = std::env::current_exe()?;
    let mut command = tokio::process::Command::new(exe);
    let init = pass_init(&mut command, init);
    command
        .arg(ENTER_COMMAND)
        .arg(enter::SFTP_FLAG)
        .arg(init)
        .arg(cwd)
        .arg("sftp-server")
        .current_dir("/");
    Ok(command)
}

/// Hands the exec helper PID 1's pidfd: the child keeps it open across exec
/// (same number; nothing else moves, so it cannot clobber a descriptor
/// the spawn itself uses). Returns the number, for the helper's arguments.
fn pass_init(command: &mut tokio::process::Command, init: &Arc<OwnedFd>) -> String {
    let init = init.clone();
    let fd = init.as_raw_fd();
    // SAFETY: the hook only makes an async-signal-safe call (fcntl) on a
    // descriptor the closure keeps open.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(init.as_raw_fd(), libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    fd.to_string()
}

/// Reads one `key value` line from the init; `error ...` lines fail.
fn expect_line(reader: &mut impl BufRead, key: &str) -> anyhow::Result<String> {
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .context("reading from the sandbox init")?;
    let line = line.trim_end();
    if let Some(reason) = line.strip_prefix("error ") {
        bail!("sandbox init: {reason}");
    }
    match line.split_once(' ') {
        Some((k, value)) if k == key => Ok(value.to_owned()),
        _ if line == key => Ok(String::new()),
        _ if line.is_empty() => bail!("sandbox init exited during setup"),
        _ => bail!("sandbox init: unexpected {line:?}"),
    }
}

/// Gives `dir` and everything under it to `id` (not following symlinks),
/// unless `dir` already belongs to it.
fn give_to(dir: &Path, id: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.uid() == id && meta.gid() == id {
        return Ok(());
    }
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        std::os::unix::fs::lchown(&path, Some(id), Some(id))?;
        if std::fs::symlink_metadata(&path)?.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        }
    }
    // The sandbox's home: nobody else on the host reads it.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// Whether this process can create sandboxes in [`Mode::Namespaces`]:
/// privileged on the host, and allowed to make user, mount, PID and network
/// namespaces. The reason when not.
pub fn check_namespaces() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("the gateway does not run as root, so it cannot map sandbox users".into());
    }
    let mut probe = Command::new("/bin/true");
    probe.env_clear();
    // SAFETY: the hook only makes the async-signal-safe unshare call.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut probe, || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 || libc::unshare(init::NAMESPACES) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    match probe.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("namespace probe exited with {status}")),
        Err(err) => Err(format!(
            "cannot create user, mount, PID and network namespaces: {err}"
        )),
    }
}

/// A TCP socket (`domain`: `AF_INET` or `AF_INET6`; non-blocking,
/// close-on-exec) in the network namespace of the sandbox whose PID 1 is
/// `init`: whatever it connects to is the sandbox's, not the host's. Made on
/// a short-lived thread of its own that joins the namespace and ends, so no
/// thread of the supervisor ever runs in a sandbox's network.
pub async fn socket_in(init: &Arc<OwnedFd>, domain: libc::c_int) -> std::io::Result<OwnedFd> {
    let init = init.clone();
    let (done, made) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("sandbox-socket".into())
        .spawn(move || {
            // SAFETY: setns on a pidfd we hold joins only this thread to the
            // namespace; socket takes plain integers and the result is owned
            // at once.
            let made_here = unsafe {
                if libc::setns(init.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    let fd = libc::socket(
                        domain,
                        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        0,
                    );
                    if fd < 0 {
                        Err(std::io::Error::last_os_error())
                    } else {
                        Ok(OwnedFd::from_raw_fd(fd))
                    }
                }
            };
            let _ = done.send(made_here);
        })?;
    made.await
        .map_err(|_| std::io::Error::other("the sandbox socket thread ended early"))?
}

/// Arguments as C strings, for exec.
pub(crate) fn c_args(args: &[OsString]) -> std::io::Result<Vec<CString>> {
    args.iter().map(|a| c_path(a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_stable_and_in_range() {
        let id = host_id("0b1c2d3e-aaaa-bbbb-cccc-000000000001");
        assert_eq!(id, host_id("0b1c2d3e-aaaa-bbbb-cccc-000000000001"));
        assert!((HOST_ID_BASE..HOST_ID_BASE + HOST_ID_SPAN).contains(&id));
        assert_ne!(id, host_id("0b1c2d3e-aaaa-bbbb-cccc-000000000002"));
    }

    #[test]
    fn init_lines_are_parsed_and_errors_reported() {
        let mut input = &b"pid 42\n"[..];
        assert_eq!(expect_line(&mut input, "pid").unwrap(), "42");
        let mut input = &b"userns\n"[..];
        assert_eq!(expect_line(&mut input, "userns").unwrap(), "");
        let mut input = &b"error mount tmpfs on /x: Operation not permitted\n"[..];
        let err = expect_line(&mut input, "pid").unwrap_err().to_string();
        assert!(err.contains("Operation not permitted"), "{err}");
        let mut input = &b""[..];
        assert!(expect_line(&mut input, "pid").is_err());
    }
}

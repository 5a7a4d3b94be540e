//! The sandbox init (`openshell-supervisor __sandbox-init`).
//!
//! Runs single-threaded, before any runtime. Its standard input is a socket
//! to the supervisor, on which it reports progress one line at a time
//! (`userns`, then `pid <N>` once PID 1 exists, or `error <reason>`) and
//! waits for `mapped` after the supervisor wrote the id maps.
//!
//! Exec'd by a per-sandbox supervisor, two processes result: this one
//! (outside the PID namespace; it only waits for PID 1 and goes when it
//! goes) and PID 1 of the sandbox. Forked by a host's fork server, one
//! does: PID 1 is created as the fork server's own child (`CLONE_PARENT`)
//! and this process leaves as soon as it has reported PID 1's pid, so an
//! idle isolated sandbox costs one small process. Every init dies with its
//! parent (`PR_SET_PDEATHSIG`), so a supervisor killed outright takes the
//! whole sandbox with it.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// Paths every sandbox gets a private, empty copy of.
pub const PRIVATE_TMP: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// `path` as a C string (no interior NUL: it came from the OS).
pub fn c_path(path: &std::ffi::OsStr) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

struct Args {
    workdir: PathBuf,
    hide: Vec<PathBuf>,
    /// `--network host` (benchmarks only): every namespace but the network
    /// one, to measure what the network namespace alone costs.
    host_network: bool,
}

fn parse(args: &[OsString]) -> Result<Args, String> {
    let mut workdir = None;
    let mut hide = Vec::new();
    let mut host_network = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = args.next().ok_or("missing value")?;
        match arg.as_bytes() {
            b"--workdir" => workdir = Some(PathBuf::from(value)),
            b"--hide" => hide.push(PathBuf::from(value)),
            b"--network" => match value.as_bytes() {
                b"own" => host_network = false,
                b"host" => host_network = true,
                _ => return Err("--network is own or host".into()),
            },
            _ => return Err("unknown argument".into()),
        }
    }
    let workdir = workdir.ok_or("--workdir is required")?;
    if !workdir.is_absolute() || hide.iter().any(|p| !p.is_absolute()) {
        return Err("paths must be absolute".into());
    }
    Ok(Args {
        workdir,
        hide,
        host_network,
    })
}

/// How PID 1 is related to the process that made the namespaces.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// PID 1 is our child; we stay and wait for it (exec'd by a per-sandbox
    /// supervisor, which reaps us).
    Parent,
    /// PID 1 is our sibling, a child of the fork server that forked us,
    /// which the kernel reaps for; we leave once its pid is reported, and
    /// PID 1 waits for the supervisor's `watching` (its pidfd is open)
    /// before it does anything that could end it.
    Sibling,
}

pub fn main(args: &[OsString], shape: Shape) -> ExitCode {
    // SAFETY: fd 0 is the socket the supervisor passed; nothing else owns it.
    let socket = unsafe { UnixStream::from_raw_fd(0) };
    let mut report = match socket.try_clone() {
        Ok(report) => report,
        Err(_) => return ExitCode::FAILURE,
    };
    let mut replies = BufReader::new(socket);
    match run(args, shape, &mut report, &mut replies) {
        Ok(code) => code,
        Err(reason) => {
            let _ = writeln!(report, "error {}", reason.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn run(
    args: &[OsString],
    shape: Shape,
    report: &mut UnixStream,
    replies: &mut impl BufRead,
) -> Result<ExitCode, String> {
    let args = parse(args)?;
    die_with_parent().map_err(|e| format!("prctl: {e}"))?;
    non_dumpable();
    chdir(Path::new("/"))?;
    hide_paths(&args)?;
    // From here on, the mounts above are locked for the sandbox. The network
    // namespace is new and empty: only its own loopback, brought up below,
    // and no route anywhere else.
    // SAFETY: unshare has no memory-safety preconditions; this process is
    // single-threaded, as CLONE_NEWUSER requires.
    let namespaces = if args.host_network {
        NAMESPACES & !libc::CLONE_NEWNET
    } else {
        NAMESPACES
    };
    if unsafe { libc::unshare(namespaces) } != 0 {
        return Err(format!(
            "unshare user, mount, pid and network namespaces: {}",
            io::Error::last_os_error()
        ));
    }
    writeln!(report, "userns").map_err(|e| e.to_string())?;
    let mut line = String::new();
    replies.read_line(&mut line).map_err(|e| e.to_string())?;
    if line.trim_end() != "mapped" {
        return Err("the supervisor did not map the sandbox ids".into());
    }
    if !args.host_network {
        loopback_up().map_err(|e| format!("bring up the sandbox's loopback: {e}"))?;
    }
    if shape == Shape::Sibling {
        // PID 1 cannot compare pids with its parent (outside its namespace
        // getppid gives 0): it checks this pidfd of the server instead.
        // SAFETY: getppid and pidfd_open take plain integers.
        let server = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getppid(), 0) };
        if server < 0 {
            return Err(format!("pidfd_open: {}", io::Error::last_os_error()));
        }
        let server = server as libc::c_int;
        // SAFETY: a raw clone without a new stack is a fork (the child
        // continues on a copy of this stack), made a child of our parent;
        // this process is single-threaded and the child only makes simple
        // syscalls before it settles into its reap loop.
        let child = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::CLONE_PARENT | libc::SIGCHLD,
                0,
                0,
                0,
                0,
            )
        };
        return match child {
            -1 => Err(format!("clone: {}", io::Error::last_os_error())),
            0 => pid_one(Some(server)),
            child => {
                writeln!(report, "pid {child}").map_err(|e| e.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
        };
    }
    // SAFETY: single-threaded; the child only makes async-signal-safe calls
    // and simple syscalls before it settles into its reap loop.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", io::Error::last_os_error())),
        0 => pid_one(None),
        child => {
            writeln!(report, "pid {child}").map_err(|e| e.to_string())?;
            quiet_stdio();
            Ok(wait_for(child))
        }
    }
}

/// The namespaces a sandbox gets of its own (besides the mount namespace
/// that hides paths first): user, mount, PID and network.
pub const NAMESPACES: libc::c_int =
    libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET;

/// Sets `lo` of this process's (new) network namespace up: a fresh network
/// namespace has it down, so not even the sandbox's own servers would be
/// reachable on 127.0.0.1.
fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes plain integers; the descriptor is closed below.
    let socket = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if socket < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; the name fits (3 bytes with its NUL) and
    // both ioctls read and write only this struct.
    let result = unsafe {
        let mut request: libc::ifreq = std::mem::zeroed();
        for (slot, byte) in request.ifr_name.iter_mut().zip(b"lo\0") {
            *slot = *byte as libc::c_char;
        }
        if libc::ioctl(socket, libc::SIOCGIFFLAGS, &mut request) != 0 {
            Err(io::Error::last_os_error())
        } else {
            request.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(socket, libc::SIOCSIFFLAGS, &request) != 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
    };
    // SAFETY: closing the socket made above.
    unsafe { libc::close(socket) };
    result
}

/// PID 1 of the sandbox: its own `/proc`, then reap orphans forever. A
/// sibling PID 1 (`server`: a pidfd of the fork server, its parent) first
/// makes sure it dies with the server and waits for the supervisor's
/// `watching` on fd 0, so the supervisor holds its pidfd before it can end.
fn pid_one(server: Option<libc::c_int>) -> ! {
    let _ = die_with_parent();
    if let Some(server) = server {
        let mut poll = libc::pollfd {
            fd: server,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads one valid pollfd; a pidfd polls readable once
        // its process has exited.
        let server_gone = unsafe { libc::poll(&mut poll, 1, 0) } != 0;
        if server_gone || !read_watching() {
            // SAFETY: _exit ends this process at once.
            unsafe { libc::_exit(1) };
        }
    }
    let proc_mounted = mount(
        Some("proc"),
        Path::new("/proc"),
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    );
    if let Err(err) = proc_mounted {
        // The exec helper would see the host's processes: refuse to run.
        eprintln!("openshell-supervisor: sandbox init: {err}");
        // SAFETY: _exit ends this process at once.
        unsafe { libc::_exit(1) };
    }
    quiet_stdio();
    exec_reaper();
    // No reaper program: reap here, without the setup's heap.
    close_from(3);
    release_heap();
    reap_forever()
}

/// The reaper program (`reaper/reaper.rs`, built by `build.rs`): what a
/// forked PID 1 becomes once the sandbox is set up.
#[cfg(reaper)]
const REAPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/openshell-sandbox-reaper"));

/// A sealed memory file holding [`REAPER`], made by the fork server when it
/// starts (its forked PID 1s exec it); -1 without one.
static REAPER_FD: AtomicI32 = AtomicI32::new(-1);

/// Puts [`REAPER`] into a sealed, close-on-exec memory file.
#[cfg(reaper)]
fn load_reaper() -> Option<libc::c_int> {
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    /// `MFD_EXEC` (Linux 6.3): executable even where memory files are not
    /// by default (`vm.memfd_noexec`).
    const MFD_EXEC: libc::c_uint = 0x10;
    let name = c"openshell-sandbox-reaper";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create takes a NUL-terminated name and plain flags.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | MFD_EXEC) };
    if fd < 0 {
        // SAFETY: as above; kernels before 6.3 refuse MFD_EXEC.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor we own.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(REAPER).ok()?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor we own, with plain flags.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return None;
    }
    Some(file.into_raw_fd())
}

#[cfg(not(reaper))]
fn load_reaper() -> Option<libc::c_int> {
    None
}

/// Becomes the reaper program (see [`REAPER_FD`]) with no descriptor but
/// the standard three and no environment. Returns only if that failed.
fn exec_reaper() {
    let fd = REAPER_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let argv = [c"openshell-sandbox-reaper".as_ptr(), std::ptr::null()];
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    // SAFETY: descriptor calls on our own descriptors; execveat gets a
    // NUL-terminated empty path and NULL-terminated arrays that outlive
    // the call (it does not return on success).
    unsafe {
        if fd != 3 && libc::dup3(fd, 3, libc::O_CLOEXEC) != 3 {
            return;
        }
        close_from(4);
        libc::syscall(
            libc::SYS_execveat,
            3,
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
}

/// Reaps every exited child, then sleeps until the next `SIGCHLD`: blocked,
/// so one sent between the two stays pending. An idle sandbox's PID 1 wakes
/// only when one of its processes ends. Allocates nothing (see
/// [`release_heap`]).
fn reap_forever() -> ! {
    // SAFETY: sigset_t is plain data, filled and read only by these calls;
    // waitpid writes one int to a valid pointer.
    unsafe {
        let mut chld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        let blocked = libc::sigprocmask(libc::SIG_BLOCK, &chld, std::ptr::null_mut()) == 0;
        loop {
            let mut status = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            if blocked {
                libc::sigwaitinfo(&chld, std::ptr::null_mut());
            } else {
                libc::sleep(1);
            }
        }
    }
}

/// Where the fork server's heap (`[heap]`, the `brk` area malloc grows)
/// starts; 0 when this process did not come from one.
static HEAP_FLOOR: AtomicUsize = AtomicUsize::new(0);

/// The start of this process's `[heap]` mapping, if it has one.
fn heap_start() -> Option<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|line| line.ends_with("[heap]"))?;
    usize::from_str_radix(line.split('-').next()?, 16).ok()
}

/// Gives the kernel back the heap pages a forked PID 1 inherited: what the
/// fork server and the sandbox's setup allocated, none of which PID 1 uses
/// again. Afterwards they read as zeros, so this process must not allocate
/// or free again: [`reap_forever`] does neither. Without it, every idle
/// sandbox would hold the setup's heap (about 20 KiB) as long as it lives.
fn release_heap() {
    let floor = HEAP_FLOOR.load(Ordering::Relaxed);
    // SAFETY: sbrk(0) and sysconf only read.
    let (end, page) = unsafe { (libc::sbrk(0) as usize, libc::sysconf(libc::_SC_PAGESIZE)) };
    if floor == 0 || end == usize::MAX || page <= 0 {
        return;
    }
    let start = floor.next_multiple_of(page as usize);
    if end > start {
        // SAFETY: [start, end) lies in this process's heap, which nothing
        // reads again (above).
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// Reads fd 0 up to the end of its first line: whether it was `watching`.
/// Byte by byte, so nothing after the line is taken from the socket.
fn read_watching() -> bool {
    let mut line = [0_u8; 16];
    let mut len = 0;
    while len < line.len() {
        // SAFETY: reads one byte into a valid buffer.
        let n = unsafe { libc::read(0, line[len..].as_mut_ptr().cast(), 1) };
        if n == 1 {
            if line[len] == b'\n' {
                return &line[..len] == b"watching";
            }
            len += 1;
        } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
    false
}

/// Mounts an empty tmpfs over every path to hide (outermost first; a path
/// under one already hidden is gone anyway), a read-only empty file over
/// files, and binds the working directory back at its own path.
fn hide_paths(args: &Args) -> Result<(), String> {
    // A mount namespace of our own first: nothing below may touch the host's.
    // SAFETY: unshare has no memory-safety preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(format!(
            "unshare mount namespace: {}",
            io::Error::last_os_error()
        ));
    }
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    // Held open across the hiding, so it can be bound back from here.
    let workdir = std::fs::File::open(&args.workdir)
        .map_err(|e| format!("open {}: {e}", args.workdir.display()))?;
    let mut hide = args.hide.clone();
    hide.sort_by_key(|p| p.components().count());
    let mut hidden: Vec<PathBuf> = Vec::new();
    let mut workdir_hidden = false;
    for path in hide {
        if path == Path::new("/") || hidden.iter().any(|h| path.starts_with(h)) {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            let mode = if PRIVATE_TMP.iter().any(|t| path == Path::new(t)) {
                "mode=1777"
            } else {
                "mode=0755"
            };
            mount(
                Some("openshell"),
                &path,
                Some("tmpfs"),
                libc::MS_NOSUID | libc::MS_NODEV,
                Some(&format!("{mode},size=64m")),
            )?;
            workdir_hidden |= args.workdir.starts_with(&path);
        } else {
            mount(Some("/dev/null"), &path, None, libc::MS_BIND, None)?;
        }
        hidden.push(path);
    }
    if workdir_hidden {
        std::fs::create_dir_all(&args.workdir)
            .map_err(|e| format!("mkdir {}: {e}", args.workdir.display()))?;
        let source = format!("/proc/self/fd/{}", workdir.as_raw_fd());
        mount(
            Some(&source),
            &args.workdir,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
    }
    Ok(())
}

fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let describe = |err: io::Error| format!("mount {}: {err}", target.display());
    let cstr = |s: Option<&str>| {
        s.map(|s| std::ffi::CString::new(s).map_err(|_| "NUL in mount argument".to_owned()))
            .transpose()
    };
    let source = cstr(source)?;
    let fstype = cstr(fstype)?;
    let data = cstr(data)?;
    let target = c_path(target.as_os_str()).map_err(describe)?;
    let ptr = |s: &Option<std::ffi::CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is null or a NUL-terminated string that
    // outlives the call.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if rc != 0 {
        return Err(describe(io::Error::last_os_error()));
    }
    Ok(())
}

fn chdir(path: &Path) -> Result<(), String> {
    std::env::set_current_dir(path).map_err(|e| format!("chdir {}: {e}", path.display()))
}

/// Argument of the standalone init that makes it a fork server.
pub const ZYGOTE_FLAG: &str = "--zygote";
/// Largest init request (arguments) a fork server takes.
pub(crate) const REQUEST_MAX: usize = 64 * 1024;

/// The fork server of a supervisor host (`openshell-sandbox-init
/// --zygote`): fd 0 is a `SOCK_SEQPACKET` socket to the host, on which each
/// message is one init's arguments (NUL-separated) with one descriptor
/// attached, the init's socket. For each, a child is forked that becomes
/// that init: it reports `outer <its pid>` on the init's socket, then runs
/// [`main`] as an exec'd init would, except that PID 1 becomes this
/// server's child ([`Shape::Sibling`]). Forked rather than exec'd, the
/// inits of a host share this process's pages instead of each loading the
/// binary again. Children (the forked inits, which leave at once, and the
/// sandboxes' PID 1s) are reaped by the kernel (SIGCHLD ignored); the host
/// watches the PID 1s through pidfds. Ends when the host closes the socket,
/// and with the thread that started it (`PR_SET_PDEATHSIG`), which takes
/// every init with it.
pub fn zygote_main() -> ExitCode {
    if die_with_parent().is_err() {
        return ExitCode::FAILURE;
    }
    non_dumpable();
    HEAP_FLOOR.store(heap_start().unwrap_or(0), Ordering::Relaxed);
    REAPER_FD.store(load_reaper().unwrap_or(-1), Ordering::Relaxed);
    let _ = chdir(Path::new("/"));
    // SAFETY: setting a signal disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
    }
    // Not zeroed: only the pages a request fills are ever touched, so the
    // server (and every init it forks) does not carry 64 KiB of zeros.
    let mut buffer: Vec<u8> = Vec::with_capacity(REQUEST_MAX);
    loop {
        let (len, fd) = match receive(0, &mut buffer) {
            Ok(Some(request)) => request,
            Ok(None) => return ExitCode::SUCCESS,
            Err(_) => return ExitCode::FAILURE,
        };
        let Some(fd) = fd else { continue };
        // SAFETY: this process is single-threaded; the child continues in
        // ordinary code, as an exec'd init would from main.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: plain descriptor and signal calls in the child.
                unsafe {
                    libc::signal(libc::SIGCHLD, libc::SIG_DFL);
                    libc::dup2(fd, 0);
                    libc::close(fd);
                }
                let args: Vec<OsString> = buffer[..len]
                    .split(|b| *b == 0)
                    .filter(|arg| !arg.is_empty())
                    .map(|arg| OsString::from(std::ffi::OsStr::from_bytes(arg)))
                    .collect();
                drop(buffer);
                // SAFETY: fd 0 is the init's socket (dup2 above); this
                // borrow closes nothing (ManuallyDrop).
                let mut report = std::mem::ManuallyDrop::new(unsafe { UnixStream::from_raw_fd(0) });
                // SAFETY: getpid has no preconditions.
                let me = unsafe { libc::getpid() };
                if writeln!(*report, "outer {me}").is_err() {
                    return ExitCode::FAILURE;
                }
                return main(&args, Shape::Sibling);
            }
            // A failed fork closes the init's socket: the host reads the end.
            // SAFETY: closing our copy of the received descriptor.
            _ => unsafe {
                libc::close(fd);
            },
        }
    }
}

/// Sends one request: `payload` and the descriptor `fd`, as one message on
/// a `SOCK_SEQPACKET` socket (what [`receive`] reads).
pub(crate) fn send_request(socket: libc::c_int, payload: &[u8], fd: libc::c_int) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // Room for one descriptor, aligned for cmsghdr.
    let mut control = [0_u64; 8];
    // SAFETY: msghdr is plain data; the pointers set below are valid for
    // their lengths (the kernel only reads the payload), and the cmsg
    // macros stay inside `control`.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&message);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        if libc::sendmsg(socket, &message, libc::MSG_NOSIGNAL) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One message (into `buffer`'s capacity, replacing its contents) and at
/// most one descriptor from a `SOCK_SEQPACKET` socket; `None` at its end.
/// A truncated message comes back empty and without its descriptor.
fn receive(
    socket: libc::c_int,
    buffer: &mut Vec<u8>,
) -> io::Result<Option<(usize, Option<libc::c_int>)>> {
    // Room for one descriptor, aligned for cmsghdr.
    let mut control = [0_u64; 8];
    buffer.clear();
    let room = buffer.spare_capacity_mut();
    let mut iov = libc::iovec {
        iov_base: room.as_mut_ptr().cast(),
        iov_len: room.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty value.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&control) as _;
    loop {
        // SAFETY: every pointer in `message` is valid for its length.
        let n = unsafe { libc::recvmsg(socket, &mut message, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Ok(None);
        }
        // SAFETY: recvmsg wrote the first n bytes of the capacity (at most
        // iov_len).
        unsafe { buffer.set_len(n as usize) };
        let mut fd = None;
        // SAFETY: walking the control buffer the kernel filled, with the
        // libc macros made for it.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&message);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let received =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    match fd {
                        None => fd = Some(received),
                        Some(_) => {
                            libc::close(received);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&message, cmsg);
            }
        }
        // A request cut short (bigger than the buffer, or a descriptor the
        // kernel could not pass) is refused whole: a cut argument list could
        // drop a path the sandbox must not see. Closing the descriptor tells
        // the host that this start failed.
        if message.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            if let Some(fd) = fd {
                // SAFETY: closing the descriptor we just received.
                unsafe { libc::close(fd) };
            }
            buffer.clear();
            return Ok(Some((0, None)));
        }
        return Ok(Some((n as usize, fd)));
    }
}

/// Exits the way `child` did.
fn wait_for(child: libc::pid_t) -> ExitCode {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int to a valid pointer.
        let rc = unsafe { libc::waitpid(child, &mut status, 0) };
        if rc == child {
            return if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return ExitCode::FAILURE;
        }
    }
}

pub(super) fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes plain integers.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// No ptrace, no `/proc/<pid>/mem`, `environ` or `fd` for other processes
/// of the same user.
pub fn non_dumpable() {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0);
    }
}

/// Points stdin, stdout and stderr at `/dev/null`.
pub(super) fn quiet_stdio() {
    // SAFETY: open and dup2 on plain descriptors.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
}

/// Closes every descriptor from `first` up.
pub(crate) fn close_from(first: libc::c_uint) {
    // SAFETY: close_range only closes descriptors.
    unsafe {
        libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(kind: libc::c_int) -> [libc::c_int; 2] {
        let mut fds = [0; 2];
        // SAFETY: socketpair writes two descriptors into the array.
        assert_eq!(
            unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    kind | libc::SOCK_CLOEXEC,
                    0,
                    fds.as_mut_ptr(),
                )
            },
            0
        );
        fds
    }

    /// Whether `fd`'s peer has been closed everywhere (a read sees the end).
    fn peer_closed(fd: libc::c_int) -> bool {
        let mut byte = 0_u8;
        // SAFETY: reads at most one byte into a valid buffer.
        let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_DONTWAIT) };
        n == 0
    }

    #[test]
    fn a_request_that_fits_comes_with_its_descriptor() {
        let [server, host] = pair(libc::SOCK_SEQPACKET);
        let [init_end, host_end] = pair(libc::SOCK_STREAM);
        send_request(host, b"run\0--hide\0/secret\0", init_end).unwrap();
        let mut buffer = Vec::with_capacity(64);
        let (len, fd) = receive(server, &mut buffer).unwrap().unwrap();
        assert_eq!((len, &buffer[..]), (19, &b"run\0--hide\0/secret\0"[..]));
        let fd = fd.expect("the descriptor");
        // SAFETY: closing descriptors this test owns.
        unsafe {
            libc::close(fd);
            libc::close(init_end);
        }
        assert!(peer_closed(host_end));
        for fd in [server, host, host_end] {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn a_truncated_request_is_refused_and_its_descriptor_closed() {
        let [server, host] = pair(libc::SOCK_SEQPACKET);
        let [init_end, host_end] = pair(libc::SOCK_STREAM);
        let long = vec![b'x'; 200];
        send_request(host, &long, init_end).unwrap();
        // SAFETY: the kernel holds its own reference while in flight.
        unsafe { libc::close(init_end) };
        let mut buffer = Vec::with_capacity(16);
        assert_eq!(receive(server, &mut buffer).unwrap(), Some((0, None)));
        assert!(buffer.is_empty());
        // The only copy of the init's end was closed: the host sees the end.
        assert!(peer_closed(host_end));
        for fd in [server, host, host_end] {
            // SAFETY: closing descriptors this test owns.
            unsafe { libc::close(fd) };
        }
    }
}

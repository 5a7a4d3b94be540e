//! The exec helper (`openshell-supervisor __sandbox-enter INIT_FD CWD ARGV...`).
//!
//! Started by the supervisor like any exec (its environment, stdio, process
//! group or pty session are already the program's), it joins the user,
//! mount, PID and network namespaces of the sandbox's PID 1 through the pidfd it
//! inherits as descriptor `INIT_FD` (a pid could have been reused since
//! PID 1 died, a pidfd cannot: a dead PID 1 fails the exec), forks, and
//! the child
//! becomes the program: working directory, sandbox uid and gid, no
//! supplementary groups, no capabilities, `no_new_privs`, then exec. The
//! helper itself stays outside the sandbox's PID namespace (so the sandbox
//! cannot see or signal it), passes termination signals on, waits, and ends
//! the way the program ended, so the supervisor reads the program's status.
//!
//! A program that cannot start is reported like the direct spawn does: a line
//! on stderr and exit 127 (126 when it is there but cannot be executed).

use std::ffi::{CString, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

use super::{SANDBOX_ID, c_args, c_path};

/// The program's pid, for the signal forwarder.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// First argument: the program's stdin is a pty slave it should make its
/// controlling terminal, as the leader of a new session.
pub const TTY_FLAG: &str = "--tty";
/// First argument: serve SFTP on stdin and stdout (the SSH server's
/// subsystem) instead of running a program; ARGV only names it in messages.
pub const SFTP_FLAG: &str = "--sftp";

pub fn main(args: &[OsString]) -> ExitCode {
    super::init::non_dumpable();
    let (tty, sftp, args) = match args.first().and_then(|a| a.to_str()) {
        Some(TTY_FLAG) => (true, false, &args[1..]),
        Some(SFTP_FLAG) => (false, true, &args[1..]),
        _ => (false, false, args),
    };
    let (Some(init_fd), Some(cwd), Some(argv0)) = (args.first(), args.get(1), args.get(2)) else {
        return fail("", "usage: __sandbox-enter INIT_FD CWD ARGV...", 127);
    };
    let argv0_text = String::from_utf8_lossy(argv0.as_bytes()).into_owned();
    let Some(init_fd) = init_fd.to_str().and_then(|p| p.parse::<libc::c_int>().ok()) else {
        return fail(&argv0_text, "bad init descriptor", 127);
    };
    if let Err(err) = join_namespaces(init_fd) {
        return fail(
            &argv0_text,
            format!("cannot enter the sandbox: {}", text(&err)),
            127,
        );
    }
    let (Ok(cwd_c), Ok(argv)) = (c_path(cwd), c_args(&args[2..])) else {
        return fail(&argv0_text, "argument contains NUL", 127);
    };
    // SAFETY: this process is single-threaded (a fresh exec); the child
    // only makes plain syscalls before exec or _exit.
    match unsafe { libc::fork() } {
        -1 => fail(
            &argv0_text,
            format!(
                "cannot enter the sandbox: {}",
                text(&io::Error::last_os_error())
            ),
            127,
        ),
        0 => become_program(&argv0_text, cwd, &cwd_c, &argv, tty, sftp),
        child => {
            CHILD.store(child, Ordering::SeqCst);
            forward_signals();
            super::init::quiet_stdio();
            end_like(child)
        }
    }
}

fn join_namespaces(init_fd: libc::c_int) -> io::Result<()> {
    // One call joins all four at once; it fails (ESRCH) if PID 1 is gone.
    // SAFETY: setns on a descriptor; the kernel checks that it is a pidfd.
    let joined = unsafe { libc::setns(init_fd, super::init::NAMESPACES) };
    let result = if joined == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    // The program must not inherit PID 1's pidfd.
    // SAFETY: closing a descriptor this process owns.
    unsafe { libc::close(init_fd) };
    result
}

/// The child: PID namespace member from birth. Never returns.
fn become_program(
    argv0: &str,
    cwd: &OsString,
    cwd_c: &CString,
    argv: &[CString],
    tty: bool,
    sftp: bool,
) -> ! {
    let _ = super::init::die_with_parent();
    // SAFETY: setsid and ioctl on stdin, a pty slave no session owns yet.
    if tty && unsafe { libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 } {
        let err = io::Error::last_os_error();
        exit_with(argv0, format!("open pty: {}", text(&err)), 127);
    }
    // SAFETY: chdir with a NUL-terminated path.
    if unsafe { libc::chdir(cwd_c.as_ptr()) } != 0 {
        let err = io::Error::last_os_error();
        let reason = format!(
            "working directory {}: {}",
            String::from_utf8_lossy(cwd.as_bytes()),
            text(&err)
        );
        exit_with(argv0, reason, crate::os_error::cannot_run_code(&err));
    }
    // Whatever the supervisor's parents left open stays out of the sandbox.
    super::init::close_from(3);
    if let Err(err) = drop_privileges() {
        exit_with(
            argv0,
            format!("cannot drop privileges: {}", text(&err)),
            127,
        );
    }
    if sftp {
        // Same process, same isolation as any program would have: the
        // sandbox's namespaces, uid, no capabilities, no_new_privs.
        let code = crate::sftp::serve_stdio();
        let _ = io::stdout().flush();
        // SAFETY: _exit ends the forked child without the parent's
        // destructors or atexit handlers.
        unsafe { libc::_exit(i32::from(code)) }
    }
    let err = exec_searching_path(argv);
    exit_with(argv0, text(&err), crate::os_error::cannot_run_code(&err));
}

/// Runs `argv` like a shell does, returning only on failure: a name with a
/// slash as it is, otherwise the first `PATH` entry that has it. Unlike
/// `execvp`, a `PATH` directory the sandbox user may not search (the host's
/// `/root/...` entries, say) counts as not having the program, so a missing
/// program is "not found" (127), and "permission denied" (126) means a file
/// that is there but cannot be run.
fn exec_searching_path(argv: &[CString]) -> io::Error {
    let mut pointers: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    pointers.push(std::ptr::null());
    let run = |program: &CString| {
        // SAFETY: a NUL-terminated path and a NULL-terminated array of
        // NUL-terminated strings that outlive the call.
        unsafe { libc::execv(program.as_ptr(), pointers.as_ptr()) };
        io::Error::last_os_error()
    };
    let name = argv[0].as_bytes();
    if name.contains(&b'/') {
        return run(&argv[0]);
    }
    let path = std::env::var_os("PATH")
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_else(|| b"/usr/local/bin:/usr/bin:/bin".to_vec());
    let mut denied = None;
    for dir in path.split(|b| *b == b':') {
        let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
        let Ok(candidate) = CString::new([dir, b"/", name].concat()) else {
            continue;
        };
        let err = run(&candidate);
        let there = std::fs::metadata(std::ffi::OsStr::from_bytes(candidate.as_bytes())).is_ok();
        match err.raw_os_error() {
            Some(libc::EACCES) if there => denied = Some(err),
            Some(
                libc::EACCES | libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG,
            ) => {}
            _ => return err,
        }
    }
    denied.unwrap_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

fn drop_privileges() -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: plain syscalls on integers (setgroups with an empty list).
    unsafe {
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
        check(libc::setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
        check(clear_capabilities())?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// Empties the effective, permitted and inheritable sets. The uid change
/// alone does not: the sandbox's user namespace was joined with setns,
/// which grants every capability in it, and the kernel clears them on a
/// setuid only when the old uid was that namespace's root, which the
/// host's root is not. A program's execve drops them anyway; the SFTP
/// server (`--sftp`) runs without one, so it would keep them.
///
/// # Safety
/// A raw capset(2); async-signal-safe.
unsafe fn clear_capabilities() -> libc::c_int {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the header and two data structs capset takes for version 3.
    unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int }
}

extern "C" fn pass_on(signal: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(child, signal);
        }
    }
}

/// Termination signals go on to the program; terminal signals reach it
/// directly through the process group, so the helper ignores them.
fn forward_signals() {
    // SAFETY: installing handlers and dispositions; `pass_on` is
    // async-signal-safe.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(signal, pass_on as *const () as libc::sighandler_t);
        }
        for signal in [
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGPIPE,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
}

/// Waits for the program and ends the same way: its exit code, or its
/// signal (without a core dump).
fn end_like(child: libc::pid_t) -> ExitCode {
    let status = loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int to a valid pointer.
        let rc = unsafe { libc::waitpid(child, &mut status, 0) };
        if rc == child {
            break status;
        }
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return ExitCode::from(1);
        }
    };
    if libc::WIFEXITED(status) {
        return ExitCode::from(libc::WEXITSTATUS(status) as u8);
    }
    let signal = libc::WTERMSIG(status);
    // SAFETY: restore the default action and raise the same signal.
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    ExitCode::from((128 + signal) as u8)
}

fn text(err: &io::Error) -> String {
    crate::os_error::describe(err)
}

fn fail(argv0: &str, reason: impl std::fmt::Display, code: u8) -> ExitCode {
    let _ = io::stderr().write_all(crate::os_error::cannot_run_message(argv0, reason).as_bytes());
    ExitCode::from(code)
}

fn exit_with(argv0: &str, reason: impl std::fmt::Display, code: i32) -> ! {
    let _ = io::stderr().write_all(crate::os_error::cannot_run_message(argv0, reason).as_bytes());
    // SAFETY: _exit ends the forked child without running the parent's
    // destructors or atexit handlers.
    unsafe { libc::_exit(code) }
}

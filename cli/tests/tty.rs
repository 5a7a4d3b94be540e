//! `openshell exec -t` driven through a real pty, as a person at a terminal
//! would: typing, a window resize, Ctrl-C and Ctrl-D passed through, the
//! remote exit code as ours, and the terminal's settings restored however
//! the session ends (Ctrl-D, a remote exit, SIGTERM, an error).

mod common;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use nix::pty::{Winsize, openpty};
use nix::sys::termios::{LocalFlags, Termios, tcgetattr};

struct Pty {
    master: std::fs::File,
    slave: OwnedFd,
    seen: Arc<Mutex<Vec<u8>>>,
}

fn winsize(cols: u16, rows: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Pty {
    fn open() -> Self {
        let pair = openpty(Some(&winsize(100, 30)), None).expect("openpty");
        let master = std::fs::File::from(pair.master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once every slave descriptor is closed.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Self {
            master,
            slave: pair.slave,
            seen,
        }
    }

    /// `openshell ARGS` with the pty as its controlling terminal and stdio.
    fn spawn(&self, cli: Cli) -> Child {
        let mut cmd = cli.into_command();
        let fd = || Stdio::from(self.slave.try_clone().unwrap());
        cmd.stdin(fd()).stdout(fd()).stderr(fd());
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() == -1 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().expect("start openshell on the pty")
    }

    fn settings(&self) -> Termios {
        tcgetattr(&self.slave).expect("tcgetattr")
    }

    fn is_raw(&self) -> bool {
        !self.settings().local_flags.contains(LocalFlags::ICANON)
    }

    fn type_in(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Waits (at most `secs`) until the output since `from` contains `text`.
    fn expect(&self, from: usize, text: &str, secs: u64) -> usize {
        let started = Instant::now();
        loop {
            {
                let seen = self.seen.lock().unwrap();
                let tail = String::from_utf8_lossy(&seen[from.min(seen.len())..]).into_owned();
                if let Some(at) = tail.find(text) {
                    return from + at + text.len();
                }
                assert!(
                    started.elapsed() < Duration::from_secs(secs),
                    "{text:?} not seen within {secs} s; output: {tail:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        let size = winsize(cols, rows);
        // SAFETY: TIOCSWINSZ reads one winsize; the kernel then sends
        // SIGWINCH to the terminal's foreground process group.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0);
    }
}

fn same_settings(a: &Termios, b: &Termios) -> bool {
    a.input_flags == b.input_flags
        && a.output_flags == b.output_flags
        && a.local_flags == b.local_flags
        && a.control_flags == b.control_flags
        && a.control_chars == b.control_chars
}

/// Waits for `child` at most `secs`, else kills it by PID and fails.
fn exit_code(child: &mut Child, secs: u64) -> i32 {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            use std::os::unix::process::ExitStatusExt;
            return status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        }
        if started.elapsed() > Duration::from_secs(secs) {
            openshell_testkit::signal(child.id() as i32, libc::SIGKILL);
            let _ = child.wait();
            panic!("openshell still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_raw(pty: &Pty) {
    assert!(
        openshell_testkit::wait_until(Duration::from_secs(30), || pty.is_raw()),
        "the terminal never went raw"
    );
}

#[test]
fn an_interactive_session_through_a_pty_restores_the_terminal() {
    let c = Cluster::start();
    c.create_ready("tty-box");

    let mut pty = Pty::open();
    let before = pty.settings();
    assert!(!pty.is_raw());

    // Type, see the answer.
    let mut child = pty.spawn(c.cli().args(["exec", "-t", "tty-box", "--", "sh"]));
    wait_raw(&pty);
    pty.type_in(b"echo mark-$((6*7))\r");
    let mut at = pty.expect(0, "mark-42", 30);
    // The remote terminal has the size of ours.
    pty.type_in(b"stty size\r");
    at = pty.expect(at, "30 100", 30);
    // A resize follows.
    pty.resize(120, 40);
    std::thread::sleep(Duration::from_millis(300));
    pty.type_in(b"stty size\r");
    at = pty.expect(at, "40 120", 30);
    // Ctrl-C goes to the remote foreground job, not to us.
    pty.type_in(b"sleep 60; echo not-interrupted\r");
    std::thread::sleep(Duration::from_millis(500));
    pty.type_in(b"\x03");
    pty.type_in(b"echo after-$((1+1))\r");
    at = pty.expect(at, "after-2", 20);
    assert!(child.try_wait().unwrap().is_none(), "Ctrl-C ended the CLI");
    // Ctrl-D ends the remote shell, and with it the session.
    pty.type_in(b"\x04");
    assert_eq!(exit_code(&mut child, 30), 0);
    assert!(
        same_settings(&before, &pty.settings()),
        "terminal not restored after Ctrl-D"
    );
    let seen = String::from_utf8_lossy(&pty.seen.lock().unwrap()[at..]).into_owned();
    assert!(!seen.contains("not-interrupted"), "{seen:?}");

    // The remote exit code becomes ours; the terminal comes back.
    let mut child =
        pty.spawn(
            c.cli()
                .args(["exec", "-t", "tty-box", "--", "sh", "-c", "sleep 1; exit 5"]),
        );
    assert_eq!(exit_code(&mut child, 30), 5);
    assert!(
        same_settings(&before, &pty.settings()),
        "terminal not restored after exit 5"
    );

    // SIGTERM in the middle: 128 + 15, terminal restored.
    let mut child = pty.spawn(c.cli().args(["exec", "-t", "tty-box", "--", "sleep", "60"]));
    wait_raw(&pty);
    openshell_testkit::signal(child.id() as i32, libc::SIGTERM);
    assert_eq!(exit_code(&mut child, 30), 143);
    assert!(
        same_settings(&before, &pty.settings()),
        "terminal not restored after SIGTERM"
    );

    // An error after raw mode was entered (no such sandbox): 255, one
    // line, restored.
    let from = pty.seen.lock().unwrap().len();
    let mut child = pty.spawn(c.cli().args(["exec", "-t", "no-such-box", "--", "sh"]));
    assert_eq!(exit_code(&mut child, 30), 255);
    pty.expect(from, "error: not_found: ", 10);
    assert!(
        same_settings(&before, &pty.settings()),
        "terminal not restored after an error"
    );
}

//! The local terminal for `exec -t`: raw mode with a guard that puts the
//! saved settings back however the command ends (return, error, panic
//! unwinding, or a signal the command turns into a return), and the window
//! size.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::termios::{SetArg, Termios, cfmakeraw, tcgetattr, tcsetattr};

use crate::failure::Failure;

/// Whether stdin is a terminal.
pub fn stdin_is_terminal() -> bool {
    std::io::stdin().is_terminal()
}

/// `(cols, rows)` of the terminal on stdout, else stdin; 80x24 when neither
/// says.
pub fn window_size() -> (u32, u32) {
    for fd in [libc::STDOUT_FILENO, libc::STDIN_FILENO] {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer given.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut size) };
        if rc == 0 && size.ws_col > 0 && size.ws_row > 0 {
            return (u32::from(size.ws_col), u32::from(size.ws_row));
        }
    }
    (80, 24)
}

/// Stdin in raw mode until dropped: no echo, no line editing, no signals
/// from Ctrl-C or Ctrl-Z (those bytes go to the remote terminal), no output
/// processing.
pub struct RawMode {
    saved: Termios,
}

impl RawMode {
    pub fn enable() -> Result<Self, Failure> {
        let stdin = std::io::stdin();
        let saved = tcgetattr(stdin.as_fd())
            .map_err(|e| Failure::new("io", format!("reading the terminal settings: {e}")))?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(stdin.as_fd(), SetArg::TCSAFLUSH, &raw)
            .map_err(|e| Failure::new("io", format!("setting raw mode: {e}")))?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // TCSADRAIN: output already written is shown in the mode it was
        // written for.
        let _ = tcsetattr(std::io::stdin().as_fd(), SetArg::TCSADRAIN, &self.saved);
    }
}

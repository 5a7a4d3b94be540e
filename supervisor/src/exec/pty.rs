//! Pseudo-terminals: open a master/slave pair and drive the master
//! asynchronously.
//!
//! Both ends are opened with `O_CLOEXEC` from the start, so a process spawned
//! concurrently by another relay cannot inherit this slave and keep the
//! master from ever seeing EIO.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use nix::fcntl::{FcntlArg, OFlag, fcntl, open};
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
use nix::sys::stat::Mode;
use nix::sys::termios::tcgetattr;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub struct Pty {
    master: Master,
    slave: OwnedFd,
}

impl Pty {
    /// Opens a pty of `cols` x `rows` (0 means 80 x 24).
    pub fn open(cols: u32, rows: u32) -> io::Result<Self> {
        let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let master = posix_openpt(flags)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let name = ptsname_r(&master)?;
        let slave = open(name.as_str(), flags, Mode::empty())?;
        let master: OwnedFd = master.into();
        set_size(&master, cols, rows)?;
        let status = OFlag::from_bits_truncate(fcntl(&master, FcntlArg::F_GETFL)?);
        fcntl(&master, FcntlArg::F_SETFL(status | OFlag::O_NONBLOCK))?;
        // SAFETY: `master` is an open descriptor, owned by the `AsyncFd`
        // and never replaced or closed while it is registered.
        let master = Master(Arc::new(unsafe { AsyncFd::register(master)? }));
        Ok(Self { master, slave })
    }

    /// One more descriptor of the slave, for one of the child's stdio.
    pub fn slave_stdio(&self) -> io::Result<Stdio> {
        Ok(Stdio::from(self.slave.try_clone()?))
    }

    /// Closes the parent's slave descriptor (once the child has its own).
    pub fn into_master(self) -> Master {
        drop(self.slave);
        self.master
    }
}

/// Child side, between fork and exec: new session, pty as controlling
/// terminal (stdin is the slave by then).
pub fn become_session_leader() -> io::Result<()> {
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn set_size(fd: &OwnedFd, cols: u32, rows: u32) -> io::Result<()> {
    let clamp = |value: u32, default: u16| match value {
        0 => default,
        value => value.min(u16::MAX as u32) as u16,
    };
    let size = libc::winsize {
        ws_row: clamp(rows, 24),
        ws_col: clamp(cols, 80),
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ as _, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The master side; clones share one descriptor (reader and writer).
#[derive(Clone)]
pub struct Master(Arc<AsyncFd<OwnedFd>>);

impl Master {
    pub fn resize(&self, cols: u32, rows: u32) -> io::Result<()> {
        set_size(self.0.get_ref(), cols, rows)
    }

    /// The terminal's VEOF character (normally ^D).
    pub fn eof_char(&self) -> u8 {
        tcgetattr(self.0.get_ref())
            .map(|termios| termios.control_chars[libc::VEOF])
            .unwrap_or(0x04)
    }
}

impl AsyncRead for Master {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let fd = &self.0;
        loop {
            let mut guard = ready!(fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Linux: every slave descriptor is closed; that is EOF.
                Ok(Err(err)) if err.raw_os_error() == Some(libc::EIO) => {
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(err)) => return Poll::Ready(Err(err)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let fd = &self.0;
        loop {
            let mut guard = ready!(fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

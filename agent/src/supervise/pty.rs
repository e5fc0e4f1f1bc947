//! A pseudo-terminal for a rank's stderr where toporun's own stderr is a terminal:
//! the rank sees a terminal of the same size (colours, tqdm's bar redrawn in place),
//! and toporun reads what it writes (its last exception) and copies it to its own.

use nix::fcntl::OFlag;
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt, Winsize};
use nix::sys::termios::{self, SetArg};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, Winsize);
nix::ioctl_write_ptr_bad!(set_window_size, nix::libc::TIOCSWINSZ, Winsize);

/// The size of the terminal on toporun's stderr, where it is one.
fn terminal_size() -> Option<Winsize> {
    let mut ws = Winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call.
    let read = unsafe { window_size(nix::libc::STDERR_FILENO, &mut ws) };
    (read.is_ok() && ws.ws_col > 0).then_some(ws)
}

/// A new pseudo-terminal: the end toporun reads, and the one the rank writes to.
/// Both ends are opened close-on-exec (no other process started meanwhile inherits
/// them; the rank gets its end as fd 2). Output passes raw (no `\n` -> `\r\n`: the
/// terminal toporun writes to translates it).
pub fn open() -> std::io::Result<(File, OwnedFd)> {
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname_r(&master)?;
    // std opens every file close-on-exec.
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::libc::O_NOCTTY)
        .open(name)?;
    if let Some(ws) = terminal_size() {
        // SAFETY: TIOCSWINSZ reads one winsize from `ws`, which outlives the call.
        unsafe { set_window_size(slave.as_raw_fd(), &ws) }?;
    }
    let mut raw = termios::tcgetattr(&slave)?;
    termios::cfmakeraw(&mut raw);
    termios::tcsetattr(&slave, SetArg::TCSANOW, &raw)?;
    // SAFETY: the descriptor is the master's own, handed over once.
    let master = unsafe { File::from_raw_fd(master.into_raw_fd()) };
    Ok((master, slave.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// What the rank writes arrives byte for byte (a progress bar's `\r`, a newline
    /// untranslated), its end is a terminal, and the reader sees the end once the
    /// rank's end is closed (Linux says EIO, not 0).
    #[test]
    fn bytes_pass_raw_and_the_end_is_seen() {
        let (mut read, write) = open().expect("a pseudo-terminal");
        assert!(nix::unistd::isatty(&write).unwrap_or(false));
        for fd in [read.as_raw_fd(), write.as_raw_fd()] {
            let flags = nix::fcntl::fcntl(
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
                nix::fcntl::FcntlArg::F_GETFD,
            )
            .unwrap();
            assert_ne!(flags & nix::libc::FD_CLOEXEC, 0, "close-on-exec");
        }
        let mut w = File::from(write);
        w.write_all(b" 50%|#####     |\r100%|##########|\nTraceback\n")
            .unwrap();
        drop(w);
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        loop {
            match read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(got, b" 50%|#####     |\r100%|##########|\nTraceback\n");
    }
}

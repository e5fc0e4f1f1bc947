//! A pseudo-terminal for a rank's stderr where toporun's own stderr is a terminal:
//! the rank sees a terminal of the same size (colours, tqdm's bar redrawn in place),
//! and toporun reads what it writes (its last exception) and copies it to its own.

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::pty::{openpty, Winsize};
use nix::sys::termios::{self, SetArg};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};

nix::ioctl_read_bad!(window_size, nix::libc::TIOCGWINSZ, Winsize);

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
/// Output passes raw (no `\n` -> `\r\n`: the terminal toporun writes to translates
/// it), and neither end leaks into other processes (the rank gets its end as fd 2).
pub fn open() -> std::io::Result<(File, OwnedFd)> {
    let pty = openpty(terminal_size().as_ref(), None)?;
    for fd in [&pty.master, &pty.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    }
    let mut raw = termios::tcgetattr(pty.slave.as_fd())?;
    termios::cfmakeraw(&mut raw);
    termios::tcsetattr(pty.slave.as_fd(), SetArg::TCSANOW, &raw)?;
    Ok((File::from(pty.master), pty.slave))
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

//! Run from a terminal, as most people first run toporun: the ranks still see a
//! terminal (a tqdm bar is drawn in place) and the first cause still names the
//! exception and its line, as it does in a pod.

use crate::support::*;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Runs `cmd` with a new pseudo-terminal as its stderr; its exit code and what the
/// terminal showed, `\r\n` read as `\n`.
fn run_on_terminal(mut cmd: std::process::Command) -> (i32, String) {
    let size = nix::pty::Winsize {
        ws_row: 40,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).expect("a pseudo-terminal");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(pty.slave));
    let mut child = cmd.spawn().expect("toporun starts");
    drop(cmd); // its copy of the terminal's end: the reader sees the end once toporun's is gone
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut shown = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux ends a pseudo-terminal with EIO once no process holds its other end.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            shown.extend_from_slice(&buf[..n]);
        }
        shown
    });
    let deadline = Instant::now() + RUN_DEADLINE;
    let code = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("toporun did not end within {RUN_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let shown = reader.join().expect("the reader");
    (code, String::from_utf8_lossy(&shown).replace("\r\n", "\n"))
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn in_a_terminal_the_cause_names_the_exception_and_a_progress_bar_still_draws() {
    let mut c = toporun();
    c.args(["--standalone", "--nproc-per-node=2", "--nccl-report=off"])
        .arg("fail_rank1.py")
        .env("PYTHON_EXEC", python())
        .current_dir(scripts());
    let (code, shown) = run_on_terminal(c);
    assert_eq!(code, 1, "{shown}");
    let cause = shown
        .lines()
        .find(|l| l.starts_with("toporun: root cause"))
        .unwrap_or_else(|| panic!("no root cause line:\n{shown}"));
    assert!(
        cause.starts_with(
            "toporun: root cause (code): rank 1 raised ValueError: bad batch shape on rank 1 (batch 3) (fail_rank1.py:10)"
        ),
        "{cause}\n{shown}"
    );
    // The rank saw a terminal, and its bar was redrawn in place (`\r`), not a line
    // per update as on a pipe.
    assert!(shown.contains("stderr is a terminal: True"), "{shown}");
    let redraws = shown.matches("\rtrain:").count();
    assert!(redraws >= 2, "{redraws} redraws:\n{shown:?}");
    assert!(!shown.contains("without a Python traceback"), "{shown}");
}

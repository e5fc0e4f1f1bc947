//! Run from a terminal, as most people first run toporun: the ranks still see a
//! terminal (a tqdm bar is drawn in place) and the first cause still names the
//! exception and its line, as it does in a pod.

use crate::support::*;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// What a terminal showed: the bytes, `\r\n` read as `\n`, and when each piece came.
struct Shown {
    text: String,
    pieces: Vec<(Instant, String)>,
}

impl Shown {
    /// When the terminal first showed `needle`.
    fn first(&self, needle: &str) -> Option<Instant> {
        let mut so_far = String::new();
        self.pieces.iter().find_map(|(at, p)| {
            so_far.push_str(p);
            so_far.contains(needle).then_some(*at)
        })
    }
}

/// Runs `cmd` with a new pseudo-terminal as its stderr; its exit code and what the
/// terminal showed.
fn run_on_terminal(mut cmd: std::process::Command) -> (i32, Shown) {
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
        let mut pieces = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux ends a pseudo-terminal with EIO once no process holds its other end.
        while let Ok(n @ 1..) = master.read(&mut buf) {
            let piece = String::from_utf8_lossy(&buf[..n]).replace("\r\n", "\n");
            pieces.push((Instant::now(), piece));
        }
        pieces
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
    let pieces = reader.join().expect("the reader");
    let text = pieces.iter().map(|(_, p)| p.as_str()).collect();
    (code, Shown { text, pieces })
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
    let text = &shown.text;
    assert_eq!(code, 1, "{text}");
    let cause = text
        .lines()
        .find(|l| l.starts_with("toporun: root cause"))
        .unwrap_or_else(|| panic!("no root cause line:\n{text}"));
    assert!(
        cause.starts_with(
            "toporun: root cause (code): rank 1 raised ValueError: bad batch shape on rank 1 (batch 3) (fail_rank1.py:10)"
        ),
        "{cause}\n{text}"
    );
    // The rank saw a terminal, and its bar was redrawn in place (`\r`), not a line
    // per update as on a pipe, as it went: the first frame shows while the rank still
    // works through its batches (0.2 s each), well before its traceback.
    assert!(text.contains("stderr is a terminal: True"), "{text}");
    let redraws = text.matches("\rtrain:").count();
    assert!(redraws >= 2, "{redraws} redraws:\n{text:?}");
    let (bar, traceback) = (shown.first("train:"), shown.first("Traceback"));
    let (bar, traceback) = (bar.expect("a bar"), traceback.expect("a traceback"));
    assert!(
        traceback.duration_since(bar) >= Duration::from_millis(300),
        "the bar came {:?} before the traceback",
        traceback.duration_since(bar)
    );
    assert!(!text.contains("without a Python traceback"), "{text}");
}

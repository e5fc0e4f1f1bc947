//! PyTorch's NCCL watchdog: when a collective outlives the process group's timeout it
//! logs `Watchdog caught collective operation timeout: WorkNCCL(SeqNum=17,
//! OpType=ALLREDUCE, ...) ran for 25012 milliseconds before timing out.` and aborts
//! the rank. The rank it stops waited for a peer: it is the messenger, not the cause.
//! Where NCCL itself failed the collective, the watchdog raises that error instead
//! (`WatchdogError`), and the error is the cause.

use super::nccl_error::{self, NcclError};

/// What the watchdog's line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogTimeout {
    /// The line, trimmed of the rank's log prefix.
    pub line: String,
    pub seq: Option<u64>,
    pub op: Option<String>,
    pub timeout_ms: Option<u64>,
}

pub const MARKER: &str = "Watchdog caught collective operation timeout";

/// `key=value` inside the WorkNCCL(...) of the line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[at..];
    let end = rest.find([',', ')']).unwrap_or(rest.len());
    Some(rest[..end].trim())
}

/// The last watchdog timeout in a rank's output.
pub fn last_timeout(output: &str) -> Option<WatchdogTimeout> {
    let line = output.lines().rev().find(|l| l.contains(MARKER))?;
    let line = &line[line.find(MARKER)?..];
    let line = line.trim_end();
    Some(WatchdogTimeout {
        line: line.chars().take(300).collect(),
        seq: field(line, "SeqNum").and_then(|v| v.parse().ok()),
        op: field(line, "OpType").map(str::to_lowercase),
        timeout_ms: field(line, "Timeout(ms)").and_then(|v| v.parse().ok()),
    })
}

impl WatchdogTimeout {
    /// `all_reduce #17 after 25s`.
    pub fn what(&self) -> String {
        let op = match self.op.as_deref() {
            Some("allreduce") => "all_reduce".to_string(),
            Some(o) => o.to_string(),
            None => "a collective".to_string(),
        };
        let seq = self.seq.map(|s| format!(" #{s}")).unwrap_or_default();
        let after = self
            .timeout_ms
            .map(|t| format!(" after its {}s timeout", t / 1000))
            .unwrap_or_default();
        format!("{op}{seq}{after}")
    }
}

/// torch's watchdog found an NCCL error on a collective, not a timeout: `[Rank 1]
/// Collective WorkNCCL(SeqNum=25, OpType=ALLREDUCE, NumelIn=1, ...) raised the
/// following async exception: NCCL error: invalid usage ..., NCCL version 2.28.9`,
/// then NCCL's class and its `Last error:`; torch then takes the process down
/// (SIGABRT, once its dump is written). Over sockets a collective of other sizes on
/// two ranks ends this way (`message truncated`), where NVLink would hang.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogError {
    pub seq: Option<u64>,
    pub op: Option<String>,
    pub numel: Option<u64>,
    pub error: NcclError,
}

pub const ERROR_MARKER: &str = "raised the following async exception: ";

/// Lines of NCCL's explanation kept after the marker's (its class, `Last error:`,
/// the reason).
const ERROR_LINES: usize = 8;

/// The last NCCL error torch's watchdog raised in a rank's output.
pub fn last_error(output: &str) -> Option<WatchdogError> {
    let lines: Vec<&str> = output.lines().collect();
    let at = lines.iter().rposition(|l| l.contains(ERROR_MARKER))?;
    let line = lines[at];
    let work = &line[..line.find(ERROR_MARKER)?];
    let mut explained = vec![&line[line.find(ERROR_MARKER)? + ERROR_MARKER.len()..]];
    explained.extend(lines[at + 1..].iter().take(ERROR_LINES));
    Some(WatchdogError {
        seq: field(work, "SeqNum").and_then(|v| v.parse().ok()),
        op: field(work, "OpType").map(str::to_lowercase),
        numel: field(work, "NumelIn").and_then(|v| v.parse().ok()),
        error: nccl_error::parse(&explained)?,
    })
}

impl WatchdogError {
    /// `all_reduce #25 (1 element)`.
    pub fn what(&self) -> String {
        let t = WatchdogTimeout {
            line: String::new(),
            seq: self.seq,
            op: self.op.clone(),
            timeout_ms: None,
        };
        match self.numel {
            Some(1) => format!("{} (1 element)", t.what()),
            Some(n) => format!("{} ({n} elements)", t.what()),
            None => t.what(),
        }
    }

    /// `rank 1's NCCL failed all_reduce #25 (1 element): NCCL invalid usage (...);
    /// NCCL's reason: "..."`: how both the live warning and the root cause begin.
    pub fn failed(&self, rank: u32) -> String {
        format!(
            "rank {rank}'s NCCL failed {}: {}",
            self.what(),
            self.error_text()
        )
    }

    /// NCCL's error as said: its reason alone where it saw the collectives differ
    /// (the class's usual meaning, two ranks on one GPU, would mislead).
    pub fn error_text(&self) -> String {
        match self.mismatch() {
            true => self.error.reason_text(),
            false => self.error.text(),
        }
    }

    /// NCCL saw the ranks' collectives differ (a size, an order).
    pub fn mismatch(&self) -> bool {
        let said = self.error.last_error.as_deref().unwrap_or_default();
        said.contains("message truncated") || said.contains("mismatch in collective sizes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As torch 2.11 logged it on 2x H100 (a 25 s process-group timeout).
    const LINE: &str = "[rank0]:[E1125 20:01:02.123456789 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=25000) ran for 25012 milliseconds before timing out.";

    #[test]
    fn the_watchdog_line_gives_the_collective_and_its_timeout() {
        let t = last_timeout(&format!("step 1\n{LINE}\nmore\n")).unwrap();
        assert_eq!(t.seq, Some(17));
        assert_eq!(t.op.as_deref(), Some("allreduce"));
        assert_eq!(t.timeout_ms, Some(25000));
        assert!(t.line.starts_with(MARKER), "{}", t.line);
        assert_eq!(t.what(), "all_reduce #17 after its 25s timeout");
        assert_eq!(last_timeout("Traceback (most recent call last):\n"), None);
    }

    /// As torch 2.11 logged it on one H200, two nodes over sockets, rank 1 having
    /// skipped one gradient all_reduce (16 MiB) while the loss's (4 B) went on
    /// (tests/fixtures/device/cross-node-failures-h200x1/failure-sideskip).
    const ASYNC: &str = "[rank1]:[E1203 09:53:14.697434188 ProcessGroupNCCL.cpp:612] [Rank 1] Collective WorkNCCL(SeqNum=25, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=25000) raised the following async exception: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nNET/Socket : peer 127.0.0.1<44186> message truncated : receiving 1048576 bytes instead of 65536. If you believe your socket network is in a healthy state, there may be a mismatch in collective sizes or environment settings (e.g. NCCL_PROTO, NCCL_ALGO) between ranks\nException raised from checkForNCCLErrorsInternal at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:2770 (most recent call first):\n";

    #[test]
    fn an_nccl_error_the_watchdog_raised_is_read_with_its_collective() {
        let e = last_error(ASYNC).expect("read");
        assert_eq!((e.seq, e.numel), (Some(25), Some(1)));
        assert_eq!(e.what(), "all_reduce #25 (1 element)");
        assert_eq!(e.error.result, nccl_error::NcclResult::InvalidUsage);
        assert!(e.mismatch());
        assert!(e
            .error
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("NET/Socket : peer 127.0.0.1<44186> message truncated"));
        assert_eq!(e.error.version.as_deref(), Some("2.28.9"));
        assert!(last_error("a rank's output without it\n").is_none());
        // A marker with nothing NCCL explains after it is no NCCL error.
        assert!(last_error("x raised the following async exception: boom\n").is_none());
    }
}

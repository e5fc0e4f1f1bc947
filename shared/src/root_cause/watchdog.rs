//! PyTorch's NCCL watchdog: when a collective outlives the process group's timeout it
//! logs `Watchdog caught collective operation timeout: WorkNCCL(SeqNum=17,
//! OpType=ALLREDUCE, ...) ran for 25012 milliseconds before timing out.` and aborts
//! the rank. The rank it stops waited for a peer: it is the messenger, not the cause.

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
}

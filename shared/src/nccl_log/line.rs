//! One line of NCCL's debug output: `HOST:PID:TID [DEV] NCCL INFO|WARN message`, with
//! whatever a launcher or logger put before it (`[default0]:`, timestamps).

/// NCCL's severity of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// A parsed NCCL line; `msg` is everything after `NCCL INFO ` / `NCCL WARN `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<'a> {
    pub host: &'a str,
    pub pid: u32,
    pub dev: Option<u32>,
    pub level: Level,
    pub msg: &'a str,
}

/// Longest line worth reading; NCCL's own lines are far shorter (its buffer is 1 KiB).
pub const MAX_LINE: usize = 4096;

/// None for any line that is not NCCL's (a rank's own output, garbage, binary).
pub fn parse(raw: &str) -> Option<Line<'_>> {
    if raw.len() > MAX_LINE {
        return None;
    }
    let (head, level, msg) = if let Some(i) = raw.find(" NCCL INFO ") {
        (&raw[..i], Level::Info, &raw[i + 11..])
    } else if let Some(i) = raw.find(" NCCL WARN ") {
        (&raw[..i], Level::Warn, &raw[i + 11..])
    } else {
        return None;
    };
    let mut words = head.split_whitespace().rev().peekable();
    // WARN lines put NCCL's source location before the level: `[0] misc/shmutils.cc:87`.
    if words
        .peek()
        .is_some_and(|w| !w.starts_with('[') && w.contains(".c"))
    {
        words.next();
    }
    let mut last = words.next()?;
    let mut dev = None;
    if let Some(d) = last.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        dev = d.parse().ok();
        last = words.next()?;
    }
    // `[default0]:host:pid:tid`: the last three colon-separated fields are NCCL's.
    let mut parts = last.rsplitn(4, ':');
    let _tid = parts.next()?;
    let pid: u32 = parts.next()?.parse().ok()?;
    let host = parts.next()?;
    let host = host
        .rsplit(']')
        .next()
        .unwrap_or(host)
        .trim_start_matches(':');
    if host.is_empty() {
        return None;
    }
    Some(Line {
        host,
        pid,
        dev,
        level,
        msg: msg.trim_end_matches(['\r', '\n']),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_prefixed_and_timestamped_lines() {
        let l = parse("vm:1168:1168 [0] NCCL INFO NCCL version 2.28.9+cuda13.0").unwrap();
        assert_eq!(
            (l.host, l.pid, l.dev, l.level),
            ("vm", 1168, Some(0), Level::Info)
        );
        assert_eq!(l.msg, "NCCL version 2.28.9+cuda13.0");
        let l = parse("[default3]:node-0:195:1185 [3] NCCL WARN Cuda failure 217").unwrap();
        assert_eq!(
            (l.host, l.pid, l.dev, l.level),
            ("node-0", 195, Some(3), Level::Warn)
        );
        let l = parse("vm:1:1 [1] misc/shmutils.cc:87 NCCL WARN Error: failed").unwrap();
        assert_eq!((l.host, l.dev, l.level), ("vm", Some(1), Level::Warn));
        let l = parse("2026-01-01 10:00:00,123 host-a:7:9 [1] NCCL INFO x").unwrap();
        assert_eq!((l.host, l.pid), ("host-a", 7));
        let l = parse("[rank1]:[W1 10:00] pod:7:9 [1] NCCL INFO x").unwrap();
        assert_eq!(l.host, "pod");
    }

    #[test]
    fn foreign_and_broken_lines_are_skipped() {
        for s in [
            "",
            "loss 0.5",
            "NCCL INFO no header",
            " NCCL INFO x",
            "a:b:c [0] NCCL INFO x",
            "\u{0}\u{1}:\u{2} NCCL INFO",
        ] {
            assert!(parse(s).is_none(), "{s:?}");
        }
        assert!(parse(&format!("h:1:1 [0] NCCL INFO {}", "x".repeat(MAX_LINE))).is_none());
    }
}

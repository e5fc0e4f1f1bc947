//! The signal that ended a rank, as the judge tells causes apart by it: parsed once,
//! from its number, where the supervisor reaped the rank.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankSignal {
    /// The kernel's OOM killer, or someone outside the job.
    Kill,
    /// A mapping with nothing behind it: /dev/shm full, or a native fault.
    Bus,
    Segv,
    Fpe,
    Abrt,
    Ill,
    /// Any other (SIGTERM, SIGINT...), by number.
    Other(i32),
}

impl RankSignal {
    /// From Linux's signal number (the same on x86_64 and aarch64).
    pub fn from_number(n: i32) -> RankSignal {
        match n {
            9 => RankSignal::Kill,
            7 => RankSignal::Bus,
            11 => RankSignal::Segv,
            8 => RankSignal::Fpe,
            6 => RankSignal::Abrt,
            4 => RankSignal::Ill,
            n => RankSignal::Other(n),
        }
    }

    /// A crash of the process itself, where faulthandler prints its block.
    pub fn is_crash(self) -> bool {
        matches!(
            self,
            RankSignal::Segv
                | RankSignal::Fpe
                | RankSignal::Abrt
                | RankSignal::Ill
                | RankSignal::Bus
        )
    }
}

impl fmt::Display for RankSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankSignal::Kill => f.write_str("SIGKILL"),
            RankSignal::Bus => f.write_str("SIGBUS"),
            RankSignal::Segv => f.write_str("SIGSEGV"),
            RankSignal::Fpe => f.write_str("SIGFPE"),
            RankSignal::Abrt => f.write_str("SIGABRT"),
            RankSignal::Ill => f.write_str("SIGILL"),
            RankSignal::Other(n) => write!(f, "signal {n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_crashes() {
        let seen: Vec<(String, bool)> = [9, 7, 11, 8, 6, 4, 15]
            .map(RankSignal::from_number)
            .iter()
            .map(|s| (s.to_string(), s.is_crash()))
            .collect();
        let want = [
            ("SIGKILL", false),
            ("SIGBUS", true),
            ("SIGSEGV", true),
            ("SIGFPE", true),
            ("SIGABRT", true),
            ("SIGILL", true),
            ("signal 15", false),
        ];
        assert_eq!(seen, want.map(|(n, c)| (n.to_string(), c)));
    }
}

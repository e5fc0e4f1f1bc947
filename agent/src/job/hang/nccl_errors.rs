//! An NCCL error torch's watchdog raised on a rank, said the moment it shows in the
//! rank's output. torch then holds the rank for its flight-recorder dump before it
//! takes the process down (66 s on one H200, two nodes over sockets): without this
//! line the job stood silent that long, and its end read as a native crash.

use crate::supervise::Tail;
use std::collections::BTreeSet;
use toporun_shared::root_cause::watchdog::{last_error, WatchdogError};

/// The ranks whose NCCL error was said.
#[derive(Debug, Default)]
pub struct NcclErrorsSaid(BTreeSet<u32>);

impl NcclErrorsSaid {
    /// Says each rank's NCCL error not said yet (`tails`: each rank's stderr tail).
    pub fn say_new(&mut self, tails: &[(u32, Tail)]) {
        for (rank, tail) in tails {
            if self.0.contains(rank) || !tail.nccl_error_seen() {
                continue;
            }
            // Its explanation may still be coming: read again at the next sample.
            if let Some(e) = last_error(&tail.text()) {
                crate::console::say_warning!("{}", line(*rank, &e));
                self.0.insert(*rank);
            }
        }
    }
}

/// `rank 1's NCCL failed all_reduce #25 (1 element): NCCL invalid usage (...);
/// NCCL's reason: "...": ...`.
fn line(rank: u32, e: &WatchdogError) -> String {
    let why = match e.mismatch() {
        true => ": the ranks called this collective with other sizes or in another order",
        false => "",
    };
    format!(
        "{}{why}; torch's watchdog takes the process down once its flight-recorder dump is written",
        e.failed(rank)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_rank_the_collective_and_ncclss_reason() {
        let out = "[rank1]:[E1203 ProcessGroupNCCL.cpp:612] [Rank 1] Collective WorkNCCL(SeqNum=25, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=25000) raised the following async exception: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nNET/Socket : peer 127.0.0.1<44186> message truncated : receiving 1048576 bytes instead of 65536.\n";
        let l = line(1, &last_error(out).unwrap());
        assert!(
            l.starts_with("rank 1's NCCL failed all_reduce #25 (1 element): NCCL invalid usage (NCCL 2.28.9); NCCL's reason:"),
            "{l}"
        );
        assert!(
            l.contains("NCCL's reason: \"NET/Socket : peer 127.0.0.1<44186> message truncated"),
            "{l}"
        );
        assert!(
            l.contains(": the ranks called this collective with other sizes or in another order;"),
            "{l}"
        );
    }
}

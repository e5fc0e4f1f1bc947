//! The report of a hang: every rank's stack grouped (the odd ones first), and the
//! rank(s) that stand apart from the rest, which most likely hold them up.

use super::merge::{merge, rank_label, render_placed, Group, Places};
use super::model::RankStack;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Most frames a group's line shows.
const FRAMES_SHOWN: usize = 6;

/// The decided hang, as the node that decides for the job writes it for the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HangNotice {
    /// Counts the job's hangs, so a node prints each once.
    pub seq: u32,
    pub decider: u32,
    pub hang: Hang,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hang {
    pub stalled_secs: f64,
    pub timeout_secs: f64,
    pub groups: Vec<Group>,
    /// The ranks that stand apart from the largest group (empty: none does).
    pub odd: Vec<u32>,
    /// The one-line finding: who most likely holds the others up, or where to look.
    pub headline: String,
}

impl Hang {
    /// The hang of `stacks`, stalled for `stalled`; `places` names nodes (multi-node).
    pub fn of(stacks: &[RankStack], places: &Places, stalled: Duration, timeout: Duration) -> Hang {
        let groups = merge(stacks);
        let (odd, headline) = match groups.as_slice() {
            [odd, .., most] if odd.ranks.len() < most.ranks.len() => {
                let who: Vec<String> = odd.ranks.iter().map(|r| rank_label(*r, places)).collect();
                let (what, where_) = match most.frames.first() {
                    Some(f) => ("wait in", f.function.as_str()),
                    None => ("stand", "elsewhere"),
                };
                let line = format!(
                    "{} {} not where the other {} {what} {where_}: it most likely holds them up",
                    who.join(", "),
                    if who.len() == 1 { "is" } else { "are" },
                    most.ranks.len(),
                );
                (odd.ranks.clone(), line)
            }
            _ => (Vec::new(), "every rank stands at the same place: look for a peer on another node, a dead data-loader worker, or a step longer than --hang-timeout".into()),
        };
        Hang {
            stalled_secs: stalled.as_secs_f64(),
            timeout_secs: timeout.as_secs_f64(),
            groups,
            odd,
            headline,
        }
    }

    /// The report toporun prints: the grouped stacks, then the finding.
    pub fn text(&self, places: &Places) -> String {
        let mut out = format!(
            "toporun: hang: no rank has made progress for {:.0}s (--hang-timeout {:.0}s); where each stands, the odd ones first:\n",
            self.stalled_secs, self.timeout_secs
        );
        out.push_str(&render_placed(&self.groups, FRAMES_SHOWN, places));
        out.push_str(&format!("toporun: hang: {}\n", self.headline));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::merge::Place;
    use super::super::model::{Frame, ThreadStack};
    use super::*;

    fn rank(rank: u32, function: &str) -> RankStack {
        RankStack {
            rank,
            local_rank: rank % 2,
            pid: 1,
            threads: vec![ThreadStack {
                thread: None,
                frames: vec![Frame {
                    function: function.into(),
                    file: "train.py".into(),
                    line: 7,
                }],
                idle: false,
            }],
            error: None,
        }
    }

    fn four(odd: u32) -> Vec<RankStack> {
        (0..4)
            .map(|r| {
                rank(
                    r,
                    if r == odd {
                        "wait_for_data"
                    } else {
                        "all_reduce"
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_report_names_the_odd_rank_and_the_others_call() {
        let secs = Duration::from_secs(10);
        let hang = Hang::of(&four(3), &Places::new(), secs, secs);
        assert_eq!(hang.odd, vec![3]);
        let text = hang.text(&Places::new());
        assert!(
            text.contains("rank 3: wait_for_data (train.py:7)"),
            "{text}"
        );
        assert!(
            text.contains("rank 3 is not where the other 3 wait in all_reduce"),
            "{text}"
        );
    }

    #[test]
    fn on_several_nodes_the_odd_rank_is_placed() {
        let places: Places = (0..4)
            .map(|r| {
                let p = Place {
                    node_rank: r / 2,
                    host: format!("host-{}", r / 2),
                };
                (r, (p, r % 2))
            })
            .collect();
        let secs = Duration::from_secs(10);
        let hang = Hang::of(&four(2), &places, secs, secs);
        let text = hang.text(&places);
        assert!(
            text.contains("  rank 2 (node 1 on host-1, local rank 0): wait_for_data"),
            "{text}"
        );
        assert!(
            hang.headline
                .starts_with("rank 2 (node 1 on host-1, local rank 0) is not where the other 3"),
            "{}",
            hang.headline
        );
    }

    #[test]
    fn ranks_all_alike_point_elsewhere() {
        let stacks: Vec<RankStack> = (0..3).map(|r| rank(r, "all_reduce")).collect();
        let secs = Duration::from_secs(10);
        let hang = Hang::of(&stacks, &Places::new(), secs, secs);
        assert!(hang.odd.is_empty());
        assert!(hang.headline.contains("another node"), "{}", hang.headline);
    }
}

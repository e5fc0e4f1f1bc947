//! The report of a hang: every rank's stack grouped (the odd ones first), and the
//! rank(s) that stand apart from the rest, which most likely hold them up.

use super::activity::Backward;
use super::merge::{merge, rank_label, ranks_text, render_placed, Group, Places};
use super::model::{Frame, RankStack};
use super::standing::{standing_with, Standing};
use crate::root_cause::native_crash::where_sampled;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    /// What made toporun look, where it was not --hang-timeout (NCCL's watchdog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The odd ranks are named outright (a rank that left, stopped, or in no
    /// collective while the others wait): the flight recorder can only confirm it.
    /// Not for a rank apart from a group that all wait (which collective differs is
    /// the dumps' to say).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub named: bool,
}

/// A rank that exited 0 while the others still ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gone {
    pub rank: u32,
    /// Seconds into the attempt.
    pub into_attempt: f64,
}

/// What the node knows besides the stacks: the ranks that left, and the text of each
/// rank's innermost line of code (how `loss.item()` is told from a read).
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub left: Vec<Gone>,
    pub lines: BTreeMap<u32, String>,
    /// Ranks whose process is stopped (SIGSTOP, Ctrl-Z, a debugger): whatever their
    /// stacks say, they run nothing, and the others wait for them.
    pub stopped: Vec<u32>,
    /// Where the ranks run their backward: on their own thread without a GPU (DDP
    /// waits for the gradients' all_reduce inside it), else on the device's.
    pub backward: Backward,
}

impl Context {
    /// Where each readable rank stands, with the frame that says where: its own code
    /// that called a collective (or tears its group down), else its innermost frame.
    pub fn standings(&self, stacks: &[RankStack]) -> Vec<(u32, Standing, String)> {
        stacks
            .iter()
            .filter_map(|s| {
                let t = s.main_thread()?;
                let line = self.lines.get(&s.rank).map(String::as_str);
                let stands = standing_with(t, line, self.backward);
                let at = match stands {
                    Standing::Collective { .. } | Standing::Leaving { .. } => where_sampled(t),
                    _ => t.frames.first().map(Frame::short),
                };
                Some((s.rank, stands, at.unwrap_or_default()))
            })
            .collect()
    }

    /// A rank has left (exited 0, or stands in destroy_process_group) and every other
    /// rank waits for its peers: the hang needs no full timeout.
    pub fn left_while_others_wait(&self, stacks: &[RankStack]) -> bool {
        let stands = self.standings(stacks);
        let (leaving, others): (Vec<_>, Vec<_>) = stands
            .iter()
            .partition(|s| matches!(s.1, Standing::Leaving { .. }));
        let gone = !self.left.is_empty() || !leaving.is_empty();
        gone && !others.is_empty() && others.iter().all(|s| s.1.waits())
    }
}

/// `rank 0 waits on its GPU at .item() in main (train.py:80)`, for at most 3 ranks.
fn standing_text(stands: &[&(u32, Standing, String)], places: &Places) -> String {
    let mut parts: Vec<String> = stands
        .iter()
        .take(3)
        .map(|(r, s, at)| format!("{} {} in {at}", rank_label(*r, places), s.verb()))
        .collect();
    if stands.len() > 3 {
        parts.push(format!("{} more", stands.len() - 3));
    }
    parts.join("; ")
}

/// `rank 1`, `ranks 0-2,5`.
pub(super) fn ranks_word(ranks: &[u32]) -> String {
    let s = if ranks.len() == 1 { "" } else { "s" };
    format!("rank{s} {}", ranks_text(ranks))
}

/// The ranks that left (exited 0, or stand in destroy_process_group), and what the
/// The ranks whose process is stopped lead: no majority is needed to name them.
fn stopped_headline(ctx: &Context, places: &Places) -> Option<(Vec<u32>, String)> {
    if ctx.stopped.is_empty() {
        return None;
    }
    let who: Vec<String> = ctx.stopped.iter().map(|r| rank_label(*r, places)).collect();
    let line = format!(
        "{} {} stopped (process state T: SIGSTOP, Ctrl-Z or a debugger holds it) and runs nothing: the others wait for it; `kill -CONT` its process, or find what stopped it",
        who.join(", "),
        if who.len() == 1 { "is" } else { "are" },
    );
    Some((ctx.stopped.clone(), line))
}

/// others wait for: the hang's first cause. None when no rank left.
fn left_headline(
    ctx: &Context,
    stands: &[(u32, Standing, String)],
    places: &Places,
) -> Option<(Vec<u32>, String)> {
    let (leaving, here): (Vec<_>, Vec<_>) = stands
        .iter()
        .partition(|s| matches!(s.1, Standing::Leaving { .. }));
    let mut parts: Vec<String> = Vec::new();
    let mut gone: Vec<u32> = ctx.left.iter().map(|g| g.rank).collect();
    if !ctx.left.is_empty() {
        let when: Vec<String> = ctx
            .left
            .iter()
            .map(|g| format!("{:.1}s", g.into_attempt))
            .collect();
        parts.push(format!(
            "{} left the job (exit 0 at {} into the attempt)",
            ranks_word(&gone),
            when.join(", ")
        ));
    }
    if !leaving.is_empty() {
        let ranks: Vec<u32> = leaving.iter().map(|s| s.0).collect();
        parts.push(format!(
            "{} left the job ({})",
            ranks_word(&ranks),
            standing_text(&leaving, places)
        ));
        gone.extend(ranks);
    }
    if parts.is_empty() {
        return None;
    }
    let still: Vec<u32> = here.iter().map(|s| s.0).collect();
    let line = format!(
        "{} while {} still needed it: {}",
        parts.join("; "),
        ranks_word(&still),
        standing_text(&here, places)
    );
    Some((gone, line))
}

/// What the waiting ranks do together: `wait in all_reduce`, `wait on their GPU at
/// .item()`, or `wait for their peers` where they differ.
fn together(waiting: &[&(u32, Standing, String)]) -> String {
    match waiting.first().map(|s| &s.1) {
        Some(first) if waiting.iter().all(|s| &s.1 == first) => match first {
            Standing::Collective { op } => format!("wait in {op}"),
            Standing::GpuWait { call } => format!("wait on their GPU at {call}"),
            _ => "wait for their peers".into(),
        },
        _ => "wait for their peers".into(),
    }
}

/// The ranks outside any collective while others wait for their peers: with a
/// majority waiting, `rank 3 is not where the other 3 wait in all_reduce: ...`; with
/// two ranks (no majority), `rank 1 is in no collective: ..., while rank 0 waits ...`.
fn elsewhere_headline(
    stands: &[(u32, Standing, String)],
    places: &Places,
) -> Option<(Vec<u32>, String)> {
    let (waiting, away): (Vec<_>, Vec<_>) = stands.iter().partition(|s| s.1.waits());
    if waiting.is_empty() || away.is_empty() {
        return None;
    }
    let odd: Vec<u32> = away.iter().map(|s| s.0).collect();
    let who: Vec<String> = odd.iter().map(|r| rank_label(*r, places)).collect();
    let is = if odd.len() == 1 { "is" } else { "are" };
    let line = if waiting.len() > away.len() {
        format!(
            "{} {is} not where the other {} {}: {}, in no collective: it most likely holds them up",
            who.join(", "),
            waiting.len(),
            together(&waiting),
            standing_text(&away, places)
        )
    } else {
        format!(
            "{} {is} in no collective: {}, while {}: it most likely holds them up",
            who.join(", "),
            standing_text(&away, places),
            standing_text(&waiting, places)
        )
    };
    Some((odd, line))
}

const SAME_PLACE: &str = "every rank stands at the same place: look for a peer on another node, a dead data-loader worker, or a step longer than --hang-timeout";

/// Every rank waits for its peers, none is elsewhere: the collectives do not match.
fn all_waiting(stands: &[(u32, Standing, String)], places: &Places) -> String {
    let all: Vec<&(u32, Standing, String)> = stands.iter().collect();
    format!(
        "every rank waits for its peers ({}) and none is elsewhere: the collectives they queued do not match, a collective some rank skipped or called with other sizes (the flight recorder tells which), or a peer on another node",
        standing_text(&all, places)
    )
}

impl Hang {
    /// The hang of `stacks`, stalled for `stalled`; `places` names nodes (multi-node).
    pub fn of(stacks: &[RankStack], places: &Places, stalled: Duration, timeout: Duration) -> Hang {
        Hang::with(stacks, places, stalled, timeout, &Context::default())
    }

    /// As `of`, with what the node knows besides the stacks: a rank that left leads;
    /// then ranks outside any collective while others wait for their peers (whatever
    /// the count: with two ranks there is no majority); then the odd group of the
    /// stacks.
    pub fn with(
        stacks: &[RankStack],
        places: &Places,
        stalled: Duration,
        timeout: Duration,
        ctx: &Context,
    ) -> Hang {
        let groups = merge(stacks);
        let stands = ctx.standings(stacks);
        let outright = left_headline(ctx, &stands, places)
            .or_else(|| stopped_headline(ctx, places))
            .or_else(|| elsewhere_headline(&stands, places));
        let named = outright.is_some();
        let (odd, headline) = if let Some(found) = outright {
            found
        } else {
            match groups.as_slice() {
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
                _ if !stands.is_empty() && stands.iter().all(|s| s.1.waits()) => {
                    (Vec::new(), all_waiting(&stands, places))
                }
                [_] => (Vec::new(), SAME_PLACE.into()),
                _ => (Vec::new(), "the ranks stand at different places, none apart from a majority: look for a peer on another node, a dead data-loader worker, or a step longer than --hang-timeout".into()),
            }
        };
        Hang {
            stalled_secs: stalled.as_secs_f64(),
            timeout_secs: timeout.as_secs_f64(),
            groups,
            odd,
            headline,
            trigger: None,
            named,
        }
    }

    /// The hang NCCL's watchdog announced: `victim` was stopped in `what`; the cause is
    /// where the others stand (a rank that left, a rank outside any collective).
    pub fn watchdog(
        stacks: &[RankStack],
        places: &Places,
        victim: u32,
        what: &str,
        ctx: &Context,
    ) -> Hang {
        let mut hang = Hang::with(stacks, places, Duration::ZERO, Duration::ZERO, ctx);
        let culprit = if hang.odd.is_empty() || hang.odd == [victim] {
            hang.named = false;
            "no other rank was seen outside a collective: a collective some rank skipped or called with other sizes (the flight recorder tells which)".to_string()
        } else {
            hang.headline.clone()
        };
        hang.trigger = Some(format!("NCCL's watchdog stopped rank {victim} in {what}"));
        hang.headline = culprit;
        hang
    }

    /// The report toporun prints: the grouped stacks, then the finding.
    pub fn text(&self, places: &Places) -> String {
        let why = match &self.trigger {
            Some(t) => t.clone(),
            None => format!(
                "no rank has made progress for {:.0}s (--hang-timeout {:.0}s)",
                self.stalled_secs, self.timeout_secs
            ),
        };
        let mut out = format!("toporun: hang: {why}; where each stands, the odd ones first:\n");
        out.push_str(&render_placed(&self.groups, FRAMES_SHOWN, places));
        out.push_str(&format!("toporun: hang: {}\n", self.headline));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::merge::Place;
    use super::super::model::build::{main_thread, rank_with};
    use super::super::model::ThreadStack;
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
        // Apart from the group, not known to be outside any collective: the dumps
        // may still tell which collective differs.
        assert!(!hang.named);
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

    const SITE: &str = "/opt/torch/.venv/lib/python3.12/site-packages/";

    fn at(rank: u32, idle: bool, frames: &[(&str, &str, i32)]) -> RankStack {
        rank_with(rank, main_thread(idle, frames))
    }

    const RANK: &str = "/work/scripts/gpu_nccl_failure_rank.py";

    /// Rank 0 spinning in cudaStreamSynchronize under `loss.item()`.
    fn at_item(rank: u32) -> RankStack {
        at(rank, false, &[("main", RANK, 107), ("<module>", RANK, 112)])
    }

    fn item_lines(ranks: &[u32]) -> BTreeMap<u32, String> {
        ranks
            .iter()
            .map(|r| (*r, "        loss.item()".to_string()))
            .collect()
    }

    /// Two ranks, no majority: the one whose process is stopped is named.
    #[test]
    fn a_stopped_rank_leads_without_a_majority() {
        let both = [
            rank_with(
                0,
                main_thread(
                    false,
                    &[("all_reduce", "torch/distributed/distributed_c10d.py", 9)],
                ),
            ),
            rank_with(
                1,
                main_thread(
                    false,
                    &[("all_reduce", "torch/distributed/distributed_c10d.py", 9)],
                ),
            ),
        ];
        let ctx = Context {
            stopped: vec![1],
            ..Default::default()
        };
        let secs = Duration::from_secs(20);
        let h = Hang::with(&both, &Places::new(), secs, secs, &ctx);
        assert_eq!(h.odd, vec![1]);
        assert!(
            h.headline.starts_with("rank 1 is stopped (process state T"),
            "{}",
            h.headline
        );
        let plain = Hang::with(&both, &Places::new(), secs, secs, &Context::default());
        assert!(plain.odd.is_empty(), "without the state: nobody apart");
    }

    #[test]
    fn a_rank_that_left_leads_the_report() {
        let ctx = Context {
            left: vec![Gone {
                rank: 1,
                into_attempt: 12.34,
            }],
            lines: item_lines(&[0]),
            stopped: Vec::new(),
            ..Context::default()
        };
        let secs = Duration::from_secs(5);
        let hang = Hang::with(&[at_item(0)], &Places::new(), secs, secs, &ctx);
        assert_eq!(hang.odd, vec![1]);
        assert_eq!(
            hang.headline,
            "rank 1 left the job (exit 0 at 12.3s into the attempt) while rank 0 still needed it: rank 0 waits on its GPU at .item() in main (gpu_nccl_failure_rank.py:107)"
        );
    }

    #[test]
    fn with_two_ranks_the_one_outside_any_collective_is_odd() {
        let stuck = at(
            1,
            true,
            &[("read_next_shard", RANK, 44), ("main", RANK, 96)],
        );
        let mut lines = item_lines(&[0]);
        lines.insert(1, "    return os.read(r, 1)".into());
        let ctx = Context {
            left: vec![],
            lines,
            stopped: Vec::new(),
            ..Context::default()
        };
        let secs = Duration::from_secs(15);
        let hang = Hang::with(&[at_item(0), stuck], &Places::new(), secs, secs, &ctx);
        assert_eq!(hang.odd, vec![1]);
        assert!(hang.headline.starts_with("rank 1 is in no collective: rank 1 is blocked outside PyTorch (I/O, a lock or a sleep) in read_next_shard (gpu_nccl_failure_rank.py:44), while rank 0 waits on its GPU at .item()"), "{}", hang.headline);
        assert!(!hang.headline.contains("same place"));
        // NCCL's watchdog stopped rank 0: rank 1 is still the cause.
        let w = Hang::watchdog(
            &[at_item(0), at(1, true, &[("read_next_shard", RANK, 44)])],
            &Places::new(),
            0,
            "all_reduce #17 after its 25s timeout",
            &ctx,
        );
        assert!(
            w.headline.starts_with("rank 1 is in no collective"),
            "{}",
            w.headline
        );
        assert!(
            w.headline.ends_with("it most likely holds them up"),
            "{}",
            w.headline
        );
        assert!(w.text(&Places::new()).starts_with("toporun: hang: NCCL's watchdog stopped rank 0 in all_reduce #17 after its 25s timeout; where each stands"));
        // Named outright, both times; but not where the watchdog's victim is the one
        // apart (then the dumps tell which collective).
        assert!(hang.named && w.named);
        let victim = Hang::watchdog(
            &[at_item(0), at(1, true, &[("read_next_shard", RANK, 44)])],
            &Places::new(),
            1,
            "all_reduce #17 after its 25s timeout",
            &ctx,
        );
        assert!(!victim.named, "{}", victim.headline);
    }

    #[test]
    fn every_rank_waiting_at_one_line_is_not_said_to_be_fine() {
        let ctx = Context {
            left: vec![],
            lines: item_lines(&[0, 1]),
            stopped: Vec::new(),
            ..Context::default()
        };
        let secs = Duration::from_secs(15);
        let hang = Hang::with(&[at_item(0), at_item(1)], &Places::new(), secs, secs, &ctx);
        assert!(hang.odd.is_empty() && !hang.named);
        assert!(
            hang.headline
                .starts_with("every rank waits for its peers (rank 0 waits on its GPU at .item()"),
            "{}",
            hang.headline
        );
        assert!(hang
            .headline
            .contains("a collective some rank skipped or called with other sizes"));
        // A collective seen as such counts as waiting too.
        let c10d = format!("{SITE}torch/distributed/distributed_c10d.py");
        let in_ar = at(1, true, &[("all_reduce", &c10d, 2800), ("main", RANK, 100)]);
        let hang = Hang::with(&[at_item(0), in_ar], &Places::new(), secs, secs, &ctx);
        assert!(
            hang.headline.starts_with("every rank waits for its peers"),
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

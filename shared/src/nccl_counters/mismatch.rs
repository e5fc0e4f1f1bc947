//! Ranks that posted different operations under one index of a communicator: a
//! collective skipped or added on some rank, or called with other sizes. NCCL pairs
//! the ranks' operations by their order alone, so every rank posts its operation N
//! and none completes. Each rank's recent operations (kind and bytes, by index) say
//! which ranks left the others' sequence: a majority, or the pattern of the
//! operations before N, says which side is on schedule; where one side's operation N
//! is the other's N+1, the odd side skipped an operation (the shift is its) or added
//! one (the shift is the others'). The shift alone cannot say which side did.

use super::decode::{CommCounters, PostedOp};
use super::func::NcclFunc;
use serde::{Deserialize, Serialize};

/// How many operations before the mismatch a repeating pattern may span.
const MAX_PERIOD: u64 = 3;

/// What the ranks posted at `index`, grouped by kind and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    pub index: u64,
    /// Each group's ranks and their operation, the ones off the others' sequence
    /// first (where that is known: `odd`).
    pub groups: Vec<(Vec<u32>, PostedOp)>,
    /// How the first group is known to be off; None: not known.
    pub odd: Option<OddBy>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OddBy {
    /// Off by a majority or the pattern, and its operation N is the others' N+1: it
    /// skipped their N.
    Skipped,
    /// Off by a majority or the pattern, and its operation N+1 is the others' N: it
    /// added an operation at N.
    Added,
    /// The others are more.
    Majority,
    /// The operations before N repeat a pattern, which the others follow.
    Pattern,
}

type Shape = (NcclFunc, u64);

fn shape(o: &PostedOp) -> Shape {
    (o.func, o.bytes)
}

/// The mismatch at `index` among `members`, where each holds its operation there and
/// they differ in kind or size.
pub fn mismatch(members: &[(u32, &CommCounters)], index: u64) -> Option<Mismatch> {
    let mut groups: Vec<(Vec<u32>, PostedOp)> = Vec::new();
    for (rank, c) in members {
        let op = c.op(index)?;
        match groups.iter_mut().find(|(_, o)| shape(o) == shape(&op)) {
            Some((ranks, _)) => ranks.push(*rank),
            None => groups.push((vec![*rank], op)),
        }
    }
    if groups.len() < 2 {
        return None;
    }
    let off = majority(&groups)
        .map(|g| (g, OddBy::Majority))
        .or_else(|| off_pattern(members, &groups, index).map(|g| (g, OddBy::Pattern)));
    let odd = match (off, skipped(members, &groups, index)) {
        (Some((g, _)), Some(s)) if g == s => Some((g, OddBy::Skipped)),
        (Some((g, _)), Some(_)) if groups.len() == 2 => Some((g, OddBy::Added)),
        (off, _) => off,
    };
    if let Some((g, _)) = odd {
        let first = groups.remove(g);
        groups.insert(0, first);
    }
    Some(Mismatch {
        index,
        groups,
        odd: odd.map(|(_, by)| by),
    })
}

/// The group whose operation N is what every other rank posted as N+1.
fn skipped(
    members: &[(u32, &CommCounters)],
    groups: &[(Vec<u32>, PostedOp)],
    index: u64,
) -> Option<usize> {
    let next = |rank: u32| {
        let c = members.iter().find(|(r, _)| *r == rank)?.1;
        c.op(index + 1).map(|o| shape(&o))
    };
    let found: Vec<usize> = (0..groups.len())
        .filter(|&g| {
            let (ranks, op) = &groups[g];
            let others = members
                .iter()
                .map(|(r, _)| *r)
                .filter(|r| !ranks.contains(r));
            others
                .map(next)
                .collect::<Option<Vec<Shape>>>()
                .is_some_and(|n| n.iter().all(|s| *s == shape(op)))
        })
        .collect();
    (found.len() == 1).then(|| found[0])
}

/// The groups but the largest, where one is larger than every other: the first of
/// the rest (the smallest) leads.
fn majority(groups: &[(Vec<u32>, PostedOp)]) -> Option<usize> {
    let most = groups.iter().map(|(r, _)| r.len()).max()?;
    if groups.iter().filter(|(r, _)| r.len() == most).count() > 1 {
        return None;
    }
    (0..groups.len())
        .filter(|&g| groups[g].0.len() < most)
        .min_by_key(|&g| groups[g].0.len())
}

/// The group that is not what the operations before `index` (the same on every
/// member) repeat: the smallest period that fits them all names the one expected.
fn off_pattern(
    members: &[(u32, &CommCounters)],
    groups: &[(Vec<u32>, PostedOp)],
    index: u64,
) -> Option<usize> {
    let before = |i: u64| -> Option<Shape> {
        let mut shapes = members.iter().map(|(_, c)| c.op(i).map(|o| shape(&o)));
        let first = shapes.next()??;
        shapes.all(|s| s == Some(first)).then_some(first)
    };
    let history: Vec<Shape> = (1..=index.min(2 * MAX_PERIOD + 2))
        .map_while(|back| before(index - back))
        .collect(); // newest first
                    // The newest operations repeat with period p at least twice over (older ones
                    // may be another phase: a warm-up, an evaluation).
    let period = (1..=MAX_PERIOD as usize)
        .filter(|p| history.len() >= 2 * p)
        .find(|&p| (p..history.len().min(3 * p)).all(|i| history[i] == history[i - p]))?;
    let expected = history[period - 1];
    let on = groups.iter().position(|(_, o)| shape(o) == expected)?;
    let off: Vec<usize> = (0..groups.len()).filter(|&g| g != on).collect();
    (off.len() == 1).then(|| off[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::decode::decode;
    use crate::nccl_counters::words::Words;

    /// A rank's communicator whose ring holds `ops` (bytes of all_reduces), the
    /// first at index `from`; none completed past `from`.
    fn rank(r: u32, from: u64, ops: &[u64]) -> CommCounters {
        let mut w = Words::default();
        w.comm(0, 7, r, 4)
            .ops(0, NcclFunc::AllReduce, 1, from, from, 1);
        for &b in ops {
            w.untimed(0, NcclFunc::AllReduce, b, 1);
        }
        decode(&w.bytes()).unwrap().comms.remove(0)
    }

    fn members(ranks: &[CommCounters]) -> Vec<(u32, &CommCounters)> {
        ranks
            .iter()
            .enumerate()
            .map(|(r, c)| (r as u32, c))
            .collect()
    }

    fn ranks_of(m: &Mismatch) -> Vec<Vec<u32>> {
        m.groups.iter().map(|g| g.0.clone()).collect()
    }

    /// Steps of [16 KiB, 16 MiB]; rank 1 skips a 16 KiB one: its operation N is the
    /// others' N+1 (posted ahead, NCCL runs asynchronously). Or it adds a 1 MiB one:
    /// its N+1 is the others' N. The majority says which side; the shift says how.
    #[test]
    fn a_rank_off_the_others_sequence_skipped_or_added_one() {
        let on = [16 << 10, 16 << 20, 16 << 10, 16 << 20, 16 << 10, 16 << 20];
        let skip = [16 << 10, 16 << 20, 16 << 10, 16 << 20, 16 << 20];
        let r = [rank(0, 10, &on), rank(1, 10, &skip), rank(2, 10, &on)];
        let m = mismatch(&members(&r), 14).unwrap();
        let odd = (vec![vec![1], vec![0, 2]], Some(OddBy::Skipped));
        assert_eq!((ranks_of(&m), m.odd), odd);
        assert_eq!(m.groups[1].1.bytes, 16 << 10, "what it skipped");
        let add = [16 << 10, 16 << 20, 16 << 10, 16 << 20, 1 << 20, 16 << 10];
        let r = [rank(0, 10, &on), rank(1, 10, &add), rank(2, 10, &on)];
        let m = mismatch(&members(&r), 14).unwrap();
        let odd = (vec![vec![1], vec![0, 2]], Some(OddBy::Added));
        assert_eq!((ranks_of(&m), m.odd), odd);
        // Two ranks, nothing before to go by: the shift alone names no side.
        let r = [rank(0, 14, &on[4..]), rank(1, 14, &add[4..])];
        assert_eq!(mismatch(&members(&r), 14).unwrap().odd, None);
    }

    /// Two ranks, neither posted past N: the pattern before it names the odd one.
    #[test]
    fn with_two_ranks_the_pattern_before_says_which_is_off() {
        let on = [4 << 20, 4 << 20, 4 << 20, 4 << 20];
        let off = [4 << 20, 4 << 20, 4 << 20, 4];
        let r = [rank(0, 20, &on), rank(1, 20, &off)];
        let m = mismatch(&members(&r), 23).unwrap();
        assert_eq!(
            (ranks_of(&m), m.odd),
            (vec![vec![1], vec![0]], Some(OddBy::Pattern))
        );
        // One operation of history proves no pattern.
        let r = [rank(0, 22, &on[2..]), rank(1, 22, &off[2..])];
        assert_eq!(mismatch(&members(&r), 23).unwrap().odd, None);
    }

    #[test]
    fn a_majority_names_the_few_and_the_same_operation_is_no_mismatch() {
        let (a, b) = ([1 << 20, 1 << 20], [1 << 20, 8]);
        let r = [
            rank(0, 5, &a),
            rank(1, 5, &a),
            rank(2, 5, &b),
            rank(3, 5, &a),
        ];
        let m = mismatch(&members(&r), 6).unwrap();
        assert_eq!(
            (ranks_of(&m), m.odd),
            (vec![vec![2], vec![0, 1, 3]], Some(OddBy::Majority))
        );
        let r = [rank(0, 5, &a), rank(1, 5, &a)];
        assert_eq!(mismatch(&members(&r), 6), None);
    }
}

//! Ranks with the same stack, grouped; the odd ones (the smallest groups) first, as
//! the rank holding the others up is usually the one that differs.

use super::model::{Frame, RankStack};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a global rank runs in a job of several nodes: shown for the odd groups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    pub node_rank: u32,
    pub host: String,
}

/// Each global rank's place, with its local rank (empty on a single node).
pub type Places = BTreeMap<u32, (Place, u32)>;

/// Groups of at most this many ranks name each rank's node, host and local rank.
const PLACED_UP_TO: usize = 4;

/// Ranks whose main threads stand at the same frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub ranks: Vec<u32>,
    /// The main thread's frames, innermost first (empty: no stack could be read).
    pub frames: Vec<Frame>,
    /// Why the stack could not be read, for a group of unreadable ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub fn merge(stacks: &[RankStack]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for s in stacks {
        let frames = s
            .main_thread()
            .map(|t| t.frames.clone())
            .unwrap_or_default();
        match groups
            .iter_mut()
            .find(|g| g.frames == frames && g.error == s.error)
        {
            Some(g) => g.ranks.push(s.rank),
            None => groups.push(Group {
                ranks: vec![s.rank],
                frames,
                error: s.error.clone(),
            }),
        }
    }
    for g in &mut groups {
        g.ranks.sort_unstable();
    }
    groups.sort_by_key(|g| (g.ranks.len(), g.ranks.first().copied()));
    groups
}

/// "0-6", "3", "0-2,5".
pub fn ranks_text(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// A frame's file, shortened to its last two components.
fn short(file: &str) -> &str {
    let mut cut = file.len();
    for _ in 0..2 {
        match file[..cut].rfind('/') {
            Some(i) => cut = i,
            None => return file,
        }
    }
    &file[cut + 1..]
}

/// One line per group: `ranks 0-6: all_reduce (distributed_c10d.py:NNN) <- step (train.py:42)`.
pub fn render_text(groups: &[Group], max_frames: usize) -> String {
    render_placed(groups, max_frames, &Places::new())
}

/// "rank 3", or "rank 3 (node 1 on host-b, local rank 1)" where its place is known.
pub fn rank_label(rank: u32, places: &Places) -> String {
    match places.get(&rank) {
        Some((p, local)) => format!(
            "rank {rank} (node {} on {}, local rank {local})",
            p.node_rank, p.host
        ),
        None => format!("rank {rank}"),
    }
}

/// The ranks of a group: their places where the group is small and places are known.
fn group_label(g: &Group, places: &Places) -> String {
    let placed = !places.is_empty() && g.ranks.len() <= PLACED_UP_TO;
    match g.ranks.as_slice() {
        [one] => rank_label(*one, places),
        many if placed => format!(
            "ranks {}",
            many.iter()
                .map(|r| rank_label(*r, places).replacen("rank ", "", 1))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        many => format!("ranks {}", ranks_text(many)),
    }
}

/// As [`render_text`], naming the node, host and local rank of the odd groups' ranks.
pub fn render_placed(groups: &[Group], max_frames: usize, places: &Places) -> String {
    let mut out = String::new();
    for g in groups {
        let what = match &g.error {
            Some(e) => format!("no stack: {e}"),
            None if g.frames.is_empty() => "no Python frame (in native code, or exiting)".into(),
            None => g
                .frames
                .iter()
                .take(max_frames)
                .map(|f| format!("{} ({}:{})", f.function, short(&f.file), f.line))
                .collect::<Vec<_>>()
                .join(" <- "),
        };
        out.push_str(&format!("  {}: {what}\n", group_label(g, places)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::ThreadStack;
    use super::*;

    fn frame(function: &str, file: &str, line: i32) -> Frame {
        Frame {
            function: function.into(),
            file: file.into(),
            line,
        }
    }

    fn rank(rank: u32, frames: Vec<Frame>) -> RankStack {
        RankStack {
            rank,
            local_rank: rank,
            pid: 100 + rank as i32,
            threads: vec![ThreadStack {
                thread: Some("MainThread".into()),
                frames,
                idle: false,
            }],
            error: None,
        }
    }

    #[test]
    fn the_odd_rank_comes_first() {
        let collective = vec![
            frame(
                "all_reduce",
                "/site-packages/torch/distributed/distributed_c10d.py",
                2800,
            ),
            frame("step", "/app/train.py", 42),
        ];
        let mut stacks: Vec<RankStack> = (0..7).map(|r| rank(r, collective.clone())).collect();
        stacks.push(rank(
            7,
            vec![frame("get", "/usr/lib/python3.12/queue.py", 171)],
        ));
        let groups = merge(&stacks);
        assert_eq!(groups[0].ranks, vec![7]);
        assert_eq!(groups[1].ranks, (0..7).collect::<Vec<_>>());
        let text = render_text(&groups, 8);
        assert_eq!(
            text,
            "  rank 7: get (python3.12/queue.py:171)\n  ranks 0-6: all_reduce (distributed/distributed_c10d.py:2800) <- step (app/train.py:42)\n"
        );
    }

    #[test]
    fn unreadable_ranks_say_why() {
        let mut r = rank(2, vec![]);
        r.threads.clear();
        r.error = Some("permission denied".into());
        let text = render_text(&merge(&[r]), 8);
        assert_eq!(text, "  rank 2: no stack: permission denied\n");
        assert_eq!(ranks_text(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
    }
}

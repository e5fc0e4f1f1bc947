//! The ranks' dumps side by side, as torchfrtrace matches them: by process group and
//! `collective_seq_id`, and point-to-point operations by group and `p2p_seq_id` among
//! the ranks that did any. The first operation some ranks entered and others never
//! did names the rank(s) holding the job up, with what each last completed; a
//! collective all entered with different sizes or dtypes names the odd rank.

use super::dump::{Dump, Entry};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Missing {
    pub rank: u32,
    /// Its last collective in the group: (sequence number, operation).
    pub last_entered: Option<(u64, String)>,
    /// Its last completed one (gloo marks an entry completed some time after it
    /// returned, so this may lag the last entered).
    pub last_completed: Option<(u64, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Issue {
    /// Some ranks entered collective `seq`; the others never did.
    NotEntered {
        group: String,
        seq: u64,
        op: String,
        /// (rank, state) of those that entered.
        entered: Vec<(u32, String)>,
        missing: Vec<Missing>,
    },
    /// Every rank entered collective `seq`, one with other sizes, dtypes or operation.
    Mismatch {
        group: String,
        seq: u64,
        field: &'static str,
        culprit: u32,
        value: String,
        others: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub ranks: Vec<u32>,
    pub issues: Vec<Issue>,
}

/// One compared field of an entry.
type Field = fn(&Entry) -> &str;

/// Each rank's collectives of each group, by sequence number.
type ByGroup<'a> = BTreeMap<&'a str, BTreeMap<u32, BTreeMap<u64, &'a Entry>>>;

/// An entry's sequence number among collectives, or among point-to-point operations.
fn seq_of(e: &Entry, p2p: bool) -> Option<u64> {
    match (p2p, e.is_p2p) {
        (false, false) if e.collective_seq_id > 0 => Some(e.collective_seq_id),
        (true, true) if e.p2p_seq_id > 0 => Some(e.p2p_seq_id),
        _ => None,
    }
}

fn by_group(dumps: &[Dump], p2p: bool) -> ByGroup<'_> {
    let mut g: ByGroup = BTreeMap::new();
    for d in dumps {
        for e in &d.entries {
            if let Some(seq) = seq_of(e, p2p) {
                g.entry(e.group.as_str())
                    .or_default()
                    .entry(d.rank)
                    .or_default()
                    .insert(seq, e);
            }
        }
    }
    g
}

pub fn analyze(dumps: &[Dump]) -> Report {
    let mut issues = Vec::new();
    let groups = by_group(dumps, false)
        .into_iter()
        .map(|g| (g, false))
        .chain(by_group(dumps, true).into_iter().map(|g| (g, true)));
    for ((group, ranks), p2p) in groups {
        // The recorder is a ring: compare only what every rank still holds.
        let from = ranks
            .values()
            .filter_map(|s| s.keys().next())
            .max()
            .copied()
            .unwrap_or(0);
        let seqs: BTreeSet<u64> = ranks
            .values()
            .flat_map(|s| s.keys().copied())
            .filter(|s| *s >= from)
            .collect();
        for seq in seqs {
            if let Some(issue) = look_at(group, seq, &ranks, p2p) {
                issues.push(issue);
                break;
            }
        }
    }
    Report {
        ranks: dumps.iter().map(|d| d.rank).collect(),
        issues,
    }
}

fn look_at(
    group: &str,
    seq: u64,
    ranks: &BTreeMap<u32, BTreeMap<u64, &Entry>>,
    p2p: bool,
) -> Option<Issue> {
    let seq_of = |e: &Entry| seq_of(e, p2p).unwrap_or(0);
    let entered: Vec<(u32, &Entry)> = ranks
        .iter()
        .filter_map(|(r, s)| Some((*r, *s.get(&seq)?)))
        .collect();
    if entered.len() < ranks.len() {
        let missing = ranks
            .iter()
            .filter(|(_, s)| !s.contains_key(&seq))
            .map(|(r, s)| Missing {
                rank: *r,
                last_entered: s.values().next_back().map(|e| (seq_of(e), e.op.clone())),
                last_completed: s
                    .values()
                    .rev()
                    .find(|e| e.completed())
                    .map(|e| (seq_of(e), e.op.clone())),
            })
            .collect();
        return Some(Issue::NotEntered {
            group: if p2p {
                format!("{group} (point-to-point)")
            } else {
                group.to_string()
            },
            seq,
            op: entered
                .first()
                .map(|(_, e)| e.op.clone())
                .unwrap_or_default(),
            entered: entered
                .iter()
                .map(|(r, e)| {
                    (
                        *r,
                        if e.completed() {
                            "completed".into()
                        } else {
                            format!("{}, not completed", e.state)
                        },
                    )
                })
                .collect(),
            missing,
        });
    }
    // A send and its receive differ in name, and their sizes need not be compared.
    if p2p {
        return None;
    }
    let fields: [(&'static str, Field); 3] = [
        ("operation", |e| &e.op),
        ("input sizes", |e| &e.input_sizes),
        ("input dtypes", |e| &e.input_dtypes),
    ];
    for (field, of) in fields {
        let mut counts: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for (r, e) in &entered {
            counts.entry(of(e)).or_default().push(*r);
        }
        if counts.len() < 2 {
            continue;
        }
        let (common, _) = counts.iter().max_by_key(|(_, rs)| rs.len())?;
        let (odd, rs) = counts.iter().find(|(v, _)| *v != common)?;
        return Some(Issue::Mismatch {
            group: group.to_string(),
            seq,
            field,
            culprit: rs[0],
            value: odd.to_string(),
            others: common.to_string(),
        });
    }
    None
}

fn ranks_text(ranks: &[u32]) -> String {
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The first issue in one line, to lead a failure summary or termination message.
pub fn headline(r: &Report) -> Option<String> {
    Some(match r.issues.first()? {
        Issue::NotEntered {
            group,
            seq,
            op,
            missing,
            ..
        } => {
            let who: Vec<String> = missing.iter().map(|m| m.rank.to_string()).collect();
            let last = missing
                .first()
                .and_then(|m| m.last_completed.as_ref())
                .map_or("none".into(), |(s, o)| format!("#{s} {o}"));
            format!(
                "rank(s) {} never entered {op} #{seq} on group {group} that the others entered (rank {} last completed {last})",
                who.join(","),
                who.first().map_or("", String::as_str),
            )
        }
        Issue::Mismatch {
            group,
            seq,
            field,
            culprit,
            value,
            others,
        } => format!("rank {culprit} entered collective #{seq} on group {group} with {field} {value}, the others {others}"),
    })
}

pub fn render_text(r: &Report) -> String {
    let mut out = format!(
        "flight recorder: dumps of rank(s) {}\n",
        ranks_text(&r.ranks)
    );
    if r.issues.is_empty() && r.ranks.len() < 2 {
        // A rank that left, or was stopped before it dumped, leaves nothing to match.
        out.push_str("  one rank's dump only: nothing to match it against\n");
    } else if r.issues.is_empty() {
        out.push_str("  every rank entered the same collectives with the same sizes and dtypes\n");
    }
    for i in &r.issues {
        out.push_str(&match i {
            Issue::NotEntered { group, seq, op, entered, missing } => {
                let who: Vec<u32> = entered.iter().map(|(r, _)| *r).collect();
                let state = entered.first().map(|(_, s)| s.as_str()).unwrap_or("");
                let mut line = format!("  group {group}: collective #{seq} {op} entered by rank(s) {} ({state}); never entered by:\n", ranks_text(&who));
                for m in missing {
                    let entered = m.last_entered.as_ref().map_or("none".into(), |(s, o)| format!("#{s} {o}"));
                    let completed = m.last_completed.as_ref().map_or("none".into(), |(s, o)| format!("#{s} {o}"));
                    line.push_str(&format!("    rank {}: last entered {entered}, last completed {completed}\n", m.rank));
                }
                line
            }
            Issue::Mismatch { group, seq, field, culprit, value, others } => format!(
                "  group {group}: collective #{seq}: rank {culprit} has {field} {value}, the others {others}\n"
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, p2p: bool, op: &str, done: bool) -> Entry {
        Entry {
            group: "0".into(),
            collective_seq_id: if p2p { 0 } else { seq },
            p2p_seq_id: if p2p { seq } else { 0 },
            is_p2p: p2p,
            op: op.into(),
            state: if done { "completed" } else { "started" }.into(),
            retired: done,
            input_sizes: "[[4]]".into(),
            input_dtypes: "['Float']".into(),
            ..Default::default()
        }
    }

    fn dump(rank: u32, entries: Vec<Entry>) -> Dump {
        Dump {
            rank,
            version: "2.10".into(),
            entries,
            ..Default::default()
        }
    }

    #[test]
    fn a_receive_never_sent_names_the_rank_that_did_not_send() {
        // Rank 0 sent twice; rank 1 received the first and waits in the second;
        // rank 2 did no point-to-point at all and is not counted.
        let dumps = [
            dump(0, vec![entry(1, true, "nccl:send 0->1", true)]),
            dump(
                1,
                vec![
                    entry(1, true, "nccl:recv 0<-1", true),
                    entry(2, true, "nccl:recv 0<-1", false),
                ],
            ),
            dump(2, vec![entry(1, false, "nccl:all_reduce", true)]),
        ];
        let report = analyze(&dumps);
        let [Issue::NotEntered {
            group,
            seq,
            missing,
            ..
        }] = report.issues.as_slice()
        else {
            panic!("{report:?}")
        };
        assert_eq!((group.as_str(), *seq), ("0 (point-to-point)", 2));
        let line = headline(&report).expect("an issue");
        assert!(line.starts_with("rank(s) 0 never entered"), "{line}");
        assert_eq!(missing[0].rank, 0);
        assert_eq!(
            missing[0].last_completed,
            Some((1, "nccl:send 0->1".to_string()))
        );
    }

    #[test]
    fn matched_sends_and_receives_are_no_issue() {
        let dumps = [
            dump(0, vec![entry(1, true, "nccl:send 0->1", true)]),
            dump(1, vec![entry(1, true, "nccl:recv 0<-1", true)]),
        ];
        let report = analyze(&dumps);
        assert_eq!(report.issues, vec![]);
        assert_eq!(headline(&report), None);
    }
}

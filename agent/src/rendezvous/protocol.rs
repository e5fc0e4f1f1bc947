//! The values nodes exchange through the rendezvous state, as types. Each is JSON on
//! the wire; anything else found under its key (another program, a stranger on the
//! store) is refused with the key's name instead of being taken for a value.

use serde::{Deserialize, Serialize};
use std::fmt;
use toporun_shared::root_cause::CauseKind;
use toporun_shared::torchrun::MAX_WORLD;
use toporun_shared::untrusted::printable;

/// A value under a rendezvous key that is not what toporun writes there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} holds {value}, not {expected}: another program wrote there, or a stranger on the store forged it")]
pub struct Unreadable {
    pub key: String,
    /// The value, printable and cut short.
    pub value: String,
    pub expected: &'static str,
}

pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    key: &str,
    raw: &[u8],
    expected: &'static str,
) -> Result<T, Unreadable> {
    serde_json::from_slice(raw).map_err(|_| Unreadable {
        key: key.to_string(),
        value: shown(raw),
        expected,
    })
}

fn shown(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let cut: String = text.chars().take(80).collect();
    format!("{:?}", printable(&cut))
}

pub(super) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain structs and enums of strings and integers: serializing cannot fail.
    serde_json::to_vec(value).unwrap_or_default()
}

/// Why every node stops its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopKind {
    /// A rank failed: counts against --max-restarts.
    Restart,
    /// A node was lost or admitted: the next round runs, not counted.
    Membership,
    /// The job ends.
    Fail,
    /// No rank of the job made progress and `--on-hang stop` ends it (exit 124).
    Hang,
    /// A node was told to go (SIGTERM from the kubelet, a spot reclaim): every node
    /// stops its ranks now, the shutdown deadline counted from the first signal.
    Preempt,
}

impl StopKind {
    fn as_str(self) -> &'static str {
        match self {
            StopKind::Restart => "restart",
            StopKind::Membership => "membership",
            StopKind::Fail => "fail",
            StopKind::Hang => "hang",
            StopKind::Preempt => "preempt",
        }
    }
}

/// The value of a round's `stop` key: first writer wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopReason {
    pub kind: StopKind,
    pub detail: String,
    /// The class of what caused it, where known (every node exits with its code
    /// under `--exit-codes classified`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<CauseKind>,
    /// The node ranks it declares lost (no word will come from them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<u32>,
    /// When the first node was told (milliseconds since the epoch): a preemption's
    /// shutdown deadline runs from there on every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// A stop by Ctrl-C (SIGINT at a terminal): an interruption, not a preemption.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
}

impl StopReason {
    pub fn new(kind: StopKind, detail: impl Into<String>) -> StopReason {
        StopReason {
            kind,
            detail: detail.into(),
            cause: None,
            lost: Vec::new(),
            interrupted: false,
            at_ms: None,
        }
    }

    /// A preemption: `what` (a signal's name, a cloud's notice) on node `node`
    /// (`host`), at `at_ms` (epoch ms); `interrupted` where it is Ctrl-C.
    pub fn preempted(
        what: &str,
        interrupted: bool,
        node: u32,
        host: &str,
        at_ms: u64,
    ) -> StopReason {
        StopReason {
            at_ms: Some(at_ms),
            interrupted,
            ..StopReason::new(StopKind::Preempt, format!("{what} on node {node} ({host})"))
                .caused_by(Some(CauseKind::Preempted))
        }
    }

    pub fn caused_by(self, cause: Option<CauseKind>) -> StopReason {
        StopReason { cause, ..self }
    }

    pub fn losing(self, lost: Vec<u32>) -> StopReason {
        StopReason { lost, ..self }
    }

    pub fn fail(detail: impl Into<String>) -> StopReason {
        StopReason::new(StopKind::Fail, detail)
    }

    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Reads a `stop` value; a forged one stops the job as a failure that names it.
    pub fn decode(key: &str, raw: &[u8]) -> StopReason {
        decode::<StopReason>(key, raw, "a stop reason")
            .map(|r| StopReason {
                detail: printable(&r.detail),
                ..r
            })
            .unwrap_or_else(|e| StopReason::fail(e.to_string()))
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Ctrl-C is an interruption, whatever stop it travels as.
        let kind = if self.interrupted {
            "interrupted"
        } else {
            self.kind.as_str()
        };
        write!(f, "{kind}: {}", self.detail)
    }
}

/// The value of a round's `closed` key, written once by the round's coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Closed {
    /// The round runs with this many nodes.
    Nodes(u32),
    /// The coordinator refused the round, and says why.
    Refused(String),
}

impl Closed {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Reads a `closed` value: a node count within 1..=max_nodes, or a refusal.
    pub fn decode(key: &str, raw: &[u8], max_nodes: u32) -> Result<Closed, Unreadable> {
        match decode(key, raw, "a round's closing")? {
            Closed::Nodes(n) if !(1..=max_nodes).contains(&n) => Err(Unreadable {
                key: key.to_string(),
                value: shown(raw),
                expected: "a node count within --nnodes",
            }),
            Closed::Refused(why) => Ok(Closed::Refused(printable(&why))),
            ok => Ok(ok),
        }
    }
}

/// A node's place, under `layout/<ticket>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub node_rank: u32,
    /// Global rank of the node's local rank 0.
    pub offset: u32,
    pub world: u32,
    pub nnodes: u32,
}

/// What a node knows that its layout must agree with.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    /// Its node rank, where it knows it (static, or a TCPStore's join order).
    pub node_rank: Option<u32>,
    /// The round's size, from `closed`.
    pub nnodes: u32,
    /// Its own rank count.
    pub nproc: u32,
}

impl Layout {
    pub fn encode(&self) -> Vec<u8> {
        encode(self)
    }

    /// Reads and checks a layout against what this node knows.
    pub fn decode(key: &str, raw: &[u8], expect: Expect) -> Result<Layout, Unreadable> {
        let l: Layout = decode(key, raw, "a node's layout")?;
        let bad = |expected| Unreadable {
            key: key.to_string(),
            value: shown(raw),
            expected,
        };
        if expect.node_rank.is_some_and(|r| r != l.node_rank)
            || l.node_rank >= l.nnodes
            || l.nnodes != expect.nnodes
        {
            return Err(bad("this node's place in the round that closed"));
        }
        if u64::from(l.world) > MAX_WORLD
            || u64::from(l.offset) + u64::from(expect.nproc) > u64::from(l.world)
        {
            return Err(bad("a place this node's ranks fit in"));
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_round_trip_and_print_as_before() {
        for kind in [
            StopKind::Restart,
            StopKind::Membership,
            StopKind::Fail,
            StopKind::Hang,
        ] {
            let r = StopReason::new(kind, "node 1 failed");
            assert_eq!(StopReason::decode("k", &r.encode()), r);
            let lost = r.clone().losing(vec![1, 3]);
            assert_eq!(StopReason::decode("k", &lost.encode()).lost, [1, 3]);
        }
        assert_eq!(
            StopReason::new(StopKind::Membership, "x").to_string(),
            "membership: x"
        );
        let ctrl_c = StopReason::preempted("SIGINT", true, 0, "laptop", 1);
        assert_eq!(ctrl_c.to_string(), "interrupted: SIGINT on node 0 (laptop)");
        let drain = StopReason::preempted("SIGTERM", false, 0, "node", 1);
        assert_eq!(drain.to_string(), "preempt: SIGTERM on node 0 (node)");
    }

    #[test]
    fn a_forged_stop_fails_the_job_naming_the_key() {
        // The old text form is no reason either: only toporun's own encoding counts.
        let r = StopReason::decode("toporun/j/r0/stop", b"membership: trust me");
        assert_eq!(r.kind, StopKind::Fail);
        assert!(r.detail.contains("toporun/j/r0/stop holds"), "{r}");
        assert!(r.detail.contains("forged"), "{r}");
    }

    #[test]
    fn closed_round_trips_and_refuses_counts_out_of_range() {
        for c in [Closed::Nodes(2), Closed::Refused("node 1 bad".into())] {
            assert_eq!(Closed::decode("k", &c.encode(), 4).unwrap(), c);
        }
        let e = Closed::decode("r0/closed", &Closed::Nodes(9).encode(), 4).unwrap_err();
        assert_eq!(e.key, "r0/closed");
        let e = Closed::decode("r0/closed", b"2", 4).unwrap_err();
        assert!(e.to_string().contains("r0/closed holds \"2\""), "{e}");
    }

    #[test]
    fn layouts_round_trip_and_are_checked_against_the_node() {
        let l = Layout {
            node_rank: 1,
            offset: 2,
            world: 4,
            nnodes: 2,
        };
        let expect = Expect {
            node_rank: Some(1),
            nnodes: 2,
            nproc: 2,
        };
        assert_eq!(Layout::decode("k", &l.encode(), expect).unwrap(), l);
        // Another node's rank, a round of another size, ranks that do not fit.
        for (forged, e) in [
            (Layout { node_rank: 0, ..l }, expect),
            (Layout { nnodes: 3, ..l }, expect),
            (Layout { offset: 3, ..l }, expect),
            (l, Expect { nproc: 3, ..expect }),
        ] {
            let err = Layout::decode("r0/layout/1", &forged.encode(), e).unwrap_err();
            assert_eq!(err.key, "r0/layout/1");
        }
        assert!(Layout::decode("k", b"1,2,4,2", expect).is_err());
    }
}

//! This node's links watched from the same readings as the GPU straggler (dumps, or
//! NCCL's counters where the profiler plugin is loaded): where its
//! collectives run far below what the slowest link between its GPUs should carry,
//! say so once it holds, and again once it no longer does.

use toporun_shared::flight_recorder::{link_speeds, slow_links_line, Dump, LinkModel, LinkSpeed};

/// Dump sets in a row that must agree before the finding is said or withdrawn: one
/// set covers well under a second of a fast job.
const HOLD: u32 = 3;

pub struct LinkWatch {
    model: LinkModel,
    /// "node 0 on trainer-0".
    node: String,
    /// Dump sets in a row that disagree with what was last said.
    against: u32,
    /// The finding said last (None: nothing, or the links came back).
    said: Option<String>,
    /// The newest collective of the last set judged: a set without a newer one (the
    /// ranks stood still between dumps) is no new evidence.
    newest: u64,
}

impl LinkWatch {
    pub fn new(model: LinkModel, node: String) -> LinkWatch {
        LinkWatch {
            model,
            node,
            against: 0,
            said: None,
            newest: 0,
        }
    }

    /// One set of dumps (one per local rank); the line to say, if any.
    pub fn observe(&mut self, dumps: &[Dump]) -> Option<String> {
        let newest = dumps
            .iter()
            .flat_map(|d| d.entries.iter().map(|e| e.collective_seq_id))
            .max()?;
        if newest <= self.newest {
            return None;
        }
        self.newest = newest;
        self.judge(&link_speeds(dumps, &self.model))
    }

    /// The model the speeds are judged against.
    pub fn model(&self) -> &LinkModel {
        &self.model
    }

    /// One window's link speeds (from the dumps or NCCL's counters); the line to say,
    /// if any.
    pub fn judge(&mut self, speeds: &[LinkSpeed]) -> Option<String> {
        if speeds.is_empty() {
            return None;
        }
        let now = slow_links_line(speeds, &self.model);
        if now.is_some() == self.said.is_some() {
            self.against = 0;
            return None;
        }
        self.against += 1;
        if self.against < HOLD {
            return None;
        }
        self.against = 0;
        let line = match &now {
            Some(l) => format!("toporun: warning: slow links ({}): {l}", self.node),
            None => format!(
                "toporun: links ({}): the collectives run at what {} should carry again",
                self.node, self.model.class
            ),
        };
        self.said = now;
        Some(line)
    }

    /// The finding standing now.
    pub fn current(&self) -> Option<String> {
        self.said.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::flight_recorder::{Bytes, Entry};

    /// Two ranks' dumps of 30 all_reduces of 64 MiB from `from` on, each taking `us` us.
    fn set(us: u64, from: u64) -> Vec<Dump> {
        (0..2)
            .map(|rank| Dump {
                rank,
                version: "2.10".into(),
                entries: (from..from + 30)
                    .map(|seq| Entry {
                        group: "0".into(),
                        collective_seq_id: seq,
                        op: "nccl:all_reduce".into(),
                        time_created_ns: 1 + seq,
                        duration_ns: Some(us * 1000),
                        bytes: Some(Bytes {
                            input: 64 << 20,
                            output: 64 << 20,
                        }),
                        ..Default::default()
                    })
                    .collect(),
                group_sizes: [("0".to_string(), 2)].into(),
            })
            .collect()
    }

    #[test]
    fn said_once_it_holds_and_withdrawn_once_it_no_longer_does() {
        let model = LinkModel {
            class: "NV18 (Hopper) between GPU 0 and GPU 1".into(),
            gbps: 370.8,
        };
        let mut w = LinkWatch::new(model, "node 0 on vm".into());
        // 64 MiB in 250 us (268 GB/s, as NV18 measured) and in 2.5 ms (through the host),
        // each set newer than the last.
        let mut from = 0;
        let mut next = |us| {
            from += 30;
            set(us, from)
        };
        let (good, slow) = (250, 2500);
        assert_eq!(w.observe(&next(good)), None);
        assert_eq!(w.observe(&next(slow)), None);
        assert_eq!(w.observe(&next(good)), None, "a single slow set resets");
        assert_eq!(w.observe(&next(slow)), None);
        let stale = next(slow);
        assert_eq!(w.observe(&stale), None);
        assert_eq!(w.observe(&stale), None, "the same set again");
        assert_eq!(w.observe(&stale), None, "is no new evidence");
        let line = w.observe(&next(slow)).expect("three slow sets in a row");
        assert!(
            line.starts_with(
                "toporun: warning: slow links (node 0 on vm): all_reduce of 64 MiB run at 27 GB/s"
            ),
            "{line}"
        );
        assert!(w.current().is_some());
        assert_eq!(w.observe(&next(slow)), None, "said once");
        for _ in 0..2 {
            assert_eq!(w.observe(&next(good)), None);
        }
        let back = w.observe(&next(good)).unwrap();
        assert!(
            back.starts_with("toporun: links (node 0 on vm): the collectives run at what NV18"),
            "{back}"
        );
        assert_eq!(w.current(), None);
        assert_eq!(w.observe(&[]), None, "no dumps, no change");
    }
}

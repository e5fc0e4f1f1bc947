//! The job-wide hang decision on several nodes. Each node publishes, at every
//! sample, how long its ranks have stood still (and, past half the timeout, where
//! they stand) under `stacks/<node>` in the workers' store; the node hosting that
//! store declares the hang once every node has stood still for the timeout, prints
//! one view naming each odd rank's node, host and local rank, and writes it under
//! `hang`, where the other nodes read and print it.

use crate::job::hang::watch::LEFT_STALL;
use crate::job::hang::watch::{HangReport, NodeSample, Sink};
use crate::job::session::meeting::Meeting;
use crate::job::spec::HangWatch;
use crate::store::{StoreClient, StoreError};
use std::time::Duration;
use tokio::sync::watch;
use toporun_shared::stacks::hang_report::{Hang, HangNotice as Notice};
use toporun_shared::stacks::job_view::{context, flatten, job_hung, NodeStacks};
use toporun_shared::stacks::standing::Standing;

struct State {
    reported: bool,
    seq: u32,
}

/// Starts exchanging this node's samples; a hang decided goes to `sink`.
pub fn start(
    x: Meeting,
    hostname: String,
    watch: HangWatch,
    mut samples: watch::Receiver<NodeSample>,
    sink: Sink,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = match x.connect().await {
            Ok(c) => c,
            Err(e) => return unavailable(&e),
        };
        let mut state = State {
            reported: false,
            seq: 0,
        };
        while samples.changed().await.is_ok() {
            let s = samples.borrow_and_update().clone();
            if let Err(e) = x
                .step(&mut c, &hostname, watch, &s, &mut state, &sink)
                .await
            {
                return unavailable(&e);
            }
        }
    })
}

fn say_decided(decider: u32) {
    crate::console::say!("toporun: hang: node {decider} (hosting the workers' store) found no rank of any node making progress; its job-wide view:");
}

/// Prints the job-wide view a node stopped for a hang had not read yet (the stop
/// can come before its next sample).
pub async fn print_decided(m: &Meeting) {
    let Ok(mut c) = m.connect().await else { return };
    if let Ok(Some(n)) = m.read_notice(&mut c, 0).await {
        say_decided(n.decider);
        crate::console::say_raw!("{}", n.text);
    }
}

fn unavailable(e: &StoreError) {
    crate::console::say_warning!("job-wide hang detection stopped: the workers' store is unreachable ({e}); each node's stacks stay available through `toporun stacks`");
}

impl Meeting {
    async fn step(
        &self,
        c: &mut StoreClient,
        hostname: &str,
        watch: HangWatch,
        s: &NodeSample,
        state: &mut State,
        sink: &Sink,
    ) -> Result<(), StoreError> {
        // Where the ranks stand travels only once they have stood still a while, or
        // sooner where a rank left or every rank here waits for its peers (a rank
        // gone elsewhere is said at LEFT_STALL).
        let outside = |r: &(u32, Standing, String)| matches!(r.1, Standing::Elsewhere { .. });
        let early = s.stalled >= LEFT_STALL / 2
            && (!s.context.left.is_empty() || !s.context.standings(&s.stacks).iter().any(outside));
        let shown = if s.stalled >= watch.timeout / 2 || early {
            s.stacks.as_slice()
        } else {
            &[]
        };
        let mine =
            NodeStacks::new(self.node_rank, hostname, s.stalled, shown).with_context(&s.context);
        // Its own encoding: frames cut until it fits the store's bound.
        let key = self.keys.stacks(self.node_rank);
        c.set(key.name(), &mine.encode()).await?;
        if s.stalled < watch.timeout.min(LEFT_STALL) {
            state.reported = false;
            return Ok(());
        }
        if state.reported {
            return Ok(());
        }
        let found = if self.decides {
            self.decide(c, watch.timeout, state.seq + 1).await?
        } else {
            self.read_notice(c, state.seq).await?
        };
        if let Some(n) = found {
            if !self.decides {
                say_decided(n.decider);
            }
            state.seq = n.seq;
            state.reported = true;
            sink.found(HangReport {
                hang: n.hang,
                text: n.text,
                watchdog: None,
            });
        }
        Ok(())
    }

    /// Reads every node's record; a notice when the whole job hangs.
    async fn decide(
        &self,
        c: &mut StoreClient,
        timeout: Duration,
        seq: u32,
    ) -> Result<Option<Notice>, StoreError> {
        let nodes: Vec<NodeStacks> = self
            .gather(c, |n| self.keys.stacks(n), Duration::ZERO)
            .await?;
        if nodes.len() < self.nnodes as usize {
            return Ok(None);
        }
        let (stacks, places) = flatten(&nodes);
        let ctx = context(&nodes);
        // A rank gone anywhere while every other rank waits: LEFT_STALL suffices.
        let bound = if ctx.left_while_others_wait(&stacks) {
            timeout.min(LEFT_STALL)
        } else {
            timeout
        };
        let Some(stalled) = job_hung(&nodes, self.nnodes, bound) else {
            return Ok(None);
        };
        let hang = Hang::with(&stacks, &places, stalled, timeout, &ctx);
        let notice = Notice {
            seq,
            decider: self.node_rank,
            text: hang.text(&places),
            hang,
        };
        self.write(c, &self.keys.hang(), &notice).await?;
        Ok(Some(notice))
    }

    /// The deciding node's notice, when it is newer than `seen`.
    async fn read_notice(
        &self,
        c: &mut StoreClient,
        seen: u32,
    ) -> Result<Option<Notice>, StoreError> {
        let notice = self.read(c, &self.keys.hang()).await?;
        Ok(notice.filter(|n| n.seq > seen))
    }
}

//! How a node of a multi-node job enters a round: it joins the round the job is at
//! (running the coordinator beside on the store's host, or on the etcd node that
//! claims the round), or, when that round already runs, waits for the next one as a
//! node to admit or a spare. Once placed, it takes part in the network check
//! (`network_gate`), which may send it on to the next round.

use crate::job::entry::Entered;
use crate::job::error::{JobError, WithAdvice};
use crate::job::session::multi_node::MultiNode;
use crate::job::session::network_gate::Checked;
use crate::job::session::rdzv_connect::until_signal;
use crate::job::spec::{Job, NodePlace};
use crate::rendezvous::{
    advance_round, coordinate, current_round, join, round_closed, wait_for_next_round, Backend,
    CoordinateError, JoinError, NextRound, NodeInfo, Place, Waiting,
};
use crate::supervise::Events;
use std::time::Duration;
use tokio::task::JoinHandle;
use toporun_shared::untrusted::printable;

type Result<T> = std::result::Result<T, JobError>;

enum Joined {
    Placed(NodePlace),
    /// The round closed before this node could take part.
    Surplus,
    Signal,
}

/// How waiting while a round runs without this node ended.
enum Spare {
    Next(u32),
    /// The job finished without it.
    Finished,
    Signal,
}

type Coordinator = JoinHandle<std::result::Result<Vec<NodeInfo>, CoordinateError>>;

impl MultiNode {
    /// This node's place in the first round at or after `min_round` that it can take
    /// part in: a node arriving while a round runs waits for the next one (the
    /// running nodes admit it, or it waits as a spare).
    pub(super) async fn join_first(
        &mut self,
        p: &Job,
        min_round: u32,
        events: &mut Events,
    ) -> Result<Entered> {
        if min_round == 0 {
            self.refuse_finished_run().await?;
            self.refuse_refused_machine().await?;
        }
        let mut min_round = min_round;
        loop {
            let round = self.round_at_least(min_round).await?;
            let closed = round_closed(&mut self.client, &self.cfg, round)
                .await
                .map_err(|e| self.rdzv(e))?;
            if !closed {
                self.warm_torch_probe(p);
                match self.join_round(p, round, events).await? {
                    Joined::Placed(mut node) => match self.check_network(p, &node, events).await? {
                        Checked::Go(report) => {
                            node.network = report.map(Box::new);
                            return Ok(Entered::Placed(node));
                        }
                        Checked::NextRound => {
                            min_round = round + 1;
                            continue;
                        }
                        Checked::Signal => return Ok(Entered::Signal),
                    },
                    Joined::Signal => return Ok(Entered::Signal),
                    // A spare may wait long: no probe holds its GPU meanwhile.
                    Joined::Surplus => self.torch_probe = None,
                }
            }
            match self.wait_as_spare(round, events).await? {
                Spare::Next(next) => min_round = next,
                Spare::Finished => return Ok(Entered::JobFinished),
                Spare::Signal => return Ok(Entered::Signal),
            }
        }
    }

    fn rdzv(&self, e: JoinError) -> JobError {
        JobError::failed(format!("rendezvous {}", self.run_id), e)
    }

    /// A run id whose job completed is not joined again.
    async fn refuse_finished_run(&mut self) -> Result<()> {
        let finished = self.cfg.keys().finished();
        let done = self
            .client
            .check(&[&finished])
            .await
            .map_err(|e| self.rdzv(e.into()))?;
        if !done {
            return Ok(());
        }
        let hint = self.state.clear_hint(&self.run_id);
        Err(JobError::Failed(format!(
            "rendezvous {} already finished: a job with this --rdzv-id completed at {}; give every job its own --rdzv-id{hint}",
            self.run_id,
            self.state.describe()
        )))
    }

    /// The job's round, moved on to at least `min_round`.
    async fn round_at_least(&mut self, min_round: u32) -> Result<u32> {
        let mut round = current_round(&mut self.client, &self.cfg)
            .await
            .map_err(|e| self.rdzv(e))?;
        while round < min_round {
            round = advance_round(&mut self.client, &self.cfg, round)
                .await
                .map_err(|e| self.rdzv(e))?;
        }
        Ok(round)
    }

    /// Static: this node's rank held in the running round, by a node that died (this
    /// one replaces it at the next round) or by a node given the same --node-rank.
    async fn rank_holder(&mut self, round: u32) -> Option<(u32, String)> {
        let r = self.info.node_rank?;
        let claim = self.cfg.round_keys(round).claim(r);
        if !self.client.check(&[&claim]).await.unwrap_or(false) {
            return None;
        }
        let who = self.client.get(&claim, self.cfg.read_timeout).await.ok()?;
        Some((r, printable(&String::from_utf8_lossy(&who))))
    }

    /// Waits while round `round` runs without this node.
    async fn wait_as_spare(&mut self, round: u32, events: &mut Events) -> Result<Spare> {
        let run_id = self.run_id.clone();
        let holder = self.rank_holder(round).await;
        match &holder {
            Some((r, who)) => crate::console::say!("toporun: rendezvous {run_id}: node rank {r} is held by {who} in the running round {round}: if that node died, this one takes its place at the next round (once its keep-alives stop); if two nodes were given the same --node-rank, fix the job spec"),
            None => crate::console::say!("toporun: rendezvous {run_id}: round {round} is running without this node; it waits for the next round (the running nodes admit it if the round is below --nnodes max, else it is a spare)"),
        }
        let mut report = |w: Duration| {
            crate::console::say!(
                "toporun: rendezvous {run_id}: waiting for round {} ({:.0}s)",
                round + 1,
                w.as_secs_f64()
            );
        };
        let waited = wait_for_next_round(&mut self.client, &self.cfg, round, &mut report);
        let next = tokio::select! {
            r = waited => match (r, &holder) {
                (Ok(n), _) => n,
                (Err(e @ JoinError::Stopped(_)), _) => return Err(JobError::failed(format!("rendezvous {run_id}"), e)),
                // The store went away while this node waited: the job ended (or its
                // host died) without needing this static rank.
                (Err(_), Some(_)) => NextRound::Finished,
                (Err(e), None) => return Err(JobError::failed(format!("rendezvous {run_id}: no round this node could join"), e)),
            },
            _ = until_signal(events) => return Ok(Spare::Signal),
        };
        match (next, holder) {
            (NextRound::Round(r), _) => Ok(Spare::Next(r)),
            (NextRound::Finished, None) => Ok(Spare::Finished),
            // A static rank the job never needed again was a duplicate.
            (NextRound::Finished, Some((rank, other))) => Err(JobError::failed(
                format!("rendezvous {run_id}"),
                JoinError::DuplicateRank {
                    rank,
                    other,
                    me: printable(&self.info.hostname),
                },
            )),
        }
    }

    /// Whether this node closes round `round`: the store's host, or in etcd the node
    /// that claims the round first.
    async fn coordinates(&mut self, round: u32) -> Result<bool> {
        let Some(me) = self.client.identity().map(str::to_string) else {
            return Ok(self.state.hosted_here());
        };
        let key = self.cfg.round_keys(round).coordinator();
        let holder = self
            .client
            .compare_set(&key, b"", me.as_bytes())
            .await
            .map_err(|e| JobError::failed("rendezvous coordinator claim", e))?;
        Ok(holder == me.as_bytes())
    }

    /// The coordinator of round `round`, on a task of its own.
    async fn spawn_coordinator(&self, round: u32) -> Result<Coordinator> {
        let mut c = self.state.connect_here(&self.cfg).await?;
        let cfg = self.cfg.clone();
        // The store's host gives each round's workers a clean store (etcd rounds get
        // a new one on node rank 0).
        let store = self.server.clone();
        Ok(tokio::spawn(async move {
            let mut clear = move || {
                if let Some(s) = &store {
                    s.forget_workers();
                }
            };
            let mut report = |w: &Waiting| {
                let who = if w.missing.is_empty() {
                    format!("{} more", w.expected.saturating_sub(w.joined))
                } else {
                    format!("node rank(s) {:?}", w.missing)
                };
                crate::console::say!("toporun: rendezvous {} round {round}: {}/{} nodes joined, waiting for {who}, {:.0}s of {:.0}s", cfg.run_id, w.joined, w.expected, w.elapsed.as_secs_f64(), w.timeout.as_secs_f64());
            };
            coordinate(&mut c, &cfg, round, &mut report, &mut clear).await
        }))
    }

    /// Joins round `round`, with the coordinator beside where this node closes it.
    async fn join_round(&mut self, p: &Job, round: u32, events: &mut Events) -> Result<Joined> {
        let coordinates = self.coordinates(round).await?;
        let mut coordinator = match coordinates {
            true => Some(self.spawn_coordinator(round).await?),
            false => None,
        };
        let (run_id, place_where) = (self.run_id.clone(), self.state.describe());
        let failed = |e: CoordinateError| coordinator_failed(&run_id, &place_where, e);
        let run_id = self.run_id.clone();
        // The coordinator reports progress; the others say they are waiting.
        let mut report = move |waited: Duration| {
            if !coordinates {
                crate::console::say!("toporun: rendezvous {run_id} round {round}: waiting for the round to close ({:.0}s)", waited.as_secs_f64());
            }
        };
        let mut coordinated = None;
        let joined = {
            let joining = join(&mut self.client, &self.cfg, round, &self.info, &mut report);
            tokio::pin!(joining);
            // Poll both: this node's own join and the coordinator, which may fail (a
            // timeout naming the missing nodes, a forgery) while the join still waits.
            loop {
                tokio::select! {
                    r = &mut joining => break r,
                    c = async { coordinator.as_mut().expect("guarded").await }, if coordinator.is_some() && coordinated.is_none() => {
                        match c.map_err(|e| JobError::failed("the rendezvous coordinator", e))? {
                            Err(e) => return Err(failed(e)),
                            Ok(infos) => coordinated = Some(Ok(infos)),
                        }
                    }
                    _ = until_signal(events) => return Ok(Joined::Signal),
                }
            }
        };
        if let (None, Some(task)) = (&coordinated, coordinator) {
            coordinated = Some(
                task.await
                    .map_err(|e| JobError::failed("the rendezvous coordinator", e))?,
            );
        }
        match coordinated {
            Some(Ok(infos)) => self.coordinated(p, round, &infos),
            Some(Err(e)) => return Err(failed(e)),
            // Another node coordinated: its table is in the store.
            None => {
                self.nodes.clear();
                let world = joined.as_ref().map_or(0, |p| p.world);
                self.learn_machines(round, world).await;
            }
        }
        let place = match joined {
            Ok(place) => place,
            Err(JoinError::Surplus { .. }) => return Ok(Joined::Surplus),
            Err(e) => {
                return Err(JobError::failed(
                    format!("joining rendezvous {}", self.run_id),
                    e,
                ))
            }
        };
        let (master_addr, master_port) = self.master(round, place.node_rank).await?;
        Ok(Joined::Placed(node_place(
            p,
            &self.run_id,
            place,
            master_addr,
            master_port,
        )))
    }
}

/// What a failed coordinator means for the user.
fn coordinator_failed(run_id: &str, place_where: &str, e: CoordinateError) -> JobError {
    let doing = format!("rendezvous {run_id}");
    match e {
        CoordinateError::Timeout { .. } => {
            let advice = format!("Likely causes: the missing nodes' pods are not scheduled or crashed, {place_where} does not resolve for them, or its port is blocked between nodes");
            JobError::failed(doing, WithAdvice { error: e, advice })
        }
        _ => JobError::failed(doing, e),
    }
}

/// This node's ranks in the round, said once.
fn node_place(
    p: &Job,
    run_id: &str,
    place: Place,
    master_addr: String,
    master_port: u16,
) -> NodePlace {
    crate::console::say!(
        "toporun: round {}: this node is node rank {} of {}, global ranks {}-{} of {}",
        place.round,
        place.node_rank,
        place.nnodes,
        place.offset,
        place.offset + p.nproc - 1,
        place.world
    );
    NodePlace::in_round(
        p.nproc,
        run_id.to_string(),
        place,
        (master_addr, master_port),
    )
}

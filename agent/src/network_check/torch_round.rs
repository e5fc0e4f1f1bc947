//! A round's check through torch: each node's word on whether its probe got ready,
//! node rank 0's decision for the round (torch only where every node can), and this
//! node's measure. Every wait runs from the check's start or from the measure's, so
//! that the nodes' deadlines line up: a node that waits for a decision waits longer
//! than node rank 0 may take to make it, and one that waits for the report longer
//! than the slowest probe may take to be killed.

use super::check_round::{counted, read_present, CheckError, CheckNode, Waits, GATHER_WAIT};
use super::torch_path::{Params, TorchProbe, TorchSide, MEASURE_WAIT, PROBE_TIMEOUT, READY_WAIT};
use crate::rendezvous::{Backend, Key, Kv, RoundKeys};
use std::time::{Duration, Instant};
use toporun_shared::network_check::schedule::{phases, rounds};
use toporun_shared::network_check::verdict::PathFigure;
use toporun_shared::network_check::{DataPath, PathVote};
use toporun_shared::user_env::UserEnv;

/// Node rank 0 counts the nodes' words until this long after the check's start: a
/// node whose probe gets ready at READY_WAIT still says its word in time.
const VOTE_WAIT: Duration = Duration::from_secs(22);

/// On the torch path: node rank 0 gathers records until the slowest probe has been
/// killed (MEASURE_WAIT after it got its parameters), the others wait for the report
/// that long and node rank 0's gathering too.
pub(super) const TORCH_GATHER: Waits = Waits {
    gather: MEASURE_WAIT.saturating_add(Duration::from_secs(2)),
    report: MEASURE_WAIT.saturating_add(GATHER_WAIT.saturating_mul(2)),
    seen: GATHER_WAIT,
};

/// A probe that got ready, with the workers' store and the round's variables.
pub(super) type Ready<'a> = (TorchProbe, (&'a str, u16), UserEnv);

/// This node's word: torch where its probe got ready by READY_WAIT after the
/// check's start, else why not.
pub(super) async fn vote<'a>(
    torch: Result<TorchSide<'a>, String>,
    started: Instant,
) -> (PathVote, Option<Ready<'a>>) {
    let side = match torch {
        Ok(side) => side,
        Err(why) => return (PathVote::Tcp { why }, None),
    };
    let mut probe = match side.probe {
        Ok(p) => p,
        Err(why) => return (PathVote::Tcp { why }, None),
    };
    match probe.ready(started + READY_WAIT).await {
        Ok(()) => {
            let backend = probe.backend.as_str().to_string();
            (
                PathVote::Torch { backend },
                Some((probe, side.store, side.env)),
            )
        }
        Err(why) => {
            let why = format!("its torch probe did not start: {why}");
            (PathVote::Tcp { why }, None)
        }
    }
}

/// Every node says what it can; node rank 0 decides the round's path from what came
/// by VOTE_WAIT after the check's start and writes it; the others read it.
pub(super) async fn agree(
    kv: &mut Kv,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    (vote, started): (PathVote, Instant),
) -> Result<PathVote, CheckError> {
    let key = keys.network_path_vote(me.node_rank);
    kv.set(key.name(), &key.encode(&vote)).await?;
    kv.tally(&keys.network_path_votes()).await?;
    let decided = keys.network_path();
    let left = |d: Duration| (started + d).saturating_duration_since(Instant::now());
    if me.node_rank != 0 {
        let raw = kv
            .get(decided.name(), left(VOTE_WAIT + GATHER_WAIT))
            .await?;
        return Ok(decided.decode(&raw)?);
    }
    // One node over TCP makes the round TCP: this node's own word decides at once.
    let path = match vote {
        PathVote::Tcp { why } => PathVote::Tcp {
            why: format!("node 0: {why}"),
        },
        PathVote::Torch { .. } => {
            counted(kv, &keys.network_path_votes(), me.nnodes, left(VOTE_WAIT)).await?;
            let all: Vec<Key<PathVote>> =
                (0..me.nnodes).map(|n| keys.network_path_vote(n)).collect();
            let votes = read_present(kv, &all).await?;
            let votes = (0..me.nnodes)
                .zip(votes)
                .filter_map(|(n, v)| Some((n, v?)))
                .collect();
            PathVote::decide(me.nnodes, &votes)
        }
    };
    kv.set(decided.name(), &decided.encode(&path)).await?;
    Ok(path)
}

/// The schedule's paths measured by this node's torch probe, phase by phase: what
/// it received, all it finished where it failed (said here), and the probe, to be
/// waited for (`TorchProbe::end`) while the records and report go round.
pub(super) async fn through_torch(
    (mut probe, (host, port), env): Ready<'_>,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    backend: String,
) -> ((Vec<PathFigure>, DataPath), TorchProbe) {
    let params = Params {
        host,
        port,
        prefix: keys.torch_probe_prefix(),
        backend: probe.backend.as_str(),
        node: me.node_rank,
        nnodes: me.nnodes,
        phases: rounds(me.nnodes).iter().flat_map(|r| phases(r)).collect(),
        timeout_s: PROBE_TIMEOUT.as_secs(),
        debug_file: probe.debug_file.clone(),
        env,
    };
    let m = probe.measure(&params).await;
    if let Some(why) = &m.failed {
        crate::console::say_warning!("network check: this node's torch probe failed ({why}); what it measured before is kept, the rest is not judged");
    }
    let start_s = m.failed.is_none().then_some(m.start_s);
    let net = m.net;
    let path = DataPath::Torch {
        backend,
        net,
        start_s,
    };
    ((m.received, path), probe)
}

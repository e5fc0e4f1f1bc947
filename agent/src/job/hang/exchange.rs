//! The job-wide hang decision on several nodes. Each node publishes, at every
//! sample, how long its ranks have stood still (and, past half the timeout, where
//! they stand) under `stacks/<node>` in the workers' store; the node hosting that
//! store declares the hang once every node has stood still for the timeout, prints
//! one view naming each odd rank's node, host and local rank, and writes it under
//! `hang`, where the other nodes read and print it. Where the ranks load toporun's
//! NCCL profiler plugin, each record also carries the node's NCCL counters, and its
//! stacks once the counters stood still: the deciding node follows the counters
//! merged, by the rule one node uses (`nccl_verdict`), and the others read its
//! notices at every sample (a rank spinning in Python never stands still).

use crate::job::hang::node_sample::NodeSample;
use crate::job::hang::watch::LEFT_STALL;
use crate::job::hang::watch::{HangReport, Sink};
use crate::job::session::meeting::Meeting;
use crate::job::spec::HangWatch;
use crate::store::{StoreClient, StoreError};
use std::time::Duration;
use tokio::sync::watch;
use toporun_shared::nccl_counters::{NcclWatch, NodeReading};
use toporun_shared::stacks::hang_report::{Hang, HangNotice as Notice};
use toporun_shared::stacks::job_view::{context, flatten, job_hung, NodeStacks};
use toporun_shared::stacks::standing::Standing;
use toporun_shared::stacks::teardown::teardown_cause;
use toporun_shared::stacks::{
    busy_line, counters_alone, nccl_verdict, CountersAlone, NcclVerdict, Places,
};

struct State {
    /// The current hang is said (by either rule: one flag, so one hang is said once).
    reported: bool,
    seq: u32,
    /// The job's NCCL counters as the deciding node follows them.
    nccl: NcclWatch,
    /// A busy rank whose work moves was said (once a stall).
    busy_said: bool,
}

/// What the NCCL counters made of a node's step.
enum NcclStepped {
    /// They decided (a notice said, or nothing to say).
    Decided,
    /// The stacks decide, on these records (the deciding node's read of every node's,
    /// so that the stack rule does not read them again).
    StackRule(Vec<NodeStacks>),
}

/// What the deciding node's NCCL rule makes of a step.
enum NcclStep {
    /// The stacks decide.
    StackRule,
    /// The counters decide: nothing to say now.
    Quiet,
    /// The job hangs: this notice to write and say.
    Say(Notice),
    /// No hang: a rank behind is busy on work that moves (or, without stacks, busy
    /// on work toporun cannot see); this line to say, once a stall.
    Busy(String),
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
            nccl: NcclWatch::default(),
            busy_said: false,
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

impl State {
    /// Operations moved: a later hang or busy rank is said anew.
    fn moved(&mut self) {
        (self.reported, self.busy_said) = (false, false);
    }
}

/// A busy rank's line, said once a stall (and not after a hang was said).
fn busy_once(state: &mut State, line: String) -> NcclStep {
    if state.busy_said || state.reported {
        return NcclStep::Quiet;
    }
    state.busy_said = true;
    NcclStep::Busy(line)
}

/// An odd rank in its teardown: what it said before, on whichever node it runs.
fn with_teardown_cause(hang: &mut Hang, nodes: &[NodeStacks]) {
    let said = nodes.iter().flat_map(|n| n.said.clone()).collect();
    if let Some(cause) = teardown_cause(hang, &said) {
        hang.headline.push_str(&cause);
    }
}

fn say_decided(n: &Notice) {
    let why = match n.hang.trigger {
        // NCCL's counters or its watchdog: the stacks of a rank behind may move.
        Some(_) => "found the job's NCCL operations stalled",
        None => "found no rank of any node making progress",
    };
    crate::console::say!(
        "toporun: hang: node {} (hosting the workers' store) {why}; its job-wide view:",
        n.decider
    );
}

/// Prints the job-wide view a node stopped for a hang had not read yet (the stop
/// can come before its next sample).
pub async fn print_decided(m: &Meeting) {
    let Ok(mut c) = m.connect().await else { return };
    if let Ok(Some(n)) = m.read_notice(&mut c, 0).await {
        say_decided(&n);
        crate::console::say_raw!("{}", n.text);
    }
}

/// A job-wide notice said here: counted, and not said again.
fn said(n: Notice, state: &mut State, sink: &Sink) {
    state.seq = n.seq;
    state.reported = true;
    sink.found(HangReport {
        hang: n.hang,
        text: n.text,
        watchdog: None,
        by_counters: false,
    });
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
        // With NCCL's counters the stacks travel once the counters stand: a rank
        // spinning in Python never stands still, and the deciding node needs where
        // every rank stands.
        let shown = if s.nccl_still || s.stalled >= watch.timeout / 2 || early {
            s.stacks.as_slice()
        } else {
            &[]
        };
        let mine = NodeStacks::new(self.node_rank, hostname, s.stalled, shown)
            .with_context(&s.context)
            .with_said(&s.said)
            .with_nccl(s.nccl.clone());
        let mine = NodeStacks {
            no_stacks: s.no_stacks,
            ..mine
        };
        // Its own encoding: frames cut until it fits the store's bound.
        let key = self.keys.stacks(self.node_rank);
        c.set(key.name(), &mine.encode()).await?;
        let mut read = None;
        if s.nccl.is_some() {
            match self.nccl_step(c, watch.timeout, state, sink).await? {
                NcclStepped::Decided => return Ok(()),
                NcclStepped::StackRule(nodes) => read = Some(nodes),
            }
        }
        if s.stalled < watch.timeout.min(LEFT_STALL) {
            state.reported = false;
            return Ok(());
        }
        if state.reported {
            return Ok(());
        }
        let found = if self.decides {
            self.decide(c, watch.timeout, state.seq + 1, read).await?
        } else {
            self.read_notice(c, state.seq).await?
        };
        if let Some(n) = found {
            if !self.decides {
                say_decided(&n);
            }
            said(n, state, sink);
        }
        Ok(())
    }

    /// With NCCL's counters: whether they decided this step (else the stacks do).
    /// The deciding node follows every node's counters as one; the others read its
    /// notices at every step, since their own ranks may never stand still.
    async fn nccl_step(
        &self,
        c: &mut StoreClient,
        timeout: Duration,
        state: &mut State,
        sink: &Sink,
    ) -> Result<NcclStepped, StoreError> {
        let notice = if self.decides {
            let nodes: Vec<NodeStacks> = self
                .gather(c, |n| self.keys.stacks(n), Duration::ZERO)
                .await?;
            match self.nccl_decide(&nodes, timeout, state) {
                NcclStep::StackRule => return Ok(NcclStepped::StackRule(nodes)),
                NcclStep::Quiet => return Ok(NcclStepped::Decided),
                NcclStep::Busy(line) => {
                    crate::console::say!("toporun: no hang said: {line}");
                    return Ok(NcclStepped::Decided);
                }
                NcclStep::Say(n) => {
                    self.write(c, &self.keys.hang(), &n).await?;
                    n
                }
            }
        } else {
            match self.read_notice(c, state.seq).await? {
                Some(n) => {
                    say_decided(&n);
                    n
                }
                None => return Ok(NcclStepped::Decided),
            }
        };
        said(notice, state, sink);
        Ok(NcclStepped::Decided)
    }

    /// The deciding node's NCCL verdict on every node's record: the stacks decide
    /// where a node was not heard from or has no counters.
    fn nccl_decide(&self, nodes: &[NodeStacks], timeout: Duration, state: &mut State) -> NcclStep {
        let all = (0..self.nnodes).all(|n| nodes.iter().any(|s| s.node_rank == n));
        if !all || nodes.iter().any(|n| n.nccl.is_none()) {
            return NcclStep::StackRule;
        }
        // A node without stacks has only its counters, and its ranks' failed reads
        // say nothing of where they stand: the counters alone decide for the job.
        if nodes.iter().any(|n| n.no_stacks) {
            return self.counters_decide(nodes, timeout, state);
        }
        let reading = NodeReading::merge(nodes.iter().filter_map(|n| n.nccl.as_ref()));
        let (stacks, places) = flatten(nodes);
        let ctx = context(nodes);
        let now = std::time::Instant::now();
        match nccl_verdict(
            &mut state.nccl,
            reading,
            &stacks,
            &places,
            &ctx,
            timeout,
            now,
        ) {
            NcclVerdict::StackRule => NcclStep::StackRule,
            NcclVerdict::Moving => {
                // Operations move: a later hang, by either rule, is said anew.
                state.moved();
                NcclStep::Quiet
            }
            NcclVerdict::Waiting => NcclStep::Quiet,
            NcclVerdict::Busy { hang, gpu, .. } => busy_once(state, busy_line(&hang, gpu)),
            NcclVerdict::Hang(_) if state.reported => NcclStep::Quiet,
            NcclVerdict::Hang(mut hang) => {
                with_teardown_cause(&mut hang, nodes);
                self.notice(hang, &places, state)
            }
        }
    }

    /// Some node's ranks without stacks (a C, C++ or JAX job, or stacks refused on a
    /// node): the counters merged decide alone, as on one node.
    fn counters_decide(
        &self,
        nodes: &[NodeStacks],
        timeout: Duration,
        state: &mut State,
    ) -> NcclStep {
        let reading = NodeReading::merge(nodes.iter().filter_map(|n| n.nccl.as_ref()));
        let (_, places) = flatten(nodes);
        let now = std::time::Instant::now();
        match counters_alone(&mut state.nccl, reading, &places, timeout, now) {
            CountersAlone::Quiet | CountersAlone::Moving => {
                state.moved();
                NcclStep::Quiet
            }
            CountersAlone::Waiting => NcclStep::Quiet,
            CountersAlone::Busy(line) => busy_once(state, line),
            CountersAlone::Hang(_) if state.reported => NcclStep::Quiet,
            CountersAlone::Hang(hang) => self.notice(hang, &places, state),
        }
    }

    fn notice(&self, hang: Hang, places: &Places, state: &State) -> NcclStep {
        NcclStep::Say(Notice {
            seq: state.seq + 1,
            decider: self.node_rank,
            text: hang.text(places),
            hang,
        })
    }

    /// Reads every node's record (unless this step read them already); a notice when
    /// the whole job hangs.
    async fn decide(
        &self,
        c: &mut StoreClient,
        timeout: Duration,
        seq: u32,
        read: Option<Vec<NodeStacks>>,
    ) -> Result<Option<Notice>, StoreError> {
        let nodes: Vec<NodeStacks> = match read {
            Some(nodes) => nodes,
            None => {
                self.gather(c, |n| self.keys.stacks(n), Duration::ZERO)
                    .await?
            }
        };
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
        let mut hang = Hang::with(&stacks, &places, stalled, timeout, &ctx);
        with_teardown_cause(&mut hang, &nodes);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::RunKeys;
    use toporun_shared::nccl_counters::words::Words;
    use toporun_shared::nccl_counters::{decode, NcclFunc};
    use toporun_shared::stacks::teardown::LastSaid;
    use toporun_shared::stacks::{Frame, RankStack, ThreadStack};

    fn deciding(nnodes: u32) -> Meeting {
        Meeting {
            host: "127.0.0.1".into(),
            port: 0,
            keys: RunKeys::new("t", None).round(0),
            node_rank: 0,
            nnodes,
            decides: true,
        }
    }

    fn state() -> State {
        State {
            reported: false,
            seq: 0,
            nccl: NcclWatch::default(),
            busy_said: false,
        }
    }

    /// Global rank `rank` alone on node `rank`, its main thread at `frame`, having
    /// posted `posted` all_reduces of a 2-rank communicator and completed `done`.
    fn node(rank: u32, frame: (&str, &str), posted: u64, done: u64) -> NodeStacks {
        let stack = RankStack {
            rank,
            local_rank: 0,
            pid: 100 + rank as i32,
            threads: vec![ThreadStack {
                thread: Some("MainThread".into()),
                frames: vec![Frame {
                    function: frame.1.into(),
                    file: frame.0.into(),
                    line: 7,
                }],
                idle: false,
            }],
            error: None,
        };
        let mut w = Words::default();
        w.comm(0, 0xab, rank, 2)
            .ops(0, NcclFunc::AllReduce, 64, posted, done, 1000);
        let reading = NodeReading {
            live: vec![rank],
            counters: [(rank, decode(&w.bytes()).unwrap())].into(),
            ..Default::default()
        };
        NodeStacks::new(rank, &format!("trainer-{rank}"), Duration::ZERO, &[stack])
            .with_nccl(Some(reading.for_exchange()))
    }

    /// The same node with rank `rank`'s CPU time at `cpu_s` and its GPU running
    /// kernels lately or not.
    fn busy(mut n: NodeStacks, rank: u32, cpu_s: u64, gpu: bool) -> NodeStacks {
        let r = n.nccl.as_mut().unwrap();
        r.cpu.insert(rank, Duration::from_secs(cpu_s));
        r.gpu_busy.insert(rank, gpu);
        n
    }

    /// The same node as a C, C++ or JAX program's: no stack reads, the failed read
    /// says where the rank runs (through JSON, as the store carries it).
    fn without_stacks(mut n: NodeStacks) -> NodeStacks {
        for r in &mut n.ranks {
            r.threads.clear();
            r.error = Some("no Python interpreter found in the process".into());
        }
        n.no_stacks = true;
        serde_json::from_slice(&n.encode()).unwrap()
    }

    const SYNC: (&str, &str) = ("/venv/lib/torch/cuda/streams.py", "synchronize");
    const EVAL: (&str, &str) = ("/app/train.py", "evaluate");
    const SPIN: (&str, &str) = ("/app/train.py", "parse_record");

    /// Rank 0 (node 0) waits on its GPU in operation 11 while rank 1 (node 1) spins in
    /// Python, its stack moving, never posting it: the deciding node names rank 1 from
    /// the two nodes' counters, once (what the nodes' sampler does after a notice:
    /// `reported`), and again after operations moved.
    #[test]
    fn the_deciding_node_names_a_spinning_rank_on_another_node_from_the_counters() {
        let m = deciding(2);
        let mut s = state();
        let stuck = || vec![node(0, SYNC, 11, 10), node(1, SPIN, 10, 10)];
        let timeout = Duration::ZERO;
        assert!(matches!(
            m.nccl_decide(&stuck(), timeout, &mut s),
            NcclStep::Quiet
        ));
        let NcclStep::Say(n) = m.nccl_decide(&stuck(), timeout, &mut s) else {
            panic!("no hang decided");
        };
        assert_eq!((n.seq, n.decider), (1, 0));
        let said = "rank 1 never posted all_reduce (64 B, operation 11";
        assert!(n.text.contains(said), "{}", n.text);
        assert!(n.text.contains("in the job"), "{}", n.text);
        assert!(n.text.contains("trainer-1"), "{}", n.text);
        (s.seq, s.reported) = (n.seq, true);
        assert!(matches!(
            m.nccl_decide(&stuck(), timeout, &mut s),
            NcclStep::Quiet
        ));
        let moved = vec![node(0, SYNC, 12, 11), node(1, SPIN, 12, 11)];
        assert!(matches!(
            m.nccl_decide(&moved, timeout, &mut s),
            NcclStep::Quiet
        ));
        assert!(!s.reported, "operations moved: a later hang is said anew");
        // A node not heard from, or one without counters: the stacks decide.
        let one = stuck()[..1].to_vec();
        assert!(matches!(
            m.nccl_decide(&one, timeout, &mut s),
            NcclStep::StackRule
        ));
        let mut bare = stuck();
        bare[1].nccl = None;
        assert!(matches!(
            m.nccl_decide(&bare, timeout, &mut s),
            NcclStep::StackRule
        ));
    }

    /// A hang the stack rule said first (a notice, `reported`) is not said again when
    /// the counters' stall reaches the timeout.
    #[test]
    fn a_hang_said_by_the_stacks_is_not_said_again_by_the_counters() {
        let m = deciding(2);
        let mut s = state();
        let stuck = || vec![node(0, SYNC, 11, 10), node(1, SPIN, 10, 10)];
        m.nccl_decide(&stuck(), Duration::ZERO, &mut s);
        (s.seq, s.reported) = (1, true);
        assert!(matches!(
            m.nccl_decide(&stuck(), Duration::ZERO, &mut s),
            NcclStep::Quiet
        ));
    }

    /// Lightning on two nodes: rank 1 raised, its framework caught it and now tears
    /// its process group down while rank 0 waits in the next all_reduce. What rank 1
    /// raised travels with its node's record (through JSON, as the store carries it)
    /// and the deciding node says it as the cause.
    #[test]
    fn what_a_rank_on_another_node_raised_before_its_teardown_is_the_cause() {
        let m = deciding(2);
        let mut s = state();
        let teardown = (
            "/venv/lib/torch/distributed/distributed_c10d.py",
            "destroy_process_group",
        );
        let raised = LastSaid::Raised("RuntimeError: loss became NaN (train.py:82)".into());
        let stuck = || {
            let n1 = node(1, teardown, 10, 10).with_said(&[(1, raised.clone())].into());
            let n1: NodeStacks = serde_json::from_slice(&n1.encode()).unwrap();
            vec![node(0, SYNC, 11, 10), n1]
        };
        m.nccl_decide(&stuck(), Duration::ZERO, &mut s);
        let NcclStep::Say(n) = m.nccl_decide(&stuck(), Duration::ZERO, &mut s) else {
            panic!("no hang decided");
        };
        assert!(
            n.hang.headline.contains("before its teardown rank 1 raised RuntimeError: loss became NaN (train.py:82): that is the cause"),
            "{}",
            n.hang.headline
        );
        // Without its words, the headline is the counters' alone.
        let mut s = state();
        let bare = || vec![node(0, SYNC, 11, 10), node(1, teardown, 10, 10)];
        m.nccl_decide(&bare(), Duration::ZERO, &mut s);
        let NcclStep::Say(n) = m.nccl_decide(&bare(), Duration::ZERO, &mut s) else {
            panic!("no hang decided");
        };
        assert!(
            !n.hang.headline.contains("teardown rank 1 raised"),
            "{}",
            n.hang.headline
        );
    }

    /// Rank 1 (node 1) evaluates alone, its CPU and its GPU busy, while rank 0 (node
    /// 0) waits in the next all_reduce: the deciding node says once that its work
    /// moves and stops nothing; with its GPU idle (a loop in Python) the hang stands.
    #[test]
    fn a_busy_rank_on_another_node_whose_gpu_runs_is_said_once_never_a_hang() {
        let m = deciding(2);
        let mut s = state();
        let at = |cpu_s, gpu| {
            vec![
                node(0, SYNC, 11, 10),
                busy(node(1, EVAL, 10, 10), 1, cpu_s, gpu),
            ]
        };
        let t = Duration::ZERO;
        assert!(matches!(
            m.nccl_decide(&at(0, true), t, &mut s),
            NcclStep::Quiet
        ));
        let NcclStep::Busy(line) = m.nccl_decide(&at(30, true), t, &mut s) else {
            panic!("a busy rank whose GPU runs was not said as such");
        };
        assert!(line.contains("rank 1"), "{line}");
        assert!(
            line.contains("its work moves, and toporun stops nothing"),
            "{line}"
        );
        assert!(matches!(
            m.nccl_decide(&at(60, true), t, &mut s),
            NcclStep::Quiet
        ));
        assert!(!s.reported, "a busy rank's work is no hang");
        // Its GPU idle now: a loop of its own, the hang.
        let mut s = state();
        m.nccl_decide(&at(0, false), t, &mut s);
        let NcclStep::Say(n) = m.nccl_decide(&at(30, false), t, &mut s) else {
            panic!("a busy rank with an idle GPU was not said hung");
        };
        assert!(n.text.contains("rank 1 never posted"), "{}", n.text);
    }

    /// A C++ program on two nodes: no stack reads anywhere. Rank 1 (node 1) sits in a
    /// read, its CPU idle, never posting operation 11: the counters alone name it and
    /// its node; busy instead, it is said once and nothing is stopped; operations
    /// moving again say nothing.
    #[test]
    fn without_stacks_on_any_node_the_counters_alone_decide_across_nodes() {
        let m = deciding(2);
        let t = Duration::ZERO;
        let at = |cpu_s| {
            vec![
                without_stacks(node(0, SYNC, 11, 10)),
                without_stacks(busy(node(1, SPIN, 10, 10), 1, cpu_s, false)),
            ]
        };
        let mut s = state();
        assert!(matches!(m.nccl_decide(&at(0), t, &mut s), NcclStep::Quiet));
        let NcclStep::Say(n) = m.nccl_decide(&at(0), t, &mut s) else {
            panic!("no hang decided from the counters alone");
        };
        assert!(
            n.text.contains("rank 1 never posted all_reduce"),
            "{}",
            n.text
        );
        assert!(n.text.contains("trainer-1"), "{}", n.text);
        assert!(n.text.contains("the counters alone decide"), "{}", n.text);
        let mut s = state();
        m.nccl_decide(&at(0), t, &mut s);
        assert!(matches!(
            m.nccl_decide(&at(30), t, &mut s),
            NcclStep::Busy(_)
        ));
        assert!(matches!(m.nccl_decide(&at(60), t, &mut s), NcclStep::Quiet));
        assert!(!s.reported);
        let moved = vec![
            without_stacks(node(0, SYNC, 12, 11)),
            without_stacks(node(1, SPIN, 12, 11)),
        ];
        assert!(matches!(m.nccl_decide(&moved, t, &mut s), NcclStep::Quiet));
        assert!(
            !s.busy_said,
            "operations moved: a later busy rank is said anew"
        );
    }

    /// Node 0's stacks read (its rank waits in the all_reduce), node 1's do not (a
    /// rank that refuses ptrace): the counters alone decide, and node 1's failed read
    /// is never taken for a place the rank stands.
    #[test]
    fn with_one_node_s_stacks_unread_the_counters_alone_decide_for_the_job() {
        let m = deciding(2);
        let t = Duration::ZERO;
        let at = || vec![node(0, SYNC, 11, 10), without_stacks(node(1, SPIN, 10, 10))];
        let mut s = state();
        assert!(matches!(m.nccl_decide(&at(), t, &mut s), NcclStep::Quiet));
        let NcclStep::Say(n) = m.nccl_decide(&at(), t, &mut s) else {
            panic!("no hang decided with one node's stacks unread");
        };
        assert_eq!(n.hang.odd, vec![1]);
        assert!(
            n.text.contains("rank 1 never posted all_reduce"),
            "{}",
            n.text
        );
        assert!(n.text.contains("trainer-1"), "{}", n.text);
    }
}

//! What one H200 (torch 2.11, NCCL 2.28.9) gave for hangs judged across nodes, kept
//! under tests/fixtures/device/cross-node-hang-h200x1
//! (`scripts/device/gpu_cross_node_hang.sh`): two toporun nodes of one rank each on
//! loopback, NCCL over sockets between them; and the real trainers run the same way,
//! under tests/fixtures/device/cross-node-trainers-h200x1. The readings are the two
//! nodes' counters files merged, as the deciding node merges the nodes' records.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use toporun_shared::nccl_counters::{NcclWatch, NodeReading};
use toporun_shared::stacks::hang_report::{Context, Hang};
use toporun_shared::stacks::teardown::{teardown_cause, LastSaid};
use toporun_shared::stacks::{
    counters_alone, nccl_verdict, CountersAlone, Frame, NcclVerdict, Place, Places, RankStack,
    ThreadStack,
};

const SET: &str = "cross-node-hang-h200x1";
const TIMEOUT: Duration = Duration::from_secs(15);

/// Node `rank` holding global rank `rank`, its counters file at `path` in the set,
/// its main thread's CPU time at `cpu`.
fn node(rank: u32, path: &str, cpu: Duration, gpu_busy: bool) -> NodeReading {
    let file = format!("{path}/rank_{rank}.gz");
    NodeReading {
        live: vec![rank],
        counters: [(rank, common::counters_file(SET, &file))].into(),
        cpu: [(rank, cpu)].into(),
        gpu_busy: [(rank, gpu_busy)].into(),
        ..Default::default()
    }
}

/// Both nodes' readings as the deciding node merges them.
fn job(nodes: [NodeReading; 2]) -> NodeReading {
    NodeReading::merge(
        nodes
            .iter()
            .map(|n| n.clone().for_exchange())
            .collect::<Vec<_>>()
            .iter(),
    )
}

/// Global rank r on node r (host `vm`, local rank 0), as the nodes' records say.
fn places() -> Places {
    let at = |n: u32| {
        (
            Place {
                node_rank: n,
                host: "vm".into(),
            },
            0,
        )
    };
    [(0, at(0)), (1, at(1))].into()
}

fn stack(rank: u32, function: &str, file: &str, line: i32) -> RankStack {
    RankStack {
        rank,
        local_rank: 0,
        pid: 100 + rank as i32,
        threads: vec![ThreadStack {
            thread: Some("MainThread".into()),
            frames: vec![Frame {
                function: function.into(),
                file: file.into(),
                line,
            }],
            idle: false,
        }],
        error: None,
    }
}

/// Rank `rank`'s main thread in torch's all_reduce.
fn in_all_reduce(rank: u32) -> RankStack {
    let c10d = "/torch/distributed/distributed_c10d.py";
    stack(rank, "all_reduce", c10d, 2950)
}

/// `eval`: rank 1 evaluates alone for 35 s (Python and GPU work) while rank 0 waits
/// in an all_reduce. Both nodes' counters were copied at 26 s and 34 s of the run,
/// inside the stall; the test puts 16 s between its two readings (the stall lasted
/// 35 s, nothing moving) and gives rank 1 the CPU the run measured (100%). The GPU
/// was at 100% through the evaluation (gpu-util-eval.csv), rank 1's work and rank
/// 0's NCCL kernel together on this one GPU: with it active, rank 1's work moves
/// and no hang is said (the run: exit 0 under --on-hang stop, the build before
/// stopped it, exit 124); with it idle the same counters are the hang.
#[test]
fn a_rank_evaluating_alone_on_another_node_is_busy_not_hung() {
    let stacks = [
        in_all_reduce(0),
        stack(
            1,
            "evaluate",
            "scripts/device/gpu_profiler_hang_rank.py",
            44,
        ),
    ];
    let verdict = |gpu: bool| {
        let at = |path: &str, cpu_s: u64| {
            job([
                node(0, path, Duration::ZERO, false),
                node(1, path, Duration::from_secs(cpu_s), gpu),
            ])
        };
        assert_eq!(
            at("eval/at26", 0).marks(),
            at("eval/at34", 0).marks(),
            "the stall"
        );
        let (mut w, t0, ctx) = (NcclWatch::default(), Instant::now(), Context::default());
        let first = nccl_verdict(
            &mut w,
            at("eval/at26", 0),
            &stacks,
            &places(),
            &ctx,
            TIMEOUT,
            t0,
        );
        assert!(matches!(first, NcclVerdict::Moving), "{first:?}");
        let later = t0 + Duration::from_secs(16);
        nccl_verdict(
            &mut w,
            at("eval/at34", 16),
            &stacks,
            &places(),
            &ctx,
            TIMEOUT,
            later,
        )
    };
    let NcclVerdict::Busy { hang, busy, .. } = verdict(true) else {
        panic!("an evaluation whose GPU runs was said hung")
    };
    assert_eq!(busy, vec![1]);
    assert!(
        hang.headline
            .contains("rank 1 (node 1 on vm, local rank 0) is busy"),
        "{}",
        hang.headline
    );
    assert!(hang.headline.contains("in evaluate"), "{}", hang.headline);
    let NcclVerdict::Hang(hang) = verdict(false) else {
        panic!("busy with an idle GPU: the hang")
    };
    assert_eq!(hang.odd, vec![1]);
}

/// `cjob-stuck`: the C program on NCCL alone (no stack reads on either node), rank 1
/// blocked in a read before step 200 while rank 0 waits in its all_reduce; each
/// node's counters as the attempt's end left them. The counters alone name rank 1
/// and its node, stuck (its CPU idle); the build before said only "hang detection
/// paused" on both nodes and named nobody until the run's deadline.
#[test]
fn a_stuck_rank_of_a_c_program_on_another_node_is_named_from_the_counters_alone() {
    let at = || {
        job([
            node(
                0,
                "cjob-stuck/nccl-counters0",
                Duration::from_secs(9),
                false,
            ),
            node(1, "cjob-stuck/nccl-counters1", Duration::ZERO, false),
        ])
    };
    let (mut w, t0) = (NcclWatch::default(), Instant::now());
    assert!(matches!(
        counters_alone(&mut w, at(), &places(), TIMEOUT, t0),
        CountersAlone::Moving
    ));
    let later = t0 + Duration::from_secs(16);
    let CountersAlone::Hang(hang) = counters_alone(&mut w, at(), &places(), TIMEOUT, later) else {
        panic!("the stuck rank was not named")
    };
    assert_eq!(hang.odd, vec![1]);
    assert!(
        hang.headline
            .starts_with("rank 1 never posted all_reduce (16 MiB, operation 201"),
        "{}",
        hang.headline
    );
    assert!(
        hang.headline
            .contains("rank 1 (node 1 on vm, local rank 0) is stuck (CPU 0%"),
        "{}",
        hang.headline
    );
}

const TRAINERS: &str = "cross-node-trainers-h200x1";

/// A node of tests/fixtures/device/cross-node-trainers-h200x1: rank `rank`'s counters
/// as the attempt's end left them.
fn trainer_node(run: &str, rank: u32) -> NodeReading {
    let file = format!("{run}/nccl-counters{rank}/rank_{rank}.gz");
    NodeReading {
        live: vec![rank],
        counters: [(rank, common::counters_file(TRAINERS, &file))].into(),
        cpu: [(rank, Duration::ZERO)].into(),
        ..Default::default()
    }
}

/// `pipeline`: torch's pipelining on two nodes, stage 0 sending activations to stage 1
/// and gradients back. Real NCCL set the plugin's point-to-point bit on the stages'
/// communicator on both ranks, so the hang and GPU-time rules leave it out.
#[test]
fn a_pipeline_s_stages_are_known_to_carry_point_to_point_on_both_nodes() {
    for rank in [0, 1] {
        let n = trainer_node("pipeline", rank);
        let c = &n.counters[&rank];
        assert!(
            c.comms.iter().any(|c| c.posted_p2p && c.carries_p2p()),
            "rank {rank}: {c:?}"
        );
    }
}

/// `hf-skip`: Transformers' Trainer on two nodes, rank 0 in an all_reduce on a side
/// group that rank 1 never posts, rank 1 in the default group's next all_reduce. The
/// counters merged (read twice, 16 s apart, nothing moving) name rank 0 as waiting in
/// the side group's operation that rank 1 never posted: the collectives called in
/// different orders, as the run said at its first report.
#[test]
fn a_collective_skipped_on_a_side_group_across_nodes_is_named_from_the_counters() {
    let at = || job([trainer_node("hf-skip", 0), trainer_node("hf-skip", 1)]);
    let stacks = [in_all_reduce(0), in_all_reduce(1)];
    let (mut w, t0, ctx) = (NcclWatch::default(), Instant::now(), Context::default());
    nccl_verdict(&mut w, at(), &stacks, &places(), &ctx, TIMEOUT, t0);
    let later = t0 + Duration::from_secs(16);
    let NcclVerdict::Hang(hang) =
        nccl_verdict(&mut w, at(), &stacks, &places(), &ctx, TIMEOUT, later)
    else {
        panic!("the skip was not said")
    };
    assert!(
        hang.headline
            .starts_with("rank 0 never posted all_reduce (4 B, operation 418"),
        "{}",
        hang.headline
    );
    assert!(
        hang.headline.contains("which rank 1 never posted"),
        "{}",
        hang.headline
    );
    assert!(
        hang.headline.contains("in different orders"),
        "{}",
        hang.headline
    );
}

/// `lightning-teardown`: rank 1 queued an all_reduce on a side group rank 0 never
/// joins, then raised; Lightning caught the exception and tore down, and its
/// teardown (moving the optimizers' state to the CPU) waits for that all_reduce on
/// the GPU, with the exception not printed yet: its last lines are Lightning's start
/// (`rank1-output.txt`), which say nothing of it. The hang as the deciding node built
/// it (`hang.json`) gets the clause that says so.
#[test]
fn a_rank_in_lightning_s_teardown_after_an_exception_is_said_so() {
    let read = |f: &str| {
        let path = common::device_fixture(TRAINERS, &format!("lightning-teardown/{f}"));
        std::fs::read_to_string(path).unwrap()
    };
    let hang: Hang = serde_json::from_str(&read("hang.json")).unwrap();
    assert!(
        hang.headline.contains("in different orders"),
        "{}",
        hang.headline
    );
    let words = LastSaid::of(&read("rank1-output.txt")).unwrap();
    assert!(matches!(&words, LastSaid::Words(w) if w.contains("CUDA_VISIBLE_DEVICES")));
    let said: BTreeMap<u32, LastSaid> = [(1, words)].into();
    let clause = teardown_cause(&hang, &said).expect("the teardown said");
    assert!(
        clause.starts_with("; rank 1 is in Lightning's teardown after it caught an exception or an interrupt (Trainer._teardown from _call_and_handle_interrupt): it reports what it caught only once the teardown returns, and the teardown, moving the optimizers' state to the CPU, waits for what is still queued on its GPU"),
        "{clause}"
    );
}

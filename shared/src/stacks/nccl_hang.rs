//! The hang NCCL's own counters show: ranks wait in an operation and none completed
//! for the timeout. The ranks that never posted it lead the report, each said to be
//! busy (its CPU ran: a loop that does not end, a step only it runs) or stuck (its
//! CPU idled: I/O, a lock, a worker), where its stack stands.

use super::hang_report::{ranks_word, Context, Hang};
use super::merge::{rank_label, ranks_text, Places};
use super::model::RankStack;
use super::standing::Standing;
use crate::nccl_counters::mismatch::{Mismatch, OddBy};
use crate::nccl_counters::{
    Behind, NcclStall, NcclState, NcclWatch, NodeReading, PostedOp, WaitedOp,
};
use crate::units::format_size;
use std::time::{Duration, Instant};

/// `all_reduce (4.0 MiB, operation 214 on communicator 0x1a2b)`.
fn op_text(op: &PostedOp, comm: u64) -> String {
    let size = match op.bytes {
        0 => String::new(),
        b => format!("{}, ", format_size(b)),
    };
    format!(
        "{} ({size}operation {} on communicator {comm:#x})",
        op.func.kind(),
        op.index + 1
    )
}

/// What one rank behind is doing, and where: waiting elsewhere where its stack
/// waits (another group's collective, a sync on its GPU: a spinning wait is no
/// loop of its own), else busy or stuck by its CPU.
fn behind_text(
    b: &Behind,
    stands: Option<&(u32, Standing, String)>,
    stalled: f64,
    stopped: bool,
) -> String {
    let place = stands.map(|s| format!(" in {}", s.2)).unwrap_or_default();
    if stopped {
        return format!("is stopped (process state T: SIGSTOP, Ctrl-Z or a debugger holds it){place} and runs nothing: `kill -CONT` its process, or find what stopped it");
    }
    if let Some(w) = &b.waits_in {
        return format!(
            "waits in {}, which {} never posted: the ranks called these communicators' collectives in different orders (a collective skipped or added on some rank)",
            op_text(&w.op, w.comm),
            ranks_word(&w.behind)
        );
    }
    if let Some((_, st, at)) = stands.filter(|s| s.1.waits()) {
        return format!("{} in {at}, not in this group's operation", st.verb());
    }
    let cpu = |s: f64| format!("CPU {:.0}% of the {stalled:.0}s", s * 100.0);
    match (b.busy(), b.cpu_share) {
        (Some(true), Some(s)) => format!(
            "is busy ({}){place}: a loop that does not end, or a step only it runs (an evaluation, a checkpoint) longer than --hang-timeout: raise --hang-timeout if that is expected",
            cpu(s)
        ),
        (Some(false), Some(s)) => format!(
            "is stuck ({}){place}: it waits on something outside NCCL (I/O, a lock, a DataLoader worker)",
            cpu(s)
        ),
        _ => format!("stands{place}"),
    }
}

/// The ranks' different operations under one index, and which side left the others'
/// sequence where the counters say.
fn mismatch_text(m: &Mismatch) -> String {
    let shown = |op: &PostedOp| match op.bytes {
        0 => op.func.kind().to_string(),
        b => format!("{} of {}", op.func.kind(), format_size(b)),
    };
    let parts: Vec<String> = m
        .groups
        .iter()
        .map(|(ranks, op)| format!("{} {}", ranks_word(ranks), shown(op)))
        .collect();
    let first = ranks_word(&m.groups[0].0);
    let n = m.index + 1;
    let which = match m.odd {
        Some(OddBy::Skipped) => format!(
            "{first} skipped the others' operation {n}, {}: what {first} posted there is what the others posted next, and its later operations are shifted by one",
            shown(&m.groups[1].1)
        ),
        Some(OddBy::Added) => format!(
            "{first} posted an operation the others did not: what {first} posted next is what the others posted there, and its later operations are shifted by one"
        ),
        Some(OddBy::Majority) => format!("{first} differ from the rest"),
        Some(OddBy::Pattern) => format!(
            "{first} left the pattern of the operations before it ({} on every rank)",
            shown(&m.groups[1].1)
        ),
        None => "which side is off the counters cannot tell (the flight recorder may)".into(),
    };
    format!(
        "the ranks posted different operations as operation {n}: {}: {which}: a collective skipped or added on some rank, or called with other sizes",
        parts.join(", ")
    )
}

/// `; 2 ranks of the group have no such communicator yet (...)`, where some miss.
fn missing_text(missing: u32) -> String {
    match missing {
        0 => String::new(),
        1 => "; 1 rank of the group has no such communicator yet: it never reached the group's creation".into(),
        n => format!("; {n} ranks of the group have no such communicator yet: they never reached the group's creation"),
    }
}

/// What NCCL's counters decide at one reading of a node, or of a job's nodes merged.
#[derive(Debug)]
pub enum NcclVerdict {
    /// Not theirs to decide, the stack rule does: no rank waits in NCCL; sampled with
    /// nobody behind (which operation they wait in is not known, and a phase every
    /// rank spends without collectives reads the same); the waiting ranks' stacks do
    /// not wait; or a rank left while the others wait (the stack rule says it sooner).
    StackRule,
    /// Operations were posted or completed: no hang.
    Moving,
    /// Ranks wait in NCCL, not yet for the timeout.
    Waiting,
    /// Ranks have waited the timeout: the hang to say (once).
    Hang(Hang),
    /// Ranks have waited the timeout, and every rank that never posted the operation
    /// ran its CPU through the wait (`busy`) while its GPU ran kernels, or where its
    /// GPU is not read ([`busy_gpu`]): a step only it runs (an evaluation, a
    /// checkpoint), whose work moves, or cannot be told from a loop. Not a hang: said
    /// once, nothing stopped. Busy with an idle GPU is `Hang`.
    Busy {
        hang: Hang,
        busy: Vec<u32>,
        gpu: BusyGpu,
    },
}

/// What the busy ranks' GPUs say of their work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusyGpu {
    /// Each one's GPU ran kernels lately: its work moves.
    Runs,
    /// Some one's GPU is not read (no NVML utilization: `--stragglers off`, no NVML
    /// in the container, a MIG instance): an evaluation and a loop in Python read the
    /// same, so the hang waits for twice the timeout ([`UNKNOWN_GPU_TIMEOUTS`]).
    Unknown,
}

/// A busy rank whose GPU is not read is the hang once the stall reaches this many
/// timeouts: a loop that does not end is stopped in the end, an evaluation a little
/// longer than the timeout is not.
pub const UNKNOWN_GPU_TIMEOUTS: u32 = 2;

/// The busy ranks' GPUs (`gpu_busy`: whether each rank's GPU ran kernels within the
/// hang watch's window, where known); None where one is idle: a rank spinning in Python, or
/// stuck, leaves its GPU idle once its queue drains, an evaluation keeps it busy.
pub fn busy_gpu(busy: &[u32], gpu_busy: &std::collections::BTreeMap<u32, bool>) -> Option<BusyGpu> {
    if busy.is_empty() || busy.iter().any(|r| gpu_busy.get(r) == Some(&false)) {
        return None;
    }
    match busy.iter().all(|r| gpu_busy.contains_key(r)) {
        true => Some(BusyGpu::Runs),
        false => Some(BusyGpu::Unknown),
    }
}

/// What is said, once, of a busy rank that is no hang ([`NcclVerdict::Busy`]).
pub fn busy_line(hang: &Hang, gpu: BusyGpu) -> String {
    let why = match gpu {
        BusyGpu::Runs => "its GPU runs kernels: its work moves, and toporun stops nothing for it",
        BusyGpu::Unknown => "its GPU's activity is not read (no NVML utilization: `--stragglers off`, no NVML in the container, or a MIG instance), so an evaluation cannot be told from a loop: toporun says the hang only if this lasts twice --hang-timeout",
    };
    format!("{}; {why}", hang.headline)
}

/// NCCL's verdict on `reading` against `stacks` and what the ranks left (`ctx`); the
/// ranks whose stacks wait on their GPU are marked in the reading here.
pub fn nccl_verdict(
    watch: &mut NcclWatch,
    mut reading: NodeReading,
    stacks: &[RankStack],
    places: &Places,
    ctx: &Context,
    timeout: Duration,
    now: Instant,
) -> NcclVerdict {
    // A real wait shows in the waiting ranks' stacks (in a collective, or at a sync
    // on the GPU) at every sample; counters alone can hold an operation NCCL never
    // reports done (a kernel without profiler hooks) while the ranks compute and sit
    // at `.item()` now and then.
    let stands = ctx.standings(stacks);
    let gpu_busy = std::mem::take(&mut reading.gpu_busy);
    reading.on_gpu = stands
        .iter()
        .filter(|s| matches!(s.1, Standing::GpuWait { .. }))
        .map(|s| s.0)
        .collect();
    let stall = match watch.observe(&reading, now) {
        NcclState::Idle | NcclState::Unreadable => return NcclVerdict::StackRule,
        NcclState::Moving => return NcclVerdict::Moving,
        NcclState::Stalled(s) => s,
    };
    if unknown_wait(&stall) {
        return NcclVerdict::StackRule;
    }
    if !stands
        .iter()
        .any(|s| stall.waiting.contains(&s.0) && s.1.waits())
    {
        watch.hold_off(stall.comm);
        return NcclVerdict::StackRule;
    }
    if stalled_for(&stall) < timeout {
        if !ctx.left.is_empty() && ctx.left_while_others_wait(stacks) {
            return NcclVerdict::StackRule;
        }
        return NcclVerdict::Waiting;
    }
    let hang = Hang::nccl(stacks, places, &stall, timeout, ctx);
    match all_busy(&stall) {
        Some(busy) => match busy_gpu(&busy, &gpu_busy) {
            Some(BusyGpu::Unknown) if stalled_for(&stall) >= timeout * UNKNOWN_GPU_TIMEOUTS => {
                NcclVerdict::Hang(hang)
            }
            Some(gpu) => NcclVerdict::Busy { hang, busy, gpu },
            None => NcclVerdict::Hang(hang),
        },
        None => NcclVerdict::Hang(hang),
    }
}

fn stalled_for(stall: &NcclStall) -> Duration {
    Duration::from_secs_f64(stall.stalled_secs)
}

/// Which operation the ranks wait in is not known: sampled, every rank posted it
/// (or waits on its GPU) and nothing was timed. Unless the ranks posted different
/// operations at the last one every rank posted: then that is where they wait.
fn unknown_wait(stall: &NcclStall) -> bool {
    stall.which == WaitedOp::LastPosted && stall.mismatch.is_none()
}

/// The ranks behind, where there are some and every one ran its CPU through the
/// stall on work of its own (not spinning in another communicator's operation).
fn all_busy(stall: &NcclStall) -> Option<Vec<u32>> {
    let busy = stall
        .behind
        .iter()
        .all(|b| b.busy() == Some(true) && b.waits_in.is_none());
    (busy && !stall.behind.is_empty()).then(|| stall.behind.iter().map(|b| b.rank).collect())
}

/// The ranks to look at first: those that never posted the operation the ranks behind
/// wait in on another communicator (nothing holds them there), then the ranks behind.
fn first_causes(stall: &NcclStall) -> Vec<u32> {
    let mut odd: Vec<u32> = Vec::new();
    let elsewhere = stall.behind.iter().filter_map(|b| b.waits_in.as_ref());
    for r in elsewhere
        .flat_map(|w| &w.behind)
        .chain(stall.behind.iter().map(|b| &b.rank))
    {
        if !odd.contains(r) {
            odd.push(*r);
        }
    }
    odd
}

/// What NCCL's counters decide alone, where no rank's stack can be read (a C, C++
/// or JAX program on NCCL, or `--no-python`).
#[derive(Debug)]
pub enum CountersAlone {
    /// No rank waits in NCCL, or which operation they wait in is not known (sampled,
    /// nobody behind): nothing to say.
    Quiet,
    Moving,
    Waiting,
    /// Every rank behind ran its CPU through the stall: a computation only it runs,
    /// or a loop; without its stack toporun cannot tell, so it says so and stops
    /// nothing.
    Busy(String),
    /// A rank behind idled (or every rank posted and none completed): the hang.
    Hang(Hang),
}

/// The counters' verdict on `reading` with no stacks to weigh it against; `places`
/// names each rank's node where the reading is several nodes' merged (empty on one).
pub fn counters_alone(
    watch: &mut NcclWatch,
    reading: NodeReading,
    places: &Places,
    timeout: Duration,
    now: Instant,
) -> CountersAlone {
    let stall = match watch.observe(&reading, now) {
        NcclState::Idle => return CountersAlone::Quiet,
        // A file that does not read says nothing: not progress (a hang said stays said).
        NcclState::Unreadable => return CountersAlone::Waiting,
        NcclState::Moving => return CountersAlone::Moving,
        NcclState::Stalled(s) => s,
    };
    if unknown_wait(&stall) {
        return CountersAlone::Quiet;
    }
    if stalled_for(&stall) < timeout {
        return CountersAlone::Waiting;
    }
    let mut hang = Hang::nccl(&[], places, &stall, timeout, &Context::default());
    if let Some(t) = hang.trigger.as_mut() {
        t.push_str("; the ranks' stacks cannot be read (not Python): the counters alone decide");
    }
    if all_busy(&stall).is_some() {
        let why = "without its stack toporun cannot tell a step only it runs from a loop, and stops nothing for it";
        return CountersAlone::Busy(format!("{}; {why}", hang.headline));
    }
    CountersAlone::Hang(hang)
}

impl Hang {
    /// The hang of `stall`, with where each rank stands (`stacks`): the ranks that
    /// never posted the operation lead; a rank that left still leads where one did.
    pub fn nccl(
        stacks: &[RankStack],
        places: &Places,
        stall: &NcclStall,
        timeout: Duration,
        ctx: &Context,
    ) -> Hang {
        let stalled = Duration::from_secs_f64(stall.stalled_secs);
        let mut hang = Hang::with(stacks, places, stalled, timeout, ctx);
        // Places are empty on a single node, and name every shown rank's node on several.
        let (scope, ranks) = if places.is_empty() {
            ("on this node", "every rank here")
        } else {
            ("in the job", "every rank of the communicator")
        };
        let what = match stall.others_moving {
            true => format!(
                "no operation on communicator {:#x} has been posted or completed {scope} for {:.0}s while other communicators moved",
                stall.comm, stall.stalled_secs
            ),
            false => format!(
                "no NCCL operation has been posted or completed {scope} for {:.0}s",
                stall.stalled_secs
            ),
        };
        hang.trigger = Some(format!(
            "{what} (--hang-timeout {:.0}s; NCCL's own counters)",
            timeout.as_secs_f64()
        ));
        let op = op_text(&stall.op, stall.comm);
        if !ctx.left.is_empty() {
            return hang;
        }
        if let Some(m) = &stall.mismatch {
            hang.headline = format!(
                "{ranks} posted {op} and none completed: {}",
                mismatch_text(m)
            );
            if m.odd.is_some() {
                hang.odd = m.groups[0].0.clone();
            }
            return hang;
        }
        if stall.behind.is_empty() {
            hang.headline = match stall.missing {
                0 => format!("{ranks} posted {op} and none completed: {}", hang.headline),
                n => format!(
                    "ranks {} wait in {op}{}",
                    ranks_text(&stall.waiting),
                    missing_text(n)
                ),
            };
            return hang;
        }
        let stands = ctx.standings(stacks);
        let at = |r: u32| stands.iter().find(|s| s.0 == r);
        let parts: Vec<String> = stall
            .behind
            .iter()
            .map(|b| {
                format!(
                    "{} {}",
                    rank_label(b.rank, places),
                    behind_text(
                        b,
                        at(b.rank),
                        stall.stalled_secs,
                        ctx.stopped.contains(&b.rank)
                    )
                )
            })
            .collect();
        let behind: Vec<u32> = stall.behind.iter().map(|b| b.rank).collect();
        let s = if stall.waiting.len() == 1 { "s" } else { "" };
        hang.headline = format!(
            "{} never posted {op} that rank{} {} wait{s} in: {}{}",
            ranks_word(&behind),
            if stall.waiting.len() == 1 { "" } else { "s" },
            ranks_text(&stall.waiting),
            parts.join("; "),
            missing_text(stall.missing)
        );
        hang.odd = first_causes(stall);
        hang
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nccl_counters::NcclFunc;
    use crate::stacks::model::build::{main_thread, rank_with};

    fn stack(rank: u32, frames: &[(&str, &str, i32)]) -> RankStack {
        rank_with(rank, main_thread(false, frames))
    }

    fn stall(behind: Vec<Behind>) -> NcclStall {
        NcclStall {
            stalled_secs: 25.0,
            comm: 0x7,
            op: PostedOp {
                index: 5,
                func: NcclFunc::AllReduce,
                bytes: 4 << 20,
                kernel_start_ns: Some(1),
                timed: true,
            },
            waiting: vec![0, 2, 3],
            behind,
            missing: 0,
            mismatch: None,
            which: crate::nccl_counters::WaitedOp::Oldest,
            others_moving: false,
        }
    }

    /// Two ranks on NCCL: rank 0 posted all_reduce 20 and waits, rank 1 never posted
    /// it, its CPU having run `cpu_ms` and its GPU run kernels lately or not (None:
    /// not read).
    fn two_ranks(cpu_ms: u64, gpu: Option<bool>) -> NodeReading {
        use crate::nccl_counters::{decode, words::Words};
        let rank = |r: u32, posted: u64| {
            let mut w = Words::default();
            w.comm(0, 0x7, r, 2)
                .ops(0, NcclFunc::AllReduce, 16 << 20, posted, 19, 1000);
            decode(&w.bytes()).unwrap()
        };
        NodeReading {
            live: vec![0, 1],
            counters: [(0, rank(0, 20)), (1, rank(1, 19))].into(),
            cpu: [(0, Duration::ZERO), (1, Duration::from_millis(cpu_ms))].into(),
            gpu_busy: gpu.map(|g| (1, g)).into_iter().collect(),
            ..Default::default()
        }
    }

    /// Those two ranks as a C program's, read twice `secs` apart.
    fn c_program(secs: u64, cpu_ms: u64) -> CountersAlone {
        let at = |ms: u64| two_ranks(ms, None);
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        let timeout = Duration::from_secs(15);
        assert!(matches!(
            counters_alone(&mut w, at(0), &Places::new(), timeout, t0),
            CountersAlone::Moving
        ));
        counters_alone(
            &mut w,
            at(cpu_ms),
            &Places::new(),
            timeout,
            t0 + Duration::from_secs(secs),
        )
    }

    /// Without stacks the counters alone name the rank that never posted: stuck
    /// (its CPU idle) is the hang, said as the counters' alone; busy is said, and is
    /// no hang (a long step only it runs reads the same).
    #[test]
    fn without_stacks_the_counters_name_the_stuck_rank_and_leave_the_busy_one() {
        assert!(matches!(c_program(10, 0), CountersAlone::Waiting));
        let CountersAlone::Hang(h) = c_program(20, 0) else {
            panic!("stuck: a hang")
        };
        assert_eq!(h.odd, vec![1]);
        assert!(
            h.headline.starts_with("rank 1 never posted all_reduce (16 MiB, operation 20 on communicator 0x7) that rank 0 waits in: rank 1 is stuck (CPU 0% of the 20s)"),
            "{}",
            h.headline
        );
        let text = h.text(&Places::new());
        assert!(text.contains("the counters alone decide"), "{text}");
        let CountersAlone::Busy(line) = c_program(20, 19_500) else {
            panic!("busy: said, no hang")
        };
        assert!(
            line.contains("rank 1 is busy (CPU 98% of the 20s)"),
            "{line}"
        );
    }

    /// The same two ranks in Python: rank 0 at `synchronize`, rank 1 in `evaluate`,
    /// its CPU busy the whole 20 s, its GPU as `gpu` says.
    fn python_program(gpu: Option<bool>) -> NcclVerdict {
        let at = |ms: u64| two_ranks(ms, gpu);
        let stacks = [
            stack(0, &[("synchronize", "torch/cuda/__init__.py", 1)]),
            stack(1, &[("evaluate", "/w/train.py", 90)]),
        ];
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        let (ctx, places, timeout) = (Context::default(), Places::new(), Duration::from_secs(15));
        nccl_verdict(&mut w, at(0), &stacks, &places, &ctx, timeout, t0);
        let later = t0 + Duration::from_secs(20);
        nccl_verdict(&mut w, at(19_900), &stacks, &places, &ctx, timeout, later)
    }

    /// A busy rank behind whose GPU ran kernels has work that moves (an evaluation
    /// only it runs): `Busy`, no hang. Its GPU idle (a loop in Python): the hang. Its
    /// GPU not read: an evaluation and a loop read the same, so no hang is said.
    #[test]
    fn a_busy_rank_is_no_hang_while_its_gpu_runs_or_is_not_read() {
        let NcclVerdict::Busy { hang, busy, gpu } = python_program(Some(true)) else {
            panic!("busy with its GPU running: not a hang")
        };
        assert_eq!((busy, gpu), (vec![1], BusyGpu::Runs));
        assert!(busy_line(&hang, gpu).contains("its work moves"));
        let NcclVerdict::Hang(hang) = python_program(Some(false)) else {
            panic!("busy with its GPU idle: the hang")
        };
        assert_eq!(hang.odd, vec![1]);
        let NcclVerdict::Busy { hang, gpu, .. } = python_program(None) else {
            panic!("busy with its GPU not read: no hang said")
        };
        assert_eq!(gpu, BusyGpu::Unknown);
        let line = busy_line(&hang, gpu);
        assert!(line.contains("its GPU's activity is not read"), "{line}");
        assert!(
            line.contains("only if this lasts twice --hang-timeout"),
            "{line}"
        );
    }

    /// A busy rank whose GPU is not read, still behind at twice the timeout: a loop
    /// that does not end is stopped in the end.
    #[test]
    fn a_busy_rank_whose_gpu_is_not_read_is_the_hang_at_twice_the_timeout() {
        let stacks = [
            stack(0, &[("synchronize", "torch/cuda/__init__.py", 1)]),
            stack(1, &[("evaluate", "/w/train.py", 90)]),
        ];
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        let (ctx, places, timeout) = (Context::default(), Places::new(), Duration::from_secs(15));
        let mut verdict = |cpu_ms: u64, secs: u64| {
            let now = t0 + Duration::from_secs(secs);
            nccl_verdict(
                &mut w,
                two_ranks(cpu_ms, None),
                &stacks,
                &places,
                &ctx,
                timeout,
                now,
            )
        };
        verdict(0, 0);
        assert!(matches!(verdict(20_000, 20), NcclVerdict::Busy { .. }));
        let NcclVerdict::Hang(hang) = verdict(30_000, 30) else {
            panic!("busy at twice the timeout, its GPU not read: the hang")
        };
        assert_eq!(hang.odd, vec![1]);
    }

    #[test]
    fn the_busy_ranks_gpus_decide_together() {
        let known = |v: &[(u32, bool)]| v.iter().copied().collect();
        assert_eq!(
            busy_gpu(&[1, 2], &known(&[(1, true), (2, true)])),
            Some(BusyGpu::Runs)
        );
        assert_eq!(
            busy_gpu(&[1, 2], &known(&[(1, true)])),
            Some(BusyGpu::Unknown)
        );
        assert_eq!(busy_gpu(&[1, 2], &known(&[(1, true), (2, false)])), None);
        assert_eq!(busy_gpu(&[], &known(&[(1, true)])), None, "nobody busy");
    }

    #[test]
    fn a_rank_that_never_posted_leads_busy_with_its_function() {
        let stacks = [
            stack(
                0,
                &[
                    ("synchronize", "torch/cuda/__init__.py", 1),
                    ("main", "/w/train.py", 40),
                ],
            ),
            stack(
                1,
                &[
                    ("parse_record", "/w/data.py", 12),
                    ("main", "/w/train.py", 33),
                ],
            ),
        ];
        let busy = Behind {
            rank: 1,
            posted: 5,
            cpu_share: Some(0.99),
            waits_in: None,
        };
        let h = Hang::nccl(
            &stacks,
            &Places::new(),
            &stall(vec![busy]),
            Duration::from_secs(25),
            &Context::default(),
        );
        assert_eq!(h.odd, vec![1]);
        assert!(h.headline.starts_with("rank 1 never posted all_reduce (4 MiB, operation 6 on communicator 0x7) that ranks 0,2-3 wait in: rank 1 is busy (CPU 99% of the 25s) in parse_record (data.py:12)"), "{}", h.headline);
        assert!(
            h.headline.contains("raise --hang-timeout"),
            "{}",
            h.headline
        );
        let text = h.text(&Places::new());
        assert!(
            text.starts_with("toporun: hang: no NCCL operation has been posted or completed on this node for 25s"),
            "{text}"
        );
    }

    #[test]
    fn a_stuck_rank_a_rank_waiting_elsewhere_and_missing_members_are_told_apart() {
        let stuck = Behind {
            rank: 1,
            posted: 5,
            cpu_share: Some(0.01),
            waits_in: None,
        };
        // Spinning at 100% in a sync on its GPU: waiting, not a loop of its own.
        let elsewhere = Behind {
            rank: 2,
            posted: 5,
            cpu_share: Some(1.0),
            waits_in: None,
        };
        let stacks = [
            stack(1, &[("read", "/w/io.py", 3)]),
            stack(
                2,
                &[
                    ("synchronize", "torch/cuda/__init__.py", 1),
                    ("main", "/w/train.py", 9),
                ],
            ),
        ];
        let mut s = stall(vec![stuck, elsewhere]);
        s.missing = 1;
        let lines = [(2, "    torch.cuda.synchronize()".to_string())].into();
        let ctx = Context {
            lines,
            ..Context::default()
        };
        let h = Hang::nccl(&stacks, &Places::new(), &s, Duration::from_secs(25), &ctx);
        assert!(h.headline.contains("rank 1 is stuck (CPU 1% of the 25s) in read (io.py:3): it waits on something outside NCCL"), "{}", h.headline);
        assert!(
            h.headline.contains("rank 2 waits on its GPU"),
            "{}",
            h.headline
        );
        assert!(
            h.headline.contains("not in this group's operation"),
            "{}",
            h.headline
        );
        assert!(h.headline.ends_with("; 1 rank of the group has no such communicator yet: it never reached the group's creation"), "{}", h.headline);
        assert_eq!(h.odd, vec![1, 2]);
    }

    /// Rank 0 spins (100% CPU) in a copy queued behind the side group's all_reduce,
    /// which rank 1 skipped; rank 1 waits in the default group's: rank 1 leads, and no
    /// busy rank excuses the hang.
    #[test]
    fn a_rank_held_in_another_communicator_names_the_one_that_skipped() {
        use crate::nccl_counters::WaitsElsewhere;
        let held = Behind {
            rank: 0,
            posted: 473,
            cpu_share: Some(1.0),
            waits_in: Some(WaitsElsewhere {
                comm: 0xd,
                op: PostedOp {
                    index: 1,
                    bytes: 4,
                    ..PostedOp::unknown(1)
                },
                behind: vec![1],
            }),
        };
        let mut s = stall(vec![held]);
        s.waiting = vec![1];
        assert!(all_busy(&s).is_none());
        let stacks = [stack(0, &[("up", "/w/trainer_common.py", 119)])];
        let h = Hang::nccl(
            &stacks,
            &Places::new(),
            &s,
            Duration::from_secs(25),
            &Context::default(),
        );
        assert_eq!(h.odd, vec![1, 0]);
        assert!(h.headline.starts_with("rank 0 never posted all_reduce (4 MiB, operation 6 on communicator 0x7) that rank 1 waits in: rank 0 waits in unknown (4 B, operation 2 on communicator 0xd), which rank 1 never posted"), "{}", h.headline);
    }

    /// A stopped rank behind is said stopped, whatever its CPU did before it stopped.
    #[test]
    fn a_stopped_rank_behind_is_said_stopped() {
        let b = Behind {
            rank: 1,
            posted: 5,
            cpu_share: Some(0.0),
            waits_in: None,
        };
        let ctx = Context {
            stopped: vec![1],
            ..Context::default()
        };
        let h = Hang::nccl(
            &[],
            &Places::new(),
            &stall(vec![b]),
            Duration::from_secs(25),
            &ctx,
        );
        assert!(
            h.headline.contains("rank 1 is stopped (process state T"),
            "{}",
            h.headline
        );
        assert!(!h.headline.contains("stuck"), "{}", h.headline);
    }

    /// Every rank posted operation 15 and none completed; rank 1's is the others'
    /// next: it is named, with what it skipped, at the first report.
    #[test]
    fn a_skipped_collective_is_named_with_what_was_skipped() {
        let op = |bytes| PostedOp {
            index: 14,
            func: NcclFunc::AllReduce,
            bytes,
            ..PostedOp::unknown(14)
        };
        let mut s = stall(Vec::new());
        s.waiting = vec![0, 1, 2];
        s.mismatch = Some(Mismatch {
            index: 14,
            groups: vec![(vec![1], op(16 << 20)), (vec![0, 2], op(16 << 10))],
            odd: Some(OddBy::Skipped),
        });
        let h = Hang::nccl(
            &[],
            &Places::new(),
            &s,
            Duration::from_secs(25),
            &Context::default(),
        );
        assert_eq!(h.odd, vec![1]);
        assert!(h.headline.contains("rank 1 all_reduce of 16 MiB, ranks 0,2 all_reduce of 16 KiB: rank 1 skipped the others' operation 15, all_reduce of 16 KiB"), "{}", h.headline);
        s.mismatch.as_mut().unwrap().odd = None;
        let h = Hang::nccl(
            &[],
            &Places::new(),
            &s,
            Duration::from_secs(25),
            &Context::default(),
        );
        assert!(
            h.headline.contains("the counters cannot tell"),
            "{}",
            h.headline
        );
    }

    /// Sampled (nothing timed), 2 ranks, each step a gradient all_reduce (16 MiB) then
    /// the loss's (4 B); rank 1 skipped one gradient: every rank then waits on its GPU
    /// (GPU 2x H200 and 4x, issue 62), so no rank is behind and which operation they
    /// wait in was "not known": the stack rule said only that the collectives do not
    /// match. The operations posted under one index say who and what.
    #[test]
    fn a_skipped_gradient_is_named_from_the_counters_when_every_rank_waits_on_its_gpu() {
        use crate::nccl_counters::{decode, words::Words};
        let rank = |r: u32, seq: &[u64]| {
            let mut w = Words::default();
            w.comm(0, 0x7, r, 2);
            for &bytes in seq {
                w.untimed(0, NcclFunc::AllReduce, bytes, 1);
            }
            decode(&w.bytes()).unwrap()
        };
        let (g, l) = (16u64 << 20, 4u64);
        let steps: Vec<u64> = (0..12).flat_map(|_| [g, l]).collect();
        let zero: Vec<u64> = steps.iter().copied().chain([g, l]).collect();
        let one: Vec<u64> = steps.iter().copied().chain([l]).collect();
        let node = NodeReading {
            live: vec![0, 1],
            counters: [(0, rank(0, &zero)), (1, rank(1, &one))].into(),
            cpu: [(0, Duration::ZERO), (1, Duration::ZERO)].into(),
            on_gpu: [0, 1].into(),
            ..Default::default()
        };
        let (mut w, t0) = (NcclWatch::default(), Instant::now());
        let timeout = Duration::from_secs(15);
        counters_alone(&mut w, node.clone(), &Places::new(), timeout, t0);
        let CountersAlone::Hang(h) = counters_alone(
            &mut w,
            node,
            &Places::new(),
            timeout,
            t0 + Duration::from_secs(16),
        ) else {
            panic!("no hang")
        };
        assert_eq!(h.odd, vec![1]);
        assert!(
            h.headline.contains("operation 25: rank 1 all_reduce of 4 B, rank 0 all_reduce of 16 MiB: rank 1 skipped the others' operation 25, all_reduce of 16 MiB"),
            "{}",
            h.headline
        );
    }
}

//! From what toporun saw of a failed attempt to its causes: how each failed rank
//! ended (signal, exit code, last exception, a /dev/shm message), the memory
//! cgroup's OOM kills before and after, /dev/shm's use now.

use super::cause::{by_precedence, Cause, CauseKind};
use super::disk::{Volume, FIX as DISK_FIX};
use super::gpu_memory::CudaOom;
use super::native_crash::{frame_text, NativeCrash};
use super::oom::{MemoryReading, FIX as OOM_FIX};
use super::python_error::PythonError;
use super::shm::FIX as SHM_FIX;
use super::signal::RankSignal;
use super::watchdog::{WatchdogError, WatchdogTimeout};
use super::xid::{info, Verdict, XidEvent, FIX as XID_FIX};
use crate::units::format_size as fmt_bytes;

/// How one failed rank ended.
#[derive(Debug, Clone, Copy)]
pub struct RankEnd<'a> {
    pub rank: u32,
    pub exitcode: i32,
    /// The signal that killed it.
    pub signal: Option<RankSignal>,
    pub exception: Option<&'a PythonError>,
    /// toporun read its stderr: without it, no exception can be known.
    pub stderr_read: bool,
    pub shm_line: Option<&'a str>,
    /// Its line saying a peer went away (gloo's "Connection closed by peer"...), and
    /// the rank of this node that held the address the line names.
    pub lost_peer: Option<&'a str>,
    pub peer_rank: Option<u32>,
    /// faulthandler's block, where it crashed natively.
    pub native: Option<&'a NativeCrash>,
    /// Where its last stack sample stood, and how long before it ended.
    pub last_seen: Option<(&'a str, f64)>,
    /// Its line saying a write failed, the path it wrote, and that path's volume.
    pub write_failed: Option<&'a str>,
    pub volume: Option<&'a Volume>,
    /// PyTorch's CUDA out-of-memory message.
    pub cuda_oom: Option<&'a CudaOom>,
    /// Its last lines of its own on stderr (`last_words`): the message of an exit
    /// without a traceback.
    pub last_words: Option<&'a str>,
    /// NCCL's watchdog stopped it: the collective it waited in timed out.
    pub watchdog: Option<&'a WatchdogTimeout>,
    /// torch's watchdog raised an NCCL error of one of its collectives.
    pub watchdog_error: Option<&'a WatchdogError>,
    /// Where the ranks it waited for stood, as the hang report said it (the rank
    /// outside any collective), where one was made.
    pub hang: Option<&'a str>,
    /// The first to fail (the others may have been stopped by toporun).
    pub first: bool,
    /// The GPU it used (NVML index), and when it ended (seconds since the epoch).
    pub gpu: Option<u32>,
    pub at: f64,
}

/// A rank that exited 0 while other ranks of the attempt still ran (early stopping,
/// one batch fewer): its peers lose it at their next collective.
#[derive(Debug, Clone, PartialEq)]
pub struct Left {
    pub rank: u32,
    /// When it exited (seconds since the epoch), and how far into the attempt.
    pub at: f64,
    pub into_attempt: f64,
    /// The ranks of this node still running then.
    pub running: Vec<u32>,
}

const LEFT_FIX: &str = "every rank must take part in every collective the others run: decide to stop together (all_reduce a stop flag), and give every rank the same number of batches (DistributedSampler with drop_last=True, or torch.distributed.algorithms.Join for uneven inputs)";

/// The ranks that left before `e`, which lost a peer, failed: its failure is theirs.
fn left_before(e: &RankEnd, line: &str, left: &[Left]) -> Option<Cause> {
    let mut gone: Vec<&Left> = left.iter().filter(|l| l.at <= e.at).collect();
    // The rank that held the lost address first, where it is known.
    gone.sort_by_key(|l| Some(l.rank) != e.peer_rank);
    let first = gone.first()?;
    let whose = match (e.peer_rank, crate::root_cause::peer::address(line)) {
        (Some(r), Some(a)) if r == first.rank => format!(" (at {a}, a port rank {r} held)"),
        _ => String::new(),
    };
    let ranks: Vec<String> = gone.iter().map(|l| l.rank.to_string()).collect();
    let running = match first.running.as_slice() {
        [one] => format!("rank {one} was"),
        many => {
            let r: Vec<String> = many.iter().map(u32::to_string).collect();
            format!("ranks {} were", r.join(","))
        }
    };
    let what = crate::root_cause::peer::signature(line).unwrap_or("lost its peer");
    let who = if gone.len() == 1 {
        format!("rank {} left the job", ranks[0])
    } else {
        format!("ranks {} left the job", ranks.join(","))
    };
    Some(
        Cause::new(
            CauseKind::Code,
            Some(first.rank),
            format!(
                "{who} (exit 0 at {:.1}s into the attempt) while {running} still running; rank {}'s \"{what}\"{whose} is the consequence",
                first.into_attempt,
                e.rank
            ),
        )
        .fix(LEFT_FIX),
    )
}

/// The memory cgroup at the attempt's start and now.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub before: MemoryReading,
    pub now: MemoryReading,
}

/// /dev/shm at the failure.
#[derive(Debug, Clone, Copy)]
pub struct ShmUse {
    pub total: u64,
    pub free: u64,
}

fn limits(m: &MemoryReading) -> String {
    let mut out = match m.limit {
        Some(l) => format!("limit {}", fmt_bytes(l)),
        None => "no limit set".into(),
    };
    if let Some(p) = m.peak {
        out.push_str(&format!(", peak {}", fmt_bytes(p)));
    }
    out
}

fn shm_text(shm: Option<ShmUse>) -> String {
    match shm {
        Some(s) => format!(
            "/dev/shm is {}, {} in use once the rank ended, which freed its own",
            fmt_bytes(s.total),
            fmt_bytes(s.total.saturating_sub(s.free))
        ),
        None => "/dev/shm could not be read".into(),
    }
}

/// An Xid counts for a failure from this long before it (to a little after: events
/// may arrive late).
const XID_BEFORE: f64 = 60.0;
const XID_AFTER: f64 = 5.0;

/// The Xid events of `verdict` near rank `e`'s end: those on its own GPU first.
fn xids_near<'a>(e: &RankEnd, xids: &'a [XidEvent], verdict: Verdict) -> Vec<&'a XidEvent> {
    let mut near: Vec<&XidEvent> = xids
        .iter()
        .filter(|x| info(x.xid).verdict == verdict)
        .filter(|x| x.at >= e.at - XID_BEFORE && x.at <= e.at + XID_AFTER)
        .collect();
    near.sort_by_key(|x| Some(x.gpu) != e.gpu);
    near
}

fn xid_text(x: &XidEvent, e: &RankEnd) -> String {
    let whose = if Some(x.gpu) == e.gpu {
        "its GPU"
    } else {
        "a GPU of this node"
    };
    format!(
        "{whose}, GPU {} ({}, PCI {}), reported Xid {} ({}) {:.1}s before rank {} failed",
        x.gpu,
        x.uuid,
        x.pci_bus_id,
        x.xid,
        info(x.xid).meaning,
        e.at - x.at,
        e.rank
    )
}

/// A failure the environment explains: a volume that refused a write, the GPU's
/// memory.
fn environment(e: &RankEnd) -> Vec<Cause> {
    let mut out = Vec::new();
    let r = Some(e.rank);
    let at = e
        .exception
        .and_then(|x| x.frame.as_ref())
        .map(|(file, line, func)| {
            let name = file.rsplit('/').next().unwrap_or(file);
            format!(" in {func} ({name}:{line})")
        });
    if let Some(oom) = e.cuda_oom {
        out.push(
            Cause::new(
                CauseKind::GpuMemory,
                r,
                format!(
                    "rank {} ran out of GPU memory{}: {}",
                    e.rank,
                    at.clone().unwrap_or_default(),
                    oom.numbers()
                ),
            )
            .fix(oom.fix()),
        );
    }
    if let Some(line) = e.write_failed {
        let summary = match e.volume {
            Some(v) => format!("rank {} could not write {}: {}", e.rank, v.path, v.text()),
            None => format!(
                "rank {} could not write{}: {line}",
                e.rank,
                at.unwrap_or_default()
            ),
        };
        out.push(Cause::new(CauseKind::Disk, r, summary).fix(DISK_FIX));
    }
    out
}

/// `; last seen in flush (train.py:12), sampled 0.4s before it ended`.
fn seen(e: &RankEnd) -> String {
    e.last_seen
        .map(|(at, age)| format!("; last seen in {at}, sampled {age:.1}s before it ended"))
        .unwrap_or_default()
}

/// A rank that exited non-zero without a traceback: its last words where it said
/// any (`sys.exit("...")`), where it was last sampled.
fn exit_without_traceback(e: &RankEnd, r: Option<u32>, own_fault: &str) -> Cause {
    let said;
    let how = if let Some(words) = e.last_words.filter(|_| e.stderr_read) {
        said = format!("without a Python traceback, its last words on stderr: \"{words}\" (sys.exit with a message, argparse, a logger's fatal line, or a library's exit())");
        said.as_str()
    } else if e.stderr_read {
        "without a Python traceback (os._exit, or a native library's exit())"
    } else {
        "(toporun did not read its stderr: --read-stderr off, or --local-ranks-filter hid it; a traceback, if it raised one, is in its own output)"
    };
    Cause::new(
        CauseKind::Code,
        r,
        format!(
            "rank {} exited with code {} {how}{}{own_fault}",
            e.rank,
            e.exitcode,
            seen(e)
        ),
    )
}

/// A rank killed by its own crash (SIGSEGV...): where faulthandler saw it strike,
/// else where it was last sampled.
fn crashed(e: &RankEnd, sig: RankSignal, own_fault: &str) -> Cause {
    let native = "a native crash in C/C++/CUDA code";
    let summary = match e.native.and_then(|n| n.frame.as_ref()) {
        Some(f) => format!("rank {} crashed with {sig} ({native}) in {}", e.rank, frame_text(f)),
        None if e.last_seen.is_some() => format!("rank {} crashed with {sig} ({native}){}", e.rank, seen(e)),
        None => format!("rank {} crashed with {sig} ({native}); no Python stack was printed or sampled (PYTHONFAULTHANDLER=1 prints one)", e.rank),
    };
    Cause::new(CauseKind::Code, Some(e.rank), summary + own_fault).fix("the C/C++/CUDA extension or library in that call: run the rank under gdb or with CUDA_LAUNCH_BLOCKING=1 (a CUDA fault), and check the inputs it was given")
}

const MISMATCH_FIX: &str = "the ranks called this collective with other sizes or in another order (a collective one rank skipped or added): make every rank run the same collectives in the same order with the same sizes; `toporun fr-trace` on the attempt's fr/ directory shows which did not match";

/// A rank whose NCCL failed one of its collectives, as torch's watchdog found it:
/// NCCL's own reason. Its SIGABRT is torch taking the process down, not a crash.
fn watchdog_error(e: &RankEnd, w: &WatchdogError) -> Cause {
    let end = match e.signal {
        Some(sig) => format!("; torch's watchdog then took the process down ({sig}: not a crash)"),
        None => String::new(),
    };
    let summary = format!("{}{end}", w.failed(e.rank));
    let fix = match w.mismatch() {
        true => MISMATCH_FIX.to_string(),
        false => w.error.fix(),
    };
    Cause::new(CauseKind::Code, Some(e.rank), summary).fix(fix)
}

const HANG_FIX: &str = "the rank the others waited for: make every rank run the same collectives in the same order with the same sizes; `toporun fr-trace` on the attempt's fr/ directory shows which collective did not match";

/// A rank NCCL's watchdog stopped waited for a peer: the cause is that peer (the hang
/// report's rank outside any collective, a rank that left), the rank is the messenger.
fn watchdog_victim(e: &RankEnd, w: &WatchdogTimeout, left: &[Left]) -> Cause {
    let mut c = watchdog_cause(e.rank, w, e.hang, left);
    c.summary
        .push_str(", its SIGABRT is NCCL's doing, not a crash");
    c
}

/// The cause when NCCL's watchdog stopped `victim`: `hang`, where the ranks it waited
/// for stood (the hang report's headline), or a rank that left. Said the same whether
/// the rank died of it or toporun stopped the ranks once the watchdog had fired.
pub fn watchdog_cause(
    victim: u32,
    w: &WatchdogTimeout,
    hang: Option<&str>,
    left: &[Left],
) -> Cause {
    let culprit = match (hang, left.first()) {
        (_, Some(l)) => format!("rank {} left the job (exit 0 at {:.1}s into the attempt) while rank {victim} still needed it", l.rank, l.into_attempt),
        (Some(h), None) => h.to_string(),
        (None, None) => "no rank was seen outside the collective: look for a collective some rank skipped or called with other sizes".into(),
    };
    Cause::new(
        CauseKind::Hang,
        Some(victim),
        format!(
            "{culprit}; NCCL's watchdog stopped rank {victim} in {} (\"{}\"): that rank waited for its peers",
            w.what(),
            w.line
        ),
    )
    .fix(HANG_FIX)
}

/// Every cause the evidence supports, leading one first; `left`: the ranks that
/// exited 0 while others ran.
pub fn judge(
    ends: &[RankEnd],
    left: &[Left],
    memory: Option<Memory>,
    shm: Option<ShmUse>,
    xids: &[XidEvent],
) -> Vec<Cause> {
    let mut causes = Vec::new();
    let oom_kills = memory.map(|m| m.now.oom_kills.saturating_sub(m.before.oom_kills));
    let mut oom_named = false;
    for e in ends {
        let r = Some(e.rank);
        match (e.signal, oom_kills) {
            (Some(RankSignal::Kill), Some(n)) if n > 0 => {
                let m = memory.expect("read");
                causes.push(Cause::new(CauseKind::Oom, r, format!("rank {} was killed by the kernel OOM killer ({n} OOM kill(s) in the container's memory cgroup during this attempt; {})", e.rank, limits(&m.now))).fix(OOM_FIX));
                oom_named = true;
            }
            (Some(RankSignal::Kill), known) => {
                let how = if known.is_some() {
                    "not the OOM killer: the container's memory cgroup counted no OOM kill"
                } else {
                    "toporun could not read the memory cgroup to tell the OOM killer from others"
                };
                causes.push(Cause::new(CauseKind::External, r, format!("rank {} was killed by SIGKILL from outside the job ({how})", e.rank)).fix("look for what sent it: `kill -9`, a watchdog, the kubelet; the pod's events (kubectl describe pod)"));
            }
            _ => {}
        }
        if e.shm_line.is_some() || e.signal == Some(RankSignal::Bus) {
            let what = e.shm_line.unwrap_or("killed by SIGBUS");
            causes.push(
                Cause::new(
                    CauseKind::Shm,
                    r,
                    format!(
                        "rank {}: /dev/shm ran out ({}): {what}",
                        e.rank,
                        shm_text(shm)
                    ),
                )
                .fix(SHM_FIX),
            );
        }
        causes.extend(environment(e));
        if !e.first {
            continue;
        }
        if let Some(x) = xids_near(e, xids, Verdict::Hardware).first() {
            causes.push(Cause::new(CauseKind::Hardware, r, xid_text(x, e)).fix(XID_FIX));
        }
        if let Some(c) = e.lost_peer.and_then(|line| left_before(e, line, left)) {
            causes.push(c);
            continue;
        }
        if let Some(w) = e.watchdog {
            causes.push(watchdog_victim(e, w, left));
            continue;
        }
        if let (Some(w), None) = (e.watchdog_error, e.exception) {
            causes.push(watchdog_error(e, w));
            continue;
        }
        let own_fault = xids_near(e, xids, Verdict::Code)
            .first()
            .map(|x| format!("; {}: the code's own fault", xid_text(x, e)))
            .unwrap_or_default();
        // A crash in the interpreter's teardown after an uncaught exception follows
        // from that exception: the exception is the cause.
        let on_exit = e.exception.is_some() && e.native.is_some_and(|n| n.on_exit);
        if let Some(sig) = e.signal.filter(|s| s.is_crash() && !on_exit) {
            causes.push(crashed(e, sig, &own_fault));
        } else if e.cuda_oom.is_some() {
            // CUDA's out-of-memory exception is said once, by the gpu-memory cause.
        } else if let Some(x) = e.exception {
            let then = match e.signal.filter(|_| on_exit) {
                Some(sig) => format!("; the process then crashed with {sig} as Python exited (no Python frame: a library's teardown), which follows from it"),
                None => String::new(),
            };
            causes.push(match &x.nccl {
                Some(n) => Cause::new(
                    CauseKind::Code,
                    r,
                    format!(
                        "rank {} raised {}: {}{then}{own_fault}",
                        e.rank,
                        x.kind_and_place(),
                        n.text()
                    ),
                )
                .fix(n.fix()),
                None => Cause::new(
                    CauseKind::Code,
                    r,
                    format!("rank {} raised {}{then}{own_fault}", e.rank, x.line()),
                ),
            });
        } else if e.exitcode > 0 || !own_fault.is_empty() {
            causes.push(exit_without_traceback(e, r, &own_fault));
        }
    }
    if let (Some(n), false) = (oom_kills, oom_named) {
        if n > 0 {
            let m = memory.expect("read");
            causes.push(Cause::new(CauseKind::Oom, None, format!("the kernel OOM killer killed {n} process(es) of the job during this attempt (a DataLoader worker, or a rank's child; {})", limits(&m.now))).fix(OOM_FIX));
        }
    }
    by_precedence(causes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(rank: u32, signal: Option<RankSignal>, exitcode: i32) -> RankEnd<'static> {
        RankEnd {
            rank,
            exitcode,
            signal,
            exception: None,
            stderr_read: true,
            shm_line: None,
            lost_peer: None,
            peer_rank: None,
            native: None,
            last_seen: None,
            write_failed: None,
            volume: None,
            cuda_oom: None,
            last_words: None,
            watchdog: None,
            watchdog_error: None,
            hang: None,
            first: true,
            gpu: Some(rank),
            at: 1000.0,
        }
    }

    fn left(rank: u32, at: f64) -> Left {
        Left {
            rank,
            at,
            into_attempt: 3.1,
            running: vec![0, 2, 3],
        }
    }

    /// NCCL's watchdog aborted rank 0 (SIGABRT) after its all_reduce timed out; the
    /// hang report had found rank 1 in its own read.
    #[test]
    fn the_watchdogs_victim_is_the_messenger_not_a_native_crash() {
        let w = crate::root_cause::watchdog::last_timeout("[rank0]:[E1125 ProcessGroupNCCL.cpp:685] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=17, OpType=ALLREDUCE, NumelIn=4194304, NumelOut=4194304, Timeout(ms)=25000) ran for 25012 milliseconds before timing out.\n").unwrap();
        let hang = "rank 1 is in no collective: rank 1 is blocked outside PyTorch (I/O, a lock or a sleep) in read_next_shard (train.py:44), while rank 0 waits on its GPU at .item() in main (train.py:107): it most likely holds them up";
        let mut e = end(0, Some(RankSignal::Abrt), -6);
        e.watchdog = Some(&w);
        e.hang = Some(hang);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].kind, CauseKind::Hang);
        assert!(
            c[0].summary.starts_with("rank 1 is in no collective"),
            "{}",
            c[0].summary
        );
        assert!(c[0]
            .summary
            .contains("NCCL's watchdog stopped rank 0 in all_reduce #17 after its 25s timeout"));
        assert!(!c[0].line().contains("gdb"), "{}", c[0].line());
        assert_eq!(crate::root_cause::exit_codes::class_of(c[0].kind).code, 124);
        // A rank that left is the cause before any stack.
        let c = judge(&[e], &[left(1, 999.0)], None, None, &[]);
        assert!(c[0].summary.starts_with("rank 1 left the job (exit 0 at 3.1s into the attempt) while rank 0 still needed it"), "{}", c[0].summary);
    }

    #[test]
    fn a_rank_that_left_is_the_cause_of_its_peers_lost_connection() {
        let line = "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:35742";
        let mut e = end(2, None, 1);
        e.lost_peer = Some(line);
        e.peer_rank = Some(1);
        let c = judge(&[e], &[left(1, 999.0)], None, None, &[]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].rank, Some(1));
        assert_eq!(
            c[0].summary,
            "rank 1 left the job (exit 0 at 3.1s into the attempt) while ranks 0,2,3 were still running; rank 2's \"Connection closed by peer\" (at 127.0.0.1:35742, a port rank 1 held) is the consequence"
        );
        assert!(c[0]
            .fix
            .as_deref()
            .unwrap()
            .contains("all_reduce a stop flag"));
    }

    #[test]
    fn a_native_crash_is_named_where_it_struck() {
        let crash = NativeCrash {
            fatal: "Segmentation fault".into(),
            frame: Some(("/app/t.py".into(), 6, "decode_native_record".into())),
            on_exit: false,
        };
        let mut e = end(3, Some(RankSignal::Segv), -11);
        e.native = Some(&crash);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].summary, "rank 3 crashed with SIGSEGV (a native crash in C/C++/CUDA code) in decode_native_record (t.py:6)");
        // Without faulthandler's block: the last sample, with its age.
        e.native = None;
        e.last_seen = Some(("decode_native_record (t.py:6)", 0.4));
        let c = judge(&[e], &[], None, None, &[]);
        assert!(
            c[0].summary.ends_with(
                "; last seen in decode_native_record (t.py:6), sampled 0.4s before it ended"
            ),
            "{}",
            c[0].summary
        );
        e.last_seen = None;
        let c = judge(&[e], &[], None, None, &[]);
        assert!(
            c[0].summary.contains("PYTHONFAULTHANDLER=1"),
            "{}",
            c[0].summary
        );
    }

    /// 4x H200: a ValueError and a CUDA OOM, each followed by SIGSEGV in the
    /// interpreter's teardown. The exception is the cause; the crash is not another.
    #[test]
    fn a_crash_as_python_exits_after_an_exception_is_not_the_cause() {
        use crate::root_cause::gpu_memory::cuda_oom;
        use crate::root_cause::native_crash::last_native_crash;
        use crate::root_cause::native_crash::tests::{job_stderr, TEARDOWN};
        use crate::root_cause::python_error::last_exception;
        let oom = include_str!("../../../tests/fixtures/device/x4-h200/failures/oom/stderr");
        for (text, expected) in [
            (TEARDOWN, "rank 1 raised ValueError: batch 12: expected 16 features, got 15 (gpu_nccl_failure_rank.py:55); the process then crashed with SIGSEGV as Python exited"),
            (oom, "rank 1 ran out of GPU memory in build_activations (gpu_nccl_failure_rank.py:59): asked 200.00 GiB"),
        ] {
            let text = job_stderr(text);
            let (x, native, cuda) = (last_exception(&text), last_native_crash(&text), cuda_oom(&text));
            let mut e = end(1, Some(RankSignal::Segv), -11);
            (e.exception, e.native, e.cuda_oom) = (x.as_ref(), native.as_ref(), cuda.as_ref());
            let c = judge(&[e], &[], None, None, &[]);
            assert_eq!(c.len(), 1, "{c:?}");
            assert!(c[0].summary.starts_with(expected), "{}", c[0].summary);
            assert!(!c[0].line().contains("gdb"), "{}", c[0].line());
        }
    }

    #[test]
    fn an_exit_code_without_a_traceback_says_where_it_was() {
        let mut e = end(3, None, 3);
        e.last_seen = Some(("flush_shards (t.py:12)", 0.3));
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].summary, "rank 3 exited with code 3 without a Python traceback (os._exit, or a native library's exit()); last seen in flush_shards (t.py:12), sampled 0.3s before it ended");
    }

    /// `sys.exit("...")`: the message is the cause, quoted; the stack sample stays
    /// what it is, a sample from before the exit.
    #[test]
    fn an_exit_with_a_message_quotes_it() {
        let mut e = end(1, None, 1);
        let words = crate::root_cause::last_words::last_words(
            "step 3\nconfig error: lr must be positive\n",
        );
        e.last_words = words.as_deref();
        e.last_seen = Some(("step (common.py:15)", 1.0));
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].summary, "rank 1 exited with code 1 without a Python traceback, its last words on stderr: \"step 3 / config error: lr must be positive\" (sys.exit with a message, argparse, a logger's fatal line, or a library's exit()); last seen in step (common.py:15), sampled 1.0s before it ended");
    }

    /// torch's watchdog raised NCCL's error of a collective (two nodes over sockets,
    /// one rank skipped a gradient all_reduce: NCCL found the sizes differ) and took
    /// the process down with SIGABRT: the cause is NCCL's reason, not a native crash
    /// (which toporun said before, one H200, tests/fixtures/device/cross-node-failures-h200x1).
    #[test]
    fn an_nccl_error_the_watchdog_raised_is_the_cause_not_a_crash() {
        let out = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/device/cross-node-failures-h200x1/failure-sideskip/stderr1"
        ))
        .unwrap();
        // The capture's lines carry the device script's time stamps (`[  13.28] `),
        // which toporun's own reading of a rank's output has not.
        let out: String = out
            .lines()
            .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
            .map(|l| format!("{l}\n"))
            .collect();
        let w = crate::root_cause::watchdog::last_error(&out).expect("the watchdog's error");
        let mut e = end(1, Some(RankSignal::from_number(6)), -6);
        e.watchdog_error = Some(&w);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].kind, CauseKind::Code);
        assert!(
            c[0].summary.starts_with(
                "rank 1's NCCL failed all_reduce #25 (1 element): NCCL invalid usage (NCCL 2.28.9); NCCL's reason: \"NET/Socket"
            ),
            "{}",
            c[0].summary
        );
        assert!(
            !c[0].summary.contains("two ranks on one GPU"),
            "{}",
            c[0].summary
        );
        assert!(
            c[0].summary
                .contains("message truncated : receiving 1048576 bytes instead of 65536"),
            "{}",
            c[0].summary
        );
        assert!(
            c[0].summary
                .ends_with("torch's watchdog then took the process down (SIGABRT: not a crash)"),
            "{}",
            c[0].summary
        );
        assert!(!c[0].summary.contains("native crash"), "{}", c[0].summary);
        assert!(c[0]
            .fix
            .as_deref()
            .unwrap()
            .starts_with("the ranks called this collective with other sizes"));
    }

    /// An NCCL error is said with NCCL's own reason and the fix it points to, not the
    /// exception's first line (its file in PyTorch and the NCCL_DEBUG hint).
    #[test]
    fn an_nccl_error_is_said_with_ncclss_reason_and_its_fix() {
        let text = "Traceback (most recent call last):\n  File \"/app/train.py\", line 12, in main\ntorch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000\n";
        let x = crate::root_cause::python_error::last_exception(text).expect("a traceback");
        let mut e = end(1, None, 1);
        e.exception = Some(&x);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].kind, CauseKind::Code);
        assert!(c[0].summary.starts_with("rank 1 raised torch.distributed.DistBackendError (train.py:12): NCCL invalid usage ("), "{}", c[0].summary);
        assert!(c[0].summary.ends_with("NCCL's reason: \"Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000\""), "{}", c[0].summary);
        assert!(!c[0].summary.contains("NCCLUtils.cpp"), "{}", c[0].summary);
        let fix = c[0].fix.as_deref().unwrap_or_default();
        assert!(
            fix.starts_with("ranks 1 and 0 run on one GPU (PCI bus 18000)"),
            "{fix}"
        );
    }

    /// Where toporun did not read the rank's stderr it cannot know there was no
    /// traceback, and does not say so.
    #[test]
    fn an_unread_stderr_never_claims_there_was_no_traceback() {
        let mut e = end(1, None, 1);
        e.stderr_read = false;
        let c = judge(&[e], &[], None, None, &[]);
        assert!(
            !c[0].summary.contains("without a Python traceback"),
            "{}",
            c[0].summary
        );
        assert!(
            c[0].summary.contains("toporun did not read its stderr"),
            "{}",
            c[0].summary
        );
    }

    #[test]
    fn a_full_volume_and_cuda_oom_lead_the_codes_exception() {
        let x = PythonError {
            exception: "RuntimeError: [enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598".into(),
            frame: Some(("/app/ckpt.py".into(), 9, "save".into())),
            nccl: None,
        };
        let v = Volume {
            path: "/ckpt/step3.pt".into(),
            total: 1 << 20,
            free: 0,
            read_only: false,
        };
        let mut e = end(0, None, 1);
        e.exception = Some(&x);
        e.write_failed = Some("unexpected pos 704 vs 598");
        e.volume = Some(&v);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c[0].kind, CauseKind::Disk);
        assert_eq!(
            c[0].summary,
            "rank 0 could not write /ckpt/step3.pt: its volume is full (1 MiB, 0 B free)"
        );
        let oom = crate::root_cause::gpu_memory::cuda_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 6.66 GiB is free.").unwrap();
        let x = PythonError {
            exception: "torch.OutOfMemoryError: CUDA out of memory.".into(),
            frame: Some(("/app/oom.py".into(), 3, "build_activations".into())),
            nccl: None,
        };
        let mut e = end(0, None, 1);
        e.exception = Some(&x);
        e.cuda_oom = Some(&oom);
        let c = judge(&[e], &[], None, None, &[]);
        assert_eq!(c.len(), 1, "PyTorch's message is said once: {c:?}");
        assert_eq!(c[0].kind, CauseKind::GpuMemory);
        assert_eq!(c[0].summary, "rank 0 ran out of GPU memory in build_activations (oom.py:3): asked 8.00 GiB with 6.66 GiB free of 79.18 GiB");
    }

    #[test]
    fn no_false_blame_for_a_rank_that_left() {
        let mut e = end(2, None, 1);
        // Its own failure, not a lost peer: the leaver is innocent.
        let c = judge(&[e], &[left(1, 999.0)], None, None, &[]);
        assert!(
            c[0].summary.starts_with("rank 2 exited with code 1"),
            "{c:?}"
        );
        // It left after the failure: a consequence, not the cause.
        e.lost_peer = Some("Connection reset by peer");
        let c = judge(&[e], &[left(1, 1001.0)], None, None, &[]);
        assert!(
            c[0].summary.starts_with("rank 2 exited with code 1"),
            "{c:?}"
        );
    }

    fn memory(kills: u64) -> Option<Memory> {
        let r = |oom_kills| MemoryReading {
            oom_kills,
            limit: Some(256 << 20),
            peak: Some(256 << 20),
        };
        Some(Memory {
            before: r(0),
            now: r(kills),
        })
    }

    #[test]
    fn a_sigkill_with_an_oom_kill_is_the_oom_killer_and_without_one_from_outside() {
        let c = judge(
            &[end(2, Some(RankSignal::Kill), -9)],
            &[],
            memory(1),
            None,
            &[],
        );
        assert_eq!(c[0].kind, CauseKind::Oom);
        assert!(
            c[0].summary
                .contains("rank 2 was killed by the kernel OOM killer"),
            "{}",
            c[0].summary
        );
        assert!(c[0].summary.contains("limit 256 MiB"), "{}", c[0].summary);
        let c = judge(
            &[end(2, Some(RankSignal::Kill), -9)],
            &[],
            memory(0),
            None,
            &[],
        );
        assert_eq!(c[0].kind, CauseKind::External);
        assert!(c[0].summary.contains("from outside"));
    }

    #[test]
    fn shm_leads_the_exception_it_caused() {
        let x = PythonError {
            exception: "RuntimeError: unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)".into(),
            frame: Some(("train.py".into(), 9, "main".into())),
            nccl: None,
        };
        let e = RankEnd {
            exception: Some(&x),
            shm_line: Some("RuntimeError: unable to allocate shared memory(shm) ..."),
            ..end(0, None, 1)
        };
        let c = judge(
            &[e],
            &[],
            memory(0),
            Some(ShmUse {
                total: 8 << 20,
                free: 0,
            }),
            &[],
        );
        let kinds: Vec<CauseKind> = c.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [CauseKind::Shm, CauseKind::Code]);
        assert!(
            c[0].summary
                .contains("/dev/shm is 8 MiB, 8 MiB in use once the rank ended"),
            "{}",
            c[0].summary
        );
    }

    #[test]
    fn a_plain_exit_code_is_the_codes_and_ranks_stopped_after_are_not_causes() {
        let stopped = RankEnd {
            first: false,
            ..end(1, Some(RankSignal::Other(15)), -15)
        };
        let c = judge(&[end(0, None, 3), stopped], &[], None, None, &[]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].summary, "rank 0 exited with code 3 without a Python traceback (os._exit, or a native library's exit())");
    }

    fn xid(gpu: u32, xid: u64, at: f64) -> XidEvent {
        XidEvent {
            gpu,
            uuid: format!("GPU-{gpu}"),
            pci_bus_id: format!("00000000:0{gpu}:00.0"),
            xid,
            at,
        }
    }

    #[test]
    fn a_node_fatal_xid_before_the_failure_leads_and_a_code_xid_stays_the_codes() {
        let c = judge(
            &[end(1, Some(RankSignal::Abrt), -6)],
            &[],
            None,
            None,
            &[xid(1, 79, 998.0)],
        );
        assert_eq!(c[0].kind, CauseKind::Hardware);
        assert!(c[0].summary.starts_with("its GPU, GPU 1 (GPU-1, PCI 00000000:01:00.0), reported Xid 79 (GPU has fallen off the bus) 2.0s before rank 1 failed"), "{}", c[0].summary);
        // On another GPU of the node; one long before does not count.
        let c = judge(
            &[end(1, None, 1)],
            &[],
            None,
            None,
            &[xid(0, 48, 990.0), xid(1, 79, 100.0)],
        );
        assert_eq!(c[0].kind, CauseKind::Hardware);
        assert!(
            c[0].summary.starts_with("a GPU of this node, GPU 0"),
            "{}",
            c[0].summary
        );
        let x = PythonError {
            exception: "RuntimeError: CUDA error: an illegal memory access was encountered".into(),
            frame: None,
            nccl: None,
        };
        let e = RankEnd {
            exception: Some(&x),
            ..end(1, None, 1)
        };
        let c = judge(&[e], &[], None, None, &[xid(1, 13, 999.0)]);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, CauseKind::Code);
        assert!(c[0].summary.contains("Xid 13"), "{}", c[0].summary);
    }
}

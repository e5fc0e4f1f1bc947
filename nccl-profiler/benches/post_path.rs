//! The plugin's cost on the thread that posts operations, in nanoseconds a post: the
//! exported table called as NCCL calls it for each collective (its start and its
//! stop; for an operation the plugin takes as timed, one kernel channel's start and
//! stop, which NCCL's proxy thread would report), under each of the modes the bench
//! switch sets, interleaved round by round. Also what one clock read costs here.
//! `cargo bench -p toporun-nccl-profiler --features bench-control --bench post_path`
//! (ROUNDS, POSTS: rounds of posts a mode, default 200 of 20,000, or of 600 with
//! EVICT_KB; EVICT_KB: memory written between posts, each post then timed alone,
//! clock included; WARMUP_MS: sampled posts before the rounds). Prints `MODE
//! MEDIAN_NS Q1_NS Q3_NS`.

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::sync::atomic::AtomicI32;
use std::time::{Duration, Instant};
use toporun_nccl_profiler::*;

static NCCL_MASK: AtomicI32 = AtomicI32::new(0);

/// (name, the bench switch's code); silent: NCCL would not call the plugin at all.
const MODES: [(&str, c_int); 4] = [
    ("ignored", 4),
    ("posted", 1),
    ("sampled", SAMPLED),
    ("all", 3),
];
/// The rank's sampling (the bench switch's code).
const SAMPLED: c_int = 2;

fn var(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect(name))
}

fn start(ctx: *mut c_void, kind: u64, parent: *mut c_void, u: DescrUnion) -> *mut c_void {
    let mut d = EventDescr {
        kind,
        parent,
        rank: 0,
        u,
    };
    let mut h = std::ptr::null_mut();
    unsafe { (ncclProfiler_v5.start_event)(ctx, &mut h, &mut d) };
    h
}

/// One all_reduce of 256 KiB posted; its channel reported if the plugin followed it.
fn post(ctx: *mut c_void, t: u64) {
    let coll = CollDescr {
        seq: t,
        func: c"AllReduce".as_ptr(),
        send: std::ptr::null(),
        recv: std::ptr::null_mut(),
        count: 65536,
        root: 0,
        datatype: c"ncclFloat32".as_ptr(),
        n_channels: 1,
        n_warps: 16,
        algo: c"RING".as_ptr(),
        proto: c"SIMPLE".as_ptr(),
        parent_group: std::ptr::null_mut(),
    };
    let op = start(ctx, EVENT_COLL, std::ptr::null_mut(), DescrUnion { coll });
    unsafe { (ncclProfiler_v5.stop_event)(op) };
    if !op.is_null() {
        let kernel_ch = KernelChDescr {
            channel_id: 0,
            p_timer: t,
        };
        let ch = start(ctx, EVENT_KERNEL_CH, op, DescrUnion { kernel_ch });
        let mut args = StateArgs {
            kernel_ch_timer: t + 1,
        };
        unsafe {
            (ncclProfiler_v5.record_event_state)(ch, STATE_KERNEL_CH_STOP, &mut args);
            (ncclProfiler_v5.stop_event)(ch);
        }
    }
}

fn quartiles(mut xs: Vec<f64>) -> [f64; 3] {
    xs.sort_by(f64::total_cmp);
    [xs.len() / 2, xs.len() / 4, xs.len() * 3 / 4].map(|i| xs[i])
}

fn main() {
    // Each evicting post writes EVICT_KB: 600 of them a round keep the run to about a
    // minute (20,000 write 32 TiB over the four modes: more than the 10 minutes a device
    // call may run).
    let evict_kb = var("EVICT_KB", 0);
    let posts = var("POSTS", if evict_kb > 0 { 600 } else { 20_000 });
    let rounds = var("ROUNDS", 200);
    let dir = std::env::temp_dir().join(format!("post-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var(PATH_VAR, dir.join("rank_0"));
    let mut ctx = std::ptr::null_mut();
    let r = unsafe {
        (ncclProfiler_v5.init)(
            &mut ctx,
            1,
            NCCL_MASK.as_ptr(),
            c"bench".as_ptr(),
            1,
            4,
            0,
            None,
        )
    };
    assert!(r == NCCL_SUCCESS && !ctx.is_null(), "init: {r}");
    // EVICT_KB > 0: that much memory written between posts (as a rank's Python and
    // CUDA calls would), each post timed on its own.
    let mut evict = vec![0u64; evict_kb * 128];
    let mut ns = vec![Vec::new(); MODES.len()];
    let mut t = 0u64;
    // Until its first period ends a job's plugin reads the clock at every post (it has
    // no post rate yet): sampled posts for WARMUP_MS first (default 1 s, twice the
    // default period), so that the rounds time posts past it, as a job's are.
    assert_eq!(toporun_nccl_profiler_bench_mode(SAMPLED), 0);
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(var("WARMUP_MS", 1000) as u64) {
        t += 2;
        post(ctx, t);
    }
    for _ in 0..rounds {
        for (i, (_, code)) in MODES.iter().enumerate() {
            assert_eq!(toporun_nccl_profiler_bench_mode(*code), 0);
            let mut spent = Duration::ZERO;
            let t0 = Instant::now();
            for _ in 0..posts {
                t += 2;
                if evict.is_empty() {
                    post(ctx, t);
                    continue;
                }
                for w in evict.iter_mut().step_by(8) {
                    *w = w.wrapping_add(t);
                }
                let t1 = Instant::now();
                post(ctx, t);
                spent += t1.elapsed();
            }
            if evict.is_empty() {
                spent = t0.elapsed();
            }
            ns[i].push(spent.as_nanos() as f64 / posts as f64);
        }
    }
    black_box(&evict);
    for ((name, _), xs) in MODES.iter().zip(ns) {
        let [m, q1, q3] = quartiles(xs);
        println!("{name} {m:.1} {q1:.1} {q3:.1}");
    }
    let clock: Vec<f64> = (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..posts {
                black_box(Instant::now());
            }
            t0.elapsed().as_nanos() as f64 / posts as f64
        })
        .collect();
    let [m, q1, q3] = quartiles(clock);
    println!("clock {m:.1} {q1:.1} {q3:.1}");
    // Only sampled posts are counted as timed ("all" times without counting).
    println!(
        "timed {} of {} sampled posts",
        toporun_nccl_profiler_bench_timed(),
        rounds * posts
    );
    unsafe { (ncclProfiler_v5.finalize)(ctx) };
    let _ = std::fs::remove_dir_all(dir);
}

//! The plugin driven as NCCL drives it, without a GPU: the exported table called with
//! the descriptors NCCL passes (an operation, its kernel channels' start and stop
//! with GPU timestamps, parents NCCL starts that the plugin ignores), and the
//! counters file then read as the agent reads it.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use toporun_nccl_profiler::*;
use toporun_shared::nccl_counters::{decode, KernelSampling, NcclFunc, RankCounters};

/// The plugin has one counters file per process and reads its path at init.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// NCCL's process-wide activation mask, which the plugin keeps writing after init.
static NCCL_MASK: AtomicI32 = AtomicI32::new(0);

/// ncclProfileGroup: NCCL starts it as the operations' parent.
const EVENT_GROUP: u64 = 1;

struct Nccl<'a> {
    table: &'a ProfilerV5,
}

impl Nccl<'_> {
    fn init(&self, comm_id: u64, rank: c_int, nranks: c_int) -> (*mut c_void, c_int) {
        let mut ctx = std::ptr::null_mut();
        NCCL_MASK.store(0, Ordering::Relaxed);
        let name = CString::new("default_pg").unwrap();
        let r = unsafe {
            (self.table.init)(
                &mut ctx,
                comm_id,
                NCCL_MASK.as_ptr(),
                name.as_ptr(),
                1,
                nranks,
                rank,
                None,
            )
        };
        assert_eq!(r, NCCL_SUCCESS);
        (ctx, NCCL_MASK.load(Ordering::Relaxed))
    }

    fn start(&self, ctx: *mut c_void, d: &mut EventDescr) -> *mut c_void {
        let mut h = std::ptr::null_mut();
        assert_eq!(
            unsafe { (self.table.start_event)(ctx, &mut h, d) },
            NCCL_SUCCESS
        );
        h
    }

    /// A collective of `count` floats posted under a group event, as NCCL posts it.
    /// `func` is 'static as NCCL's names are: the plugin caches a name by its pointer.
    fn post(
        &self,
        ctx: *mut c_void,
        func: &'static CStr,
        count: usize,
        channels: u8,
    ) -> *mut c_void {
        let group = self.start(ctx, &mut descr(EVENT_GROUP, std::ptr::null_mut(), empty()));
        assert!(group.is_null(), "groups are not followed");
        let coll = CollDescr {
            seq: 0,
            func: func.as_ptr(),
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count,
            root: 0,
            datatype: c"ncclFloat32".as_ptr(),
            n_channels: channels,
            n_warps: 16,
            algo: c"RING".as_ptr(),
            proto: c"SIMPLE".as_ptr(),
            parent_group: std::ptr::null_mut(),
        };
        let h = self.start(ctx, &mut descr(EVENT_COLL, group, DescrUnion { coll }));
        assert_eq!(
            unsafe { (self.table.stop_event)(h) },
            NCCL_SUCCESS,
            "enqueued"
        );
        h
    }

    /// Channel `id` of `op` runs on the GPU from `start` to `stop` (ns), as the
    /// proxy thread reports it: start, the stop state with its timer, stop.
    fn channel(&self, ctx: *mut c_void, op: *mut c_void, id: u8, start: u64, stop: u64) {
        let ch = self.channel_start(ctx, op, id, start);
        self.channel_stop(ch, stop);
    }

    fn channel_start(&self, ctx: *mut c_void, op: *mut c_void, id: u8, start: u64) -> *mut c_void {
        let kernel_ch = KernelChDescr {
            channel_id: id,
            p_timer: start,
        };
        self.start(
            ctx,
            &mut descr(EVENT_KERNEL_CH, op, DescrUnion { kernel_ch }),
        )
    }

    fn channel_stop(&self, ch: *mut c_void, stop: u64) {
        let mut args = StateArgs {
            kernel_ch_timer: stop,
        };
        unsafe {
            assert_eq!(
                (self.table.record_event_state)(ch, STATE_KERNEL_CH_STOP, &mut args),
                NCCL_SUCCESS
            );
            assert_eq!((self.table.stop_event)(ch), NCCL_SUCCESS);
        }
    }

    fn finalize(&self, ctx: *mut c_void) {
        assert_eq!(unsafe { (self.table.finalize)(ctx) }, NCCL_SUCCESS);
    }
}

fn empty() -> DescrUnion {
    DescrUnion {
        kernel_ch: KernelChDescr {
            channel_id: 0,
            p_timer: 0,
        },
    }
}

fn descr(kind: u64, parent: *mut c_void, u: DescrUnion) -> EventDescr {
    EventDescr {
        kind,
        parent,
        rank: 0,
        u,
    }
}

fn read(path: &Path) -> RankCounters {
    decode(&std::fs::read(path).unwrap()).unwrap()
}

fn here() -> Nccl<'static> {
    Nccl {
        table: &ncclProfiler_v5,
    }
}

/// Runs `f` with the plugin's counters going to a fresh file (a finalised slot or
/// context taken again at once, unless `f` says otherwise).
fn with_file(f: impl FnOnce(&Path)) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    set_reuse_grace_for_tests(std::time::Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rank_0");
    std::env::set_var(PATH_VAR, &path);
    std::env::set_var(SAMPLING_VAR, "all");
    f(&path);
}

#[test]
fn an_operation_completes_with_its_last_channel() {
    with_file(|path| {
        let nccl = here();
        let all_reduce = c"AllReduce";
        let (ctx, mask) = nccl.init(0xfeed, 1, 2);
        assert_eq!(mask as u64, EVENT_COLL | EVENT_P2P | EVENT_KERNEL_CH);
        // 1 Mi floats (4 MiB) on 2 channels: 1000..5000 ns and 1200..6000 ns.
        let op = nccl.post(ctx, all_reduce, 1 << 20, 2);
        nccl.channel(ctx, op, 0, 1000, 5000);
        let c = read(path);
        let comm = &c.comms[0];
        assert_eq!((comm.hash, comm.rank, comm.nranks), (0xfeed, 1, 2));
        assert_eq!(
            (comm.posted, comm.timed_upto),
            (1, 0),
            "one channel still runs"
        );
        let open = comm.first_past_timed().unwrap();
        assert_eq!(
            (open.func, open.bytes, open.kernel_start_ns),
            (NcclFunc::AllReduce, 4 << 20, Some(1000))
        );
        nccl.channel(ctx, op, 1, 1200, 6000);
        let c = read(path);
        let comm = &c.comms[0];
        assert_eq!((comm.posted, comm.timed_upto, comm.busy_ns), (1, 1, 5000));
        assert_eq!(comm.first_past_timed(), None);
        let f = comm.funcs[0];
        assert_eq!(
            (f.func, f.count, f.bytes, f.big_count, f.big_gpu_ns),
            (NcclFunc::AllReduce, 1, 4 << 20, 1, 5000)
        );
        assert_eq!(c.pid, std::process::id());
        nccl.finalize(ctx);
        assert!(!read(path).comms[0].live);
    });
}

#[test]
fn two_communicators_count_apart_and_a_posted_operation_stays_open() {
    with_file(|path| {
        let nccl = here();
        let (all_gather, send) = (c"AllGather", c"Send");
        let (a, _) = nccl.init(1, 0, 4);
        let (b, _) = nccl.init(2, 0, 2);
        for i in 0..3 {
            let op = nccl.post(a, all_gather, 256, 1);
            nccl.channel(a, op, 0, 10 * i, 10 * i + 5);
        }
        // The 4th all_gather is posted and its kernel never starts (a peer is late).
        nccl.post(a, all_gather, 256, 1);
        let p2p = P2pDescr {
            func: send.as_ptr(),
            buff: std::ptr::null_mut(),
            datatype: c"ncclBfloat16".as_ptr(),
            count: 8,
            peer: 1,
            n_channels: 1,
            parent_group: std::ptr::null_mut(),
        };
        let op = nccl.start(
            b,
            &mut descr(EVENT_P2P, std::ptr::null_mut(), DescrUnion { p2p }),
        );
        nccl.channel(b, op, 0, 100, 130);
        let c = read(path);
        let (ca, cb) = (&c.comms[0], &c.comms[1]);
        assert_eq!(
            (ca.hash, ca.posted, ca.timed_upto, ca.busy_ns),
            (1, 4, 3, 15)
        );
        let open = ca.first_past_timed().unwrap();
        assert_eq!(
            (open.index, open.func, open.kernel_start_ns),
            (3, NcclFunc::AllGather, None)
        );
        assert_eq!((cb.hash, cb.posted, cb.timed_upto), (2, 1, 1));
        assert_eq!((cb.funcs[0].func, cb.funcs[0].bytes), (NcclFunc::Send, 16));
        assert_eq!(c.inits, 2);
        nccl.finalize(a);
        nccl.finalize(b);
    });
}

/// One communicator posted from several threads at once, as NCCL may (the thread
/// launching a plan, and CUDA's host-callback thread posting a graph replay's): every
/// post is counted, since a rank one short would read as behind its peers.
#[test]
fn posts_from_several_threads_on_one_communicator_are_all_counted() {
    with_file(|path| {
        std::env::set_var(SAMPLING_VAR, "off");
        let nccl = here();
        let (ctx, _) = nccl.init(5, 0, 2);
        let ctx_addr = ctx as usize; // raw pointers are not Send; NCCL shares it too
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(move || {
                    let (nccl, f) = (here(), c"AllReduce");
                    for _ in 0..20_000 {
                        nccl.post(ctx_addr as *mut c_void, f, 1024, 1);
                    }
                });
            }
        });
        assert_eq!(read(path).comms[0].posted, 80_000);
        nccl.finalize(ctx);
    });
}

#[test]
fn an_abort_with_channels_in_flight_frees_them_and_the_slot_is_reused() {
    with_file(|path| {
        let nccl = here();
        let all_reduce = c"AllReduce";
        let (ctx, _) = nccl.init(5, 0, 2);
        let op = nccl.post(ctx, all_reduce, 1024, 2);
        let _running = nccl.channel_start(ctx, op, 0, 50);
        // ncclCommAbort: the proxy is torn down, then finalize; no stop ever comes.
        nccl.finalize(ctx);
        let c = read(path);
        assert!(!c.comms[0].live);
        assert_eq!((c.comms[0].posted, c.comms[0].timed_upto), (1, 0));
        // A new communicator (torch's restart of the group) takes a free slot: the
        // aborted one's counters stay readable.
        let (ctx, _) = nccl.init(6, 0, 2);
        let c = read(path);
        assert_eq!(
            (c.comms.len(), c.comms[1].hash, c.comms[1].posted),
            (2, 6, 0)
        );
        nccl.finalize(ctx);
    });
}

#[test]
fn a_finalized_slot_is_reused_only_when_none_is_free() {
    with_file(|path| {
        let nccl = here();
        let live: Vec<*mut c_void> = (0..32).map(|i| nccl.init(1000 + i, 0, 2).0).collect();
        assert!(live.iter().all(|c| !c.is_null()));
        let (full, mask) = nccl.init(2000, 0, 2);
        assert!(
            full.is_null(),
            "33 live communicators: the last is not counted"
        );
        assert_eq!(mask, 0);
        assert_eq!(read(path).uncounted, 1, "and the header says so");
        nccl.finalize(live[7]);
        let (again, _) = nccl.init(3000, 0, 2);
        let c = read(path);
        let reused = c.comms.iter().find(|x| x.hash == 3000).unwrap();
        assert_eq!(reused.slot, 7);
        assert_eq!(reused.generation, 4, "claimed twice, two bumps each");
        nccl.finalize(again);
        live.iter()
            .filter(|c| **c != live[7])
            .for_each(|c| nccl.finalize(*c));
    });
}

/// The fastest big operation of the GPU timer's epoch is kept with its function, the
/// epoch before's beside it; small ones time latency, not links, and are left out.
#[test]
fn the_fastest_big_operation_of_the_epoch_is_kept() {
    with_file(|path| {
        let nccl = here();
        let (all_reduce, all_gather) = (c"AllReduce", c"AllGather");
        let (ctx, _) = nccl.init(21, 0, 2);
        let mib = 1 << 20; // floats: 4 MiB
        let slow = nccl.post(ctx, all_reduce, mib, 1);
        nccl.channel(ctx, slow, 0, 1_000, 1_000 + 400_000); // 4 MiB in 400 us
        let fast = nccl.post(ctx, all_gather, mib, 1);
        nccl.channel(ctx, fast, 0, 2_000_000, 2_000_000 + 20_000); // in 20 us
        let small = nccl.post(ctx, all_reduce, 8, 1);
        nccl.channel(ctx, small, 0, 3_000_000, 3_000_001);
        let f = read(path).comms[0].fastest.unwrap();
        assert_eq!(f.func, NcclFunc::AllGather);
        assert!((f.gbps - 209.7).abs() < 0.1, "{f:?}");
        // The next epoch (10 s on the GPU timer) keeps the last one's beside its own.
        let next = nccl.post(ctx, all_reduce, mib, 1);
        nccl.channel(ctx, next, 0, 10_000_000_000, 10_000_400_000);
        let f = read(path).comms[0].fastest.unwrap();
        assert_eq!(
            f.func,
            NcclFunc::AllGather,
            "the epoch before's, still faster"
        );
        nccl.finalize(ctx);
    });
}

/// CollNet's operations say 0 channels and still report theirs (NCCL's enqueue.cc
/// never sets a CollNet task's nChannels): such an operation completes when every
/// channel it started has stopped, once; one that says its channels completes when
/// they stop, once, however many more stops come.
#[test]
fn operations_with_unsaid_or_extra_channels_complete_once() {
    with_file(|path| {
        let nccl = here();
        let all_reduce = c"AllReduce";
        let (ctx, _) = nccl.init(9, 0, 2);
        let op = nccl.post(ctx, all_reduce, 1 << 20, 0);
        assert_eq!(read(path).comms[0].timed_upto, 0, "not done when posted");
        let (a, b) = (
            nccl.channel_start(ctx, op, 0, 10),
            nccl.channel_start(ctx, op, 1, 12),
        );
        nccl.channel_stop(a, 20);
        assert_eq!(read(path).comms[0].timed_upto, 0, "one channel still runs");
        nccl.channel_stop(b, 30);
        let c = read(path);
        assert_eq!(
            (c.comms[0].timed_upto, c.comms[0].done, c.comms[0].busy_ns),
            (1, 1, 20)
        );
        let op = nccl.post(ctx, all_reduce, 64, 1);
        nccl.channel(ctx, op, 0, 40, 45);
        nccl.channel(ctx, op, 1, 41, 46);
        let c = read(path);
        assert_eq!(
            (c.comms[0].timed_upto, c.comms[0].done),
            (2, 2),
            "counted once"
        );
        nccl.finalize(ctx);
    });
}

#[test]
fn operations_past_the_ring_are_not_left_open() {
    with_file(|path| {
        let nccl = here();
        let all_reduce = c"AllReduce";
        let (ctx, _) = nccl.init(9, 0, 2);
        // An operation whose channels never report (a kernel without profiler
        // hooks) is done once a later one completes.
        nccl.post(ctx, all_reduce, 64, 1);
        let op = nccl.post(ctx, all_reduce, 64, 1);
        nccl.channel(ctx, op, 0, 1, 2);
        let c = read(path);
        assert_eq!((c.comms[0].posted, c.comms[0].timed_upto), (2, 2));
        // A channel id past NCCL's 64 is counted as dropped, not followed.
        let op = nccl.post(ctx, all_reduce, 64, 1);
        assert!(nccl.channel_start(ctx, op, 200, 5).is_null());
        assert_eq!(read(path).dropped, 1);
        nccl.finalize(ctx);
    });
}

/// Sampled: a burst of operations timed (the mask's kernel-channel bit on while they
/// are enqueued), then only counted as posted until the next burst, a period's worth
/// of posts later (here the burst's second post comes two periods after its first:
/// a period held one post, so the next burst begins after one). The counters take
/// an operation as timed once its channels report.
#[test]
fn kernel_channels_are_timed_in_bursts_and_every_operation_is_counted() {
    with_file(|path| {
        std::env::set_var(SAMPLING_VAR, "2/40");
        let nccl = here();
        let all_reduce = c"AllReduce";
        let mask = || NCCL_MASK.load(Ordering::Relaxed) as u64;
        let (ctx, first) = nccl.init(0xb0b, 0, 2);
        assert_eq!(first as u64, EVENT_COLL | EVENT_P2P | EVENT_KERNEL_CH);
        let timed: Vec<_> = (0..2)
            .map(|i| {
                std::thread::sleep(std::time::Duration::from_millis(100 * i));
                nccl.post(ctx, all_reduce, 8, 1)
            })
            .collect();
        assert!(timed.iter().all(|op| !op.is_null()));
        assert_eq!(mask(), EVENT_COLL | EVENT_P2P, "the burst is over");
        for (i, op) in timed.into_iter().enumerate() {
            nccl.channel(ctx, op, 0, 100 * i as u64 + 1, 100 * i as u64 + 41);
        }
        // Enqueued before the bit went on again: not timed; the next two are.
        assert!(nccl.post(ctx, all_reduce, 8, 1).is_null(), "not timed");
        assert_eq!(mask(), EVENT_COLL | EVENT_P2P | EVENT_KERNEL_CH);
        let op = nccl.post(ctx, all_reduce, 8, 1);
        assert!(!op.is_null());
        nccl.channel(ctx, op, 0, 1000, 1050);
        let r = read(path);
        assert_eq!(
            r.sampling,
            KernelSampling::Bursts {
                burst: 2,
                period_ms: 40
            }
        );
        let c = &r.comms[0];
        assert_eq!((c.posted, c.done, c.busy_ns), (4, 3, 130));
        assert_eq!(
            c.timed_upto, 4,
            "the last timed one completes those before it"
        );
        let timed: Vec<bool> = c.recent.iter().map(|o| o.timed).collect();
        assert_eq!(timed, [true, true, false, true]);
        nccl.finalize(ctx);
    });
}

#[test]
fn without_toporun_s_variable_nothing_is_asked() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    std::env::remove_var(PATH_VAR);
    let (ctx, mask) = here().init(1, 0, 2);
    assert!(ctx.is_null());
    assert_eq!(mask, 0);
    // NCCL may still call with the null context: nothing followed, nothing breaks.
    let all_reduce = c"AllReduce";
    assert!(here().post(ctx, all_reduce, 8, 1).is_null());
    here().finalize(ctx);
}

/// Whether the library at `lib` is loaded in this process (without loading it).
fn loaded(lib: &Path) -> bool {
    let name = CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if !h.is_null() {
        unsafe { libc::dlclose(h) };
    }
    !h.is_null()
}

/// The built plugin, as NCCL dlopens it: closed after its last communicator (NCCL
/// does this when a process destroys every communicator), it stays loaded, so that
/// an event NCCL reports late through the closed table still finds the code and the
/// records; a new communicator then counts on as before.
#[test]
fn the_built_library_stays_loaded_once_it_counted() {
    let lib = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libtoporun_nccl_profiler.so");
    assert!(lib.exists(), "{} not built", lib.display());
    assert!(!loaded(&lib), "loaded before the test");
    with_file(|path| {
        let all_reduce = c"AllReduce";
        for round in 1..=2u64 {
            let library = unsafe { libloading::Library::new(&lib) }.unwrap();
            let table: libloading::Symbol<*const ProfilerV5> =
                unsafe { library.get(b"ncclProfiler_v5\0") }.unwrap();
            let nccl = Nccl {
                table: unsafe { &**table },
            };
            let (ctx, mask) = nccl.init(100 + round, 0, 2);
            assert_ne!(mask, 0);
            let op = nccl.post(ctx, all_reduce, 8, 2);
            nccl.channel(ctx, op, 0, 0, 10);
            let late = nccl.channel_start(ctx, op, 1, 5);
            nccl.finalize(ctx);
            drop(library);
            assert!(
                loaded(&lib),
                "round {round}: unloaded under NCCL's late events"
            );
            // The proxy thread's last stop, after finalize and close: ignored.
            nccl.channel_stop(late, 12);
            let c = read(path);
            assert_eq!(c.inits, round, "round {round}");
            let last = c.comms.iter().find(|x| x.hash == 100 + round).unwrap();
            assert_eq!(
                (last.posted, last.timed_upto),
                (1, 0),
                "the late stop counts nothing"
            );
        }
    });
}

/// NCCL reports events of a communicator it has finalised (a proxy thread shared by
/// split communicators, a host callback behind a hung kernel), while another thread
/// finalises and a new communicator takes the pooled context: nothing faults, and
/// nothing the old communicator's threads report lands on the new one's counters.
#[test]
fn finalize_racing_posts_and_late_events_harms_no_one() {
    with_file(|path| {
        std::env::set_var(SAMPLING_VAR, "all");
        // The rest a context takes before reuse, as shipped, but short enough for
        // 50 rounds; the race is that of a thread past its check before finalize.
        set_reuse_grace_for_tests(std::time::Duration::from_millis(20));
        let nccl = here();
        for round in 0..50u64 {
            std::thread::sleep(std::time::Duration::from_millis(25));
            let (old, _) = nccl.init(7000 + round, 0, 2);
            let old_addr = old as usize;
            let stop = std::sync::atomic::AtomicBool::new(false);
            std::thread::scope(|s| {
                let stop = &stop;
                s.spawn(move || {
                    let (nccl, f) = (here(), c"AllReduce");
                    let ctx = old_addr as *mut c_void;
                    while !stop.load(Ordering::Relaxed) {
                        let op = nccl.post(ctx, f, 1 << 20, 2);
                        let a = nccl.channel_start(ctx, op, 0, 1);
                        let b = nccl.channel_start(ctx, op, 1, 2);
                        nccl.channel_stop(a, 3);
                        nccl.channel_stop(b, 4);
                    }
                });
                std::thread::sleep(std::time::Duration::from_micros(200));
                nccl.finalize(old);
                let (new, _) = nccl.init(8000 + round, 0, 2);
                std::thread::sleep(std::time::Duration::from_micros(200));
                stop.store(true, Ordering::Relaxed);
                let c = read(path);
                let fresh = c.comms.iter().find(|x| x.hash == 8000 + round).unwrap();
                assert_eq!(
                    (fresh.posted, fresh.timed_upto, fresh.done),
                    (0, 0, 0),
                    "round {round}: the finalised communicator's events counted on the new one"
                );
                nccl.finalize(new);
            });
        }
    });
}

/// The host 256 operations ahead of the GPU: the 257th is counted as dropped, not
/// given the record of the first, whose channels still land on the first.
#[test]
fn a_host_far_ahead_of_the_gpu_drops_operations_rather_than_mixing_them() {
    with_file(|path| {
        let nccl = here();
        let all_reduce = c"AllReduce";
        let (ctx, _) = nccl.init(11, 0, 2);
        let first = nccl.post(ctx, all_reduce, 64, 1);
        for _ in 1..256 {
            assert!(!nccl.post(ctx, all_reduce, 64, 1).is_null());
        }
        assert!(
            nccl.post(ctx, all_reduce, 64, 1).is_null(),
            "record 0 still follows op 0"
        );
        nccl.channel(ctx, first, 0, 10, 20);
        let c = read(path);
        let comm = &c.comms[0];
        assert_eq!(
            (c.dropped, comm.posted, comm.timed_upto, comm.done),
            (1, 257, 1, 1)
        );
        assert_eq!(comm.busy_ns, 10);
        nccl.finalize(ctx);
    });
}

/// A counters file another live process writes (a child of the rank, or its
/// parent, that initialised NCCL first with the rank's variable) is not taken over:
/// this process counts in its own file beside it, which the agent prefers when its
/// pid is the rank's.
#[test]
fn another_live_process_s_file_is_left_alone() {
    with_file(|path| {
        use toporun_shared::nccl_counters::layout::{
            FILE_BYTES, H_MAGIC, H_PID, H_VERSION, MAGIC, VERSION,
        };
        let mut bytes = vec![0u8; FILE_BYTES];
        for (w, v) in [(H_MAGIC, MAGIC), (H_VERSION, VERSION), (H_PID, 1)] {
            bytes[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        std::fs::write(path, &bytes).unwrap();
        let all_reduce = c"AllReduce";
        let (ctx, mask) = here().init(13, 0, 2);
        assert!(!ctx.is_null(), "counted");
        assert_ne!(mask, 0);
        here().post(ctx, all_reduce, 64, 1);
        assert_eq!(
            std::fs::read(path).unwrap(),
            bytes,
            "pid 1's file untouched"
        );
        let mut own = path.as_os_str().to_owned();
        own.push(format!(".{}", std::process::id()));
        let c = read(Path::new(&own));
        assert_eq!(
            (c.pid, c.comms[0].hash, c.comms[0].posted),
            (std::process::id(), 13, 1)
        );
        here().finalize(ctx);
    });
}

/// Under sampling a send is not timed: it leaves no total, and eight collectives
/// later the ring no longer holds it. The header's bit still says the communicator
/// carries point-to-point, and it is cleared when another communicator takes the slot.
#[test]
fn an_untimed_send_is_said_after_the_ring_has_moved_on() {
    with_file(|path| {
        std::env::set_var(SAMPLING_VAR, "off");
        let nccl = here();
        let (send, all_reduce) = (c"Send", c"AllReduce");
        let (stage, _) = nccl.init(0x51a9e, 0, 2);
        let (dp, _) = nccl.init(0xd9, 0, 2);
        assert!(nccl.post(stage, send, 1 << 20, 1).is_null(), "not timed");
        for _ in 0..9 {
            nccl.post(stage, all_reduce, 64, 1);
            nccl.post(dp, all_reduce, 64, 1);
        }
        let r = read(path);
        let of = |hash: u64| r.comms.iter().find(|c| c.hash == hash).unwrap().clone();
        let (stage_c, dp_c) = (of(0x51a9e), of(0xd9));
        assert!(stage_c.recent.iter().all(|o| !o.func.is_p2p()) && stage_c.funcs.is_empty());
        assert!(stage_c.posted_p2p && stage_c.carries_p2p(), "{stage_c:?}");
        assert!(!dp_c.posted_p2p && !dp_c.carries_p2p(), "{dp_c:?}");
        // The stage's slot taken by a communicator that posted nothing yet (a
        // finalised slot is taken once none is free).
        let slot = stage_c.slot;
        let fill: Vec<*mut c_void> = (0..30).map(|i| nccl.init(0xf111 + i, 0, 2).0).collect();
        nccl.finalize(stage);
        let (next, _) = nccl.init(0x7e57, 0, 2);
        let r = read(path);
        let again = r.comms.iter().find(|c| c.hash == 0x7e57).unwrap();
        assert_eq!(again.slot, slot);
        assert!(!again.posted_p2p, "{again:?}");
        fill.into_iter().for_each(|c| nccl.finalize(c));
        nccl.finalize(next);
        nccl.finalize(dp);
    });
}

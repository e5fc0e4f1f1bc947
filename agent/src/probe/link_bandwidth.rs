//! `preflight --measure`: copy bandwidth between every GPU pair (both directions, over
//! the path CUDA takes: peer access where the GPUs allow it, else staged through host
//! memory) and between each GPU and pinned memory near it, timed with CUDA events.
//! The CUDA driver is loaded at run time (cudarc, dynamic loading): a container
//! without libcuda.so.1 gets a measurement that says so.

use cudarc::driver::{result, sys};
use std::ffi::c_void;
use std::time::{Duration, Instant};
use toporun_shared::copy_rounds::copy_rounds;
use toporun_shared::cpulist;
use toporun_shared::facts::{same_bus, GpuFacts, HostCopy, LinkBandwidth, PairCopy};

/// Bytes per copy between GPUs: large enough that a copy's fixed cost is noise on NVLink.
pub const BUFFER_BYTES: usize = 64 << 20;
/// Bytes per copy with pinned host memory: 0.3 ms a copy at PCIe Gen5's 55 GB/s, so
/// the copies queued back to back hide their fixed cost; pinning costs by the page
/// (64 MiB took 25-38 ms a GPU), and this buffer is all that is pinned.
pub const HOST_BUFFER_BYTES: usize = 16 << 20;
/// Copies per link run untimed for about this long, then twice timed for about
/// TARGET_SECONDS (at least one copy, at most MAX_REPS).
const WARM_SECONDS: f64 = 0.005;
/// The way back over a link just warmed by the way there needs no warming.
const WARMED_SECONDS: f64 = 0.0;
const TARGET_SECONDS: f64 = 0.010;
const MAX_REPS: usize = 20;
/// A hung or crawling link must not hold a launch: stop measuring after this.
const BUDGET: Duration = Duration::from_secs(10);

/// Starts the CUDA driver (cuInit, about 0.5 s on 4 GPUs) on a thread of its own, so
/// that it runs beside the host's probes (NVML, /sys) that the measurement needs
/// first; [`measure`]'s own cuInit then finds it done, or waits for it. Nothing where
/// the process has no driver library.
pub fn start_driver() {
    // SAFETY: only tries to dlopen the library; cudarc panics on first use otherwise.
    if unsafe { sys::is_culib_present() } {
        std::thread::spawn(|| {
            let _ = result::init();
        });
    }
}

/// Measures every link of the GPUs CUDA sees, named by their index in `gpus` (NVML
/// order, matched by PCI bus id: CUDA's own order can differ).
pub fn measure(gpus: &GpuFacts) -> LinkBandwidth {
    let t0 = Instant::now();
    // SAFETY: only tries to dlopen the library; cudarc panics on first use otherwise.
    if !unsafe { sys::is_culib_present() } {
        return LinkBandwidth {
            error: Some("no CUDA driver library (libcuda.so.1) in this container: run it with the NVIDIA runtime to measure links".into()),
            ..Default::default()
        };
    }
    let mut m = LinkBandwidth {
        buffer_bytes: BUFFER_BYTES as u64,
        host_buffer_bytes: HOST_BUFFER_BYTES as u64,
        ..Default::default()
    };
    if let Err(e) = run(gpus, t0, &mut m) {
        m.error = Some(e.to_string());
    }
    m.seconds = t0.elapsed().as_secs_f64();
    m
}

/// One GPU's context, buffers, stream and events. Raw CUDA handles: used from one
/// thread at a time, each call after making its context current.
struct Gpu {
    index: u32,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
    host: *mut c_void,
    start: sys::CUevent,
    stop: sys::CUevent,
    cpus: String,
}

// SAFETY: CUDA handles may be used from any thread once their context is current there.
unsafe impl Send for Gpu {}

/// Why a measurement stopped.
#[derive(Debug, thiserror::Error)]
enum MeasureError {
    #[error("{call}: {source:?}")]
    Cuda {
        call: String,
        #[source]
        source: result::DriverError,
    },
    #[error("a setup thread panicked")]
    SetupPanicked,
    #[error("stopped after {} s: links too slow to measure them all", BUDGET.as_secs())]
    OverBudget,
}

fn cuda(what: &str, source: result::DriverError) -> MeasureError {
    MeasureError::Cuda {
        call: what.to_string(),
        source,
    }
}

fn run(gpus: &GpuFacts, t0: Instant, m: &mut LinkBandwidth) -> Result<(), MeasureError> {
    result::init().map_err(|e| cuda("cuInit", e))?;
    m.driver_seconds = t0.elapsed().as_secs_f64();
    let mut version = 0;
    // SAFETY: an out-parameter.
    if unsafe { sys::cuDriverGetVersion(&mut version) } == sys::CUresult::CUDA_SUCCESS {
        m.cuda_driver = Some(version as u32);
    }
    let count = result::device::get_count().map_err(|e| cuda("cuDeviceGetCount", e))?;
    // Contexts and pinned buffers for all GPUs at once: most of the start-up cost,
    // and each pinned buffer allocated by a thread on its GPU's CPUs.
    let setups: Vec<_> = (0..count)
        .map(|ordinal| {
            let (index, cpus) = identify(gpus, ordinal);
            std::thread::spawn(move || setup(ordinal, index, &cpus))
        })
        .collect();
    let mut all = Vec::new();
    let mut failed = None;
    for s in setups {
        match s.join() {
            Ok(Ok(g)) => all.push(g),
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some(MeasureError::SetupPanicked)),
        }
    }
    m.init_seconds = t0.elapsed().as_secs_f64();
    let outcome = match failed {
        Some(e) => Err(e),
        None => measure_all(gpus, &all, t0, m),
    };
    for g in all {
        teardown(g);
    }
    outcome
}

/// The facts index of CUDA device `ordinal` (by PCI bus id), and its near CPUs.
fn identify(gpus: &GpuFacts, ordinal: i32) -> (u32, Vec<u32>) {
    let bus = result::device::get(ordinal).ok().map(|dev| {
        let attr = |a| unsafe { result::device::get_attribute(dev, a) }.unwrap_or(-1);
        use sys::CUdevice_attribute::*;
        format!(
            "{:08x}:{:02x}:{:02x}.0",
            attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
        )
    });
    match bus.and_then(|b| gpus.devices.iter().find(|d| same_bus(&d.pci_bus_id, &b))) {
        Some(d) => (d.index, d.cpu_affinity.clone()),
        None => (ordinal as u32, Vec::new()),
    }
}

fn setup(ordinal: i32, index: u32, cpus: &[u32]) -> Result<Gpu, MeasureError> {
    if !cpus.is_empty() {
        let mut set = nix::sched::CpuSet::new();
        for c in cpus {
            let _ = set.set(*c as usize);
        }
        // Best effort: a cgroup may not allow those CPUs; the figure says where it ran.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
    let on = |what: &'static str| move |e| cuda(&format!("GPU{index} {what}"), e);
    let dev = result::device::get(ordinal).map_err(on("cuDeviceGet"))?;
    // SAFETY: `dev` came from cuDeviceGet; every handle below is used with its
    // context current, and freed in `teardown`.
    unsafe {
        let ctx = result::primary_ctx::retain(dev).map_err(on("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(ctx).map_err(on("cuCtxSetCurrent"))?;
        let src = result::malloc_sync(BUFFER_BYTES).map_err(on("cuMemAlloc"))?;
        let dst = result::malloc_sync(BUFFER_BYTES).map_err(on("cuMemAlloc"))?;
        result::memset_d8_sync(src, 1, BUFFER_BYTES).map_err(on("cuMemsetD8"))?;
        // Its contents do not matter to a copy's speed: left as the kernel zeroed it.
        let host = result::malloc_host(HOST_BUFFER_BYTES, 0).map_err(on("cuMemHostAlloc"))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(on("cuStreamCreate"))?;
        let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(on("cuEventCreate"))?;
        let stop = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(on("cuEventCreate"))?;
        Ok(Gpu {
            index,
            dev,
            ctx,
            stream,
            src,
            dst,
            host,
            start,
            stop,
            cpus: cpulist::format(cpus),
        })
    }
}

fn teardown(g: Gpu) {
    // SAFETY: the handles were made in `setup` and are not used after this.
    unsafe {
        let _ = result::ctx::set_current(g.ctx);
        let _ = result::stream::synchronize(g.stream);
        let _ = result::event::destroy(g.start);
        let _ = result::event::destroy(g.stop);
        let _ = result::stream::destroy(g.stream);
        let _ = result::memory_free(g.src);
        let _ = result::memory_free(g.dst);
        let _ = result::free_host(g.host);
        // The last reference destroys the context: the GPUs are free for the ranks.
        let _ = result::primary_ctx::release(g.dev);
    }
}

fn measure_all(
    gpus: &GpuFacts,
    all: &[Gpu],
    t0: Instant,
    m: &mut LinkBandwidth,
) -> Result<(), MeasureError> {
    let over = || t0.elapsed() > BUDGET;
    let visible: Vec<u32> = all.iter().map(|g| g.index).collect();
    let of = |index: u32| {
        all.iter()
            .find(|g| g.index == index)
            .expect("a visible GPU")
    };
    for round in copy_rounds(gpus, &visible) {
        if over() {
            return Err(MeasureError::OverBudget);
        }
        let pairs: Vec<(&Gpu, &Gpu)> = round.iter().map(|&(a, b)| (of(a), of(b))).collect();
        let mapping = Instant::now();
        let mut peer_access = Vec::new();
        for (a, b) in &pairs {
            peer_access.push(enable_peer(a, b)?);
        }
        m.peer_seconds += mapping.elapsed().as_secs_f64();
        // Each copy runs on its source GPU's stream, as PyTorch's tensor.to() does.
        let copies: Vec<LinkCopy> = pairs
            .iter()
            .map(|&(a, b)| -> LinkCopy {
                (
                    a,
                    // SAFETY: both GPUs' buffers hold BUFFER_BYTES until teardown.
                    Box::new(move |s| unsafe {
                        result::memcpy_peer_async(b.ctx, b.dst, a.ctx, a.src, BUFFER_BYTES, s)
                    }),
                )
            })
            .collect();
        let gbps = time(&copies, BUFFER_BYTES, WARM_SECONDS)?;
        for (((a, b), gbps), peer_access) in pairs.iter().zip(gbps).zip(peer_access) {
            m.pairs.push(PairCopy {
                src: a.index,
                dst: b.index,
                gbps,
                peer_access,
            });
        }
    }
    // Host links one at a time: GPUs may share a PCIe switch's uplink.
    for g in all {
        if over() {
            return Err(MeasureError::OverBudget);
        }
        // SAFETY: the pinned host buffer holds HOST_BUFFER_BYTES, the device ones more.
        let h2d: LinkCopy = (
            g,
            Box::new(|s| unsafe {
                sys::cuMemcpyHtoDAsync_v2(g.dst, g.host, HOST_BUFFER_BYTES, s).result()
            }),
        );
        let d2h: LinkCopy = (
            g,
            Box::new(|s| unsafe {
                sys::cuMemcpyDtoHAsync_v2(g.host, g.src, HOST_BUFFER_BYTES, s).result()
            }),
        );
        m.host.push(HostCopy {
            gpu: g.index,
            h2d_gbps: time(&[h2d], HOST_BUFFER_BYTES, WARM_SECONDS)?[0],
            d2h_gbps: time(&[d2h], HOST_BUFFER_BYTES, WARMED_SECONDS)?[0],
            cpus: g.cpus.clone(),
        });
    }
    m.pairs.sort_by_key(|p| (p.src, p.dst));
    m.host.sort_by_key(|h| h.gpu);
    Ok(())
}

/// Turns on peer access from `a` to `b` where CUDA allows it: whether it is on.
fn enable_peer(a: &Gpu, b: &Gpu) -> Result<bool, MeasureError> {
    let mut can = 0;
    // SAFETY: out-parameter; devices from cuDeviceGet.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.dev, b.dev) }
        .result()
        .map_err(|e| cuda("cuDeviceCanAccessPeer", e))?;
    if can != 1 {
        return Ok(false);
    }
    // SAFETY: a's context current; enabling twice answers "already enabled".
    unsafe {
        result::ctx::set_current(a.ctx).map_err(|e| cuda("cuCtxSetCurrent", e))?;
        let rc = sys::cuCtxEnablePeerAccess(b.ctx, 0);
        Ok(rc == sys::CUresult::CUDA_SUCCESS
            || rc == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    }
}

/// One copy of BUFFER_BYTES, enqueued on the given stream of its GPU.
type LinkCopy<'a> = (
    &'a Gpu,
    Box<dyn Fn(sys::CUstream) -> Result<(), result::DriverError> + 'a>,
);

/// GB/s of each copy of `bytes`, all running at once (one per GPU's stream). An idle
/// GPU's PCIe link runs at a low generation and retrains under load, and first use
/// maps peer memory: copies run untimed for `warm_seconds` first (one at least). Then
/// two timed runs of about TARGET_SECONDS; the faster counts (a link does not run
/// faster than it can, only slower when disturbed).
fn time(copies: &[LinkCopy], bytes: usize, warm_seconds: f64) -> Result<Vec<f64>, MeasureError> {
    let err = |e| cuda(&format!("GPU{} copy", copies[0].0.index), e);
    let mut warm = 0.0;
    let mut one = f64::MAX;
    for _ in 0..MAX_REPS {
        let slowest = timed(copies, 1)
            .map_err(err)?
            .into_iter()
            .fold(0.0, f64::max);
        one = one.min(slowest);
        warm += slowest;
        if warm >= warm_seconds {
            break;
        }
    }
    let reps = ((TARGET_SECONDS / one).ceil() as usize).clamp(1, MAX_REPS);
    let (first, second) = (
        timed(copies, reps).map_err(err)?,
        timed(copies, reps).map_err(err)?,
    );
    Ok(first
        .iter()
        .zip(second)
        .map(|(a, b)| (bytes * reps) as f64 / a.min(b) / 1e9)
        .collect())
}

/// Seconds each copy's `reps` repetitions took on its GPU, every GPU's enqueued
/// before any is waited for.
fn timed(copies: &[LinkCopy], reps: usize) -> Result<Vec<f64>, result::DriverError> {
    // SAFETY: each GPU's context is made current before its calls; its events and
    // stream live until teardown.
    unsafe {
        for (g, copy) in copies {
            result::ctx::set_current(g.ctx)?;
            result::event::record(g.start, g.stream)?;
            for _ in 0..reps {
                copy(g.stream)?;
            }
            result::event::record(g.stop, g.stream)?;
        }
        let mut secs = Vec::with_capacity(copies.len());
        for (g, _) in copies {
            result::ctx::set_current(g.ctx)?;
            result::event::synchronize(g.stop)?;
            secs.push((result::event::elapsed(g.start, g.stop)? as f64 / 1e3).max(1e-9));
        }
        Ok(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No GPU in the facts: nothing is measured, on any machine; without the driver
    /// library the measurement says so (a GPU machine's figures are the device
    /// script's to check).
    #[test]
    fn without_a_driver_the_measurement_says_so() {
        let m = measure(&GpuFacts::default());
        assert!(m.pairs.is_empty() && m.host.is_empty(), "{m:?}");
        let driver = unsafe { sys::is_culib_present() };
        let said = m.error.as_deref().unwrap_or_default();
        assert_eq!(said.contains("libcuda.so.1"), !driver, "{said}");
    }
}

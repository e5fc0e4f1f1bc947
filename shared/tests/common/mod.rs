//! What the tests on the GPU machines' captures share: where a fixture set lies, and
//! a counters file read back (gzipped in the fixtures).

use flate2::read::GzDecoder;
use std::io::Read;
use std::path::PathBuf;
use toporun_shared::flight_recorder::GpuTime;
use toporun_shared::nccl_counters::{decode, RankCounters};
use toporun_shared::stacks::rank_window::CommWait;

/// `path` in the device fixture set `set` (tests/fixtures/device/SET).
pub fn device_fixture(set: &str, path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device")
        .join(set)
        .join(path)
}

/// Seconds into the run of the first stamped line (`[  36.32] ...`) of `lines` that
/// contains `what`. Not every test binary reads stamped output.
#[allow(dead_code)]
pub fn stamp_of(lines: &[String], what: &str) -> f64 {
    let line = lines
        .iter()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?}: {lines:#?}"));
    line[1..line.find(']').unwrap()].trim().parse().unwrap()
}

/// The counters file at `path` in `set`, gunzipped and decoded. Not every test
/// binary reads counters.
#[allow(dead_code)]
pub fn counters_file(set: &str, path: &str) -> RankCounters {
    let f = std::fs::File::open(device_fixture(set, path)).unwrap();
    let mut bytes = Vec::new();
    GzDecoder::new(f).read_to_end(&mut bytes).unwrap();
    decode(&bytes).unwrap()
}

/// A window read from two captures as a rank's per-communicator waits: the one
/// reading's share stands for each third. Not every test binary reads windows.
#[allow(dead_code)]
pub fn comm_waits(t: &GpuTime) -> Vec<CommWait> {
    t.comms
        .iter()
        .map(|c| {
            let share = c.busy_ns as f64 / t.span_ns as f64;
            CommWait {
                comm: c.comm,
                share,
                thirds: [Some(share); 3],
                p2p: c.p2p,
            }
        })
        .collect()
}

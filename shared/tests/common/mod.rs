//! What the tests on the GPU machines' captures share: where a fixture set lies, and
//! a counters file read back (gzipped in the fixtures).

use flate2::read::GzDecoder;
use std::io::Read;
use std::path::PathBuf;
use toporun_shared::nccl_counters::{decode, RankCounters};

/// `path` in the device fixture set `set` (tests/fixtures/device/SET).
pub fn device_fixture(set: &str, path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device")
        .join(set)
        .join(path)
}

/// The counters file at `path` in `set`, gunzipped and decoded.
pub fn counters_file(set: &str, path: &str) -> RankCounters {
    let f = std::fs::File::open(device_fixture(set, path)).unwrap();
    let mut bytes = Vec::new();
    GzDecoder::new(f).read_to_end(&mut bytes).unwrap();
    decode(&bytes).unwrap()
}

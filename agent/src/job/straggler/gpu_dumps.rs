//! Each local rank's flight recorder, dumped while it trains: a byte written to the
//! rank's pipe (`<pipe prefix><rank>.pipe`, TORCH_NCCL_DEBUG_INFO_PIPE_FILE) makes
//! stock ProcessGroupNCCL's monitor thread dump at its next poll (every second where
//! TORCH_NCCL_DUMP_ON_TIMEOUT is on), to the same `<prefix><rank>` file a timeout
//! dump goes to. Each dump read is moved out of that folder at once, so that a
//! failure or a hang stop reads only the dumps it caused; [`DumpsPaused`] stops the
//! asking while they are written.

use crate::stacks::RankPid;
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use toporun_shared::flight_recorder::{parse, Dump};

/// Set while a failure or a hang stop reads the ranks' own dumps.
#[derive(Debug, Clone, Default)]
pub struct DumpsPaused(Arc<AtomicBool>);

impl DumpsPaused {
    pub fn pause(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn paused(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Where the pipes and dumps are, and how often to ask.
#[derive(Debug, Clone)]
pub struct DumpPlaces {
    /// `<dir>/rank_`: the pipe of rank N is `<dir>/rank_N.pipe`.
    pub pipe_prefix: PathBuf,
    /// `<fr dir>/rank_`: where rank N's dump lands.
    pub dump_prefix: PathBuf,
    /// Where dumps read are moved (the last of each rank is kept).
    pub taken: PathBuf,
    pub every: Duration,
}

/// How long the dumps asked for are waited for before those that came are used.
const ASK_WAIT: Duration = Duration::from_secs(5);

/// How far a file's modification time may lag the clock (the kernel stamps files
/// with its tick-cached time).
const MTIME_SLACK: Duration = Duration::from_millis(100);

/// A dump larger than this is not read.
const MAX_DUMP_BYTES: u64 = 64 << 20;

pub struct GpuDumps {
    places: DumpPlaces,
    paused: DumpsPaused,
    /// When the pending ask was made, and the ranks asked.
    asked: Option<(Instant, SystemTime, Vec<u32>)>,
    /// The dumps of the pending ask that came so far (each is moved aside once read,
    /// so a rank's dump is read at one tick only).
    got: BTreeMap<u32, Dump>,
    last: Option<Instant>,
    /// Some rank's stack moved since the last ask.
    moved: bool,
}

impl GpuDumps {
    pub fn new(places: DumpPlaces, paused: DumpsPaused) -> GpuDumps {
        GpuDumps {
            places,
            paused,
            asked: None,
            got: BTreeMap::new(),
            last: None,
            moved: true,
        }
    }

    /// At each sample: the dumps asked for, once they are in; else a new ask when one
    /// is due and some rank's stack `moved` since the last. Ranks that stand still
    /// (a hang) are not asked: the dump they write counts as output, and the hang
    /// watch would read it as progress (2x H200: a rank stuck in a read was never
    /// reported while it dumped every 5 s).
    pub fn tick(&mut self, live: &[RankPid], moved: bool) -> Vec<Dump> {
        self.moved |= moved;
        if self.paused.paused() {
            return Vec::new();
        }
        if let Some((at, since, ranks)) = &self.asked {
            let came = self.arrived(ranks, *since);
            self.got.extend(came.into_iter().map(|d| (d.rank, d)));
            if self.got.len() < ranks.len() && at.elapsed() < ASK_WAIT {
                return Vec::new();
            }
            self.asked = None;
            self.last = Some(Instant::now());
            return std::mem::take(&mut self.got).into_values().collect();
        }
        if self.moved && self.last.is_none_or(|t| t.elapsed() >= self.places.every) {
            self.moved = false;
            self.ask(live);
        }
        Vec::new()
    }

    /// Writes to each live rank's pipe; ranks without one (no ProcessGroupNCCL, or
    /// not yet initialised) are not asked.
    fn ask(&mut self, live: &[RankPid]) {
        let since = SystemTime::now();
        let asked: Vec<u32> = live
            .iter()
            .filter(|r| poke(&with_rank(&self.places.pipe_prefix, r.rank, ".pipe")))
            .map(|r| r.rank)
            .collect();
        self.last = Some(Instant::now());
        if !asked.is_empty() {
            self.asked = Some((Instant::now(), since, asked));
        }
    }

    /// The dumps of `ranks` written since `since` that parse (one still being written
    /// does not), each moved out of the dump folder once read.
    fn arrived(&self, ranks: &[u32], since: SystemTime) -> Vec<Dump> {
        let mut out = BTreeMap::new();
        for &rank in ranks.iter().filter(|r| !self.got.contains_key(r)) {
            let f = with_rank(&self.places.dump_prefix, rank, "");
            // File times lag the clock by up to a kernel tick.
            let fresh = std::fs::metadata(&f)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t + MTIME_SLACK >= since);
            if !fresh {
                continue;
            }
            let Some(d) = read_dump(&f, rank) else {
                continue;
            };
            let _ = std::fs::create_dir_all(&self.places.taken);
            let _ = std::fs::rename(&f, self.places.taken.join(format!("rank_{rank}")));
            out.insert(rank, d);
        }
        out.into_values().collect()
    }
}

fn with_rank(prefix: &Path, rank: u32, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(format!("{rank}{suffix}"));
    PathBuf::from(s)
}

/// One byte into a FIFO whose reader is the rank's monitor thread; false where no
/// reader holds it open (ENXIO) or it is not there.
fn poke(pipe: &Path) -> bool {
    let open = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(pipe);
    open.and_then(|mut f| f.write_all(b"1")).is_ok()
}

fn read_dump(f: &Path, rank: u32) -> Option<Dump> {
    let h = std::fs::File::open(f).ok()?;
    let mut buf = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(h, MAX_DUMP_BYTES), &mut buf).ok()?;
    parse(rank, &buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::Mode;
    use std::io::Read;
    use toporun_shared::flight_recorder::gpu_times;

    fn live(rank: u32) -> RankPid {
        RankPid {
            rank,
            local_rank: rank,
            pid: 1,
        }
    }

    /// A dump of `n` timed 4 MiB all_reduces one per ms, each `busy_us` on the GPU,
    /// pickled as torch writes it (protocol 2 dict; what `parse` reads).
    fn pickled(n: u64, busy_us: f64) -> Vec<u8> {
        use serde_pickle::{HashableValue as H, Value as V};
        let s = |x: &str| V::String(x.into());
        let entries = (1..=n)
            .map(|seq| {
                let e: BTreeMap<H, V> = [
                    ("process_group", V::Tuple(vec![s("0"), s("default_pg")])),
                    ("collective_seq_id", V::I64(seq as i64)),
                    ("profiling_name", s("nccl:all_reduce")),
                    ("state", s("completed")),
                    (
                        "time_created_ns",
                        V::I64(1_000_000_000 + seq as i64 * 1_000_000),
                    ),
                    ("duration_ms", V::F64(busy_us / 1000.0)),
                    ("input_sizes", V::List(vec![V::List(vec![V::I64(1 << 20)])])),
                    ("input_dtypes", V::List(vec![s("Float")])),
                ]
                .into_iter()
                .map(|(k, v)| (H::String(k.into()), v))
                .collect();
                V::Dict(e)
            })
            .collect();
        let top: BTreeMap<H, V> = [
            (H::String("version".into()), s("2.10")),
            (H::String("entries".into()), V::List(entries)),
        ]
        .into();
        serde_pickle::value_to_vec(&V::Dict(top), Default::default()).unwrap()
    }

    /// A run directory with the pipes of `ranks` held open for reading, as each
    /// rank's monitor holds its own (non-blocking), and its dump folder.
    struct Site {
        dir: tempfile::TempDir,
        readers: Vec<std::fs::File>,
    }

    impl Site {
        fn new(ranks: u32) -> Site {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir_all(dir.path().join("pipes")).unwrap();
            std::fs::create_dir_all(dir.path().join("fr")).unwrap();
            let readers = (0..ranks)
                .map(|r| {
                    let pipe = dir.path().join(format!("pipes/rank_{r}.pipe"));
                    nix::unistd::mkfifo(&pipe, Mode::from_bits_truncate(0o600)).unwrap();
                    std::fs::OpenOptions::new()
                        .read(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&pipe)
                        .unwrap()
                })
                .collect();
            Site { dir, readers }
        }

        fn dumps(&self, paused: DumpsPaused) -> GpuDumps {
            let places = DumpPlaces {
                pipe_prefix: self.dir.path().join("pipes/rank_"),
                dump_prefix: self.dir.path().join("fr/rank_"),
                taken: self.dir.path().join("fr-sampled"),
                every: Duration::from_secs(60),
            };
            GpuDumps::new(places, paused)
        }

        fn dump(&self, rank: u32) -> PathBuf {
            self.dir.path().join(format!("fr/rank_{rank}"))
        }
    }

    /// Two ranks whose dumps land at different samples: both are matched (measured
    /// on 2x H200: reading each rank's dump at its own tick and moving it aside lost
    /// the first one, and the balanced job showed rank 0's share alone).
    #[test]
    fn dumps_that_land_at_different_samples_are_matched_together() {
        let site = Site::new(2);
        let mut g = site.dumps(DumpsPaused::default());
        let ranks = [live(0), live(1)];
        assert!(g.tick(&ranks, true).is_empty(), "asked");
        std::fs::write(site.dump(0), pickled(100, 600.0)).unwrap();
        assert!(
            g.tick(&ranks, true).is_empty(),
            "rank 1's dump is not in yet"
        );
        std::fs::write(site.dump(1), pickled(100, 150.0)).unwrap();
        let t = gpu_times(&g.tick(&ranks, true));
        let shares: Vec<(u32, u32)> = t
            .iter()
            .map(|t| (t.rank, (t.share() * 100.0).round() as u32))
            .collect();
        assert_eq!(shares, vec![(0, 60), (1, 15)]);
    }

    /// The whole round: the pipe poked (as the rank's monitor would read it), the
    /// dump that came read and moved out of the folder a failure reads.
    #[test]
    fn a_dump_asked_through_the_pipe_is_read_and_moved_aside() {
        let mut site = Site::new(1);
        let paused = DumpsPaused::default();
        let mut g = site.dumps(paused.clone());
        // Rank 1 has no pipe (gloo, or not initialised): not asked.
        assert!(g.tick(&[live(0), live(1)], true).is_empty());
        let mut poked = [0u8; 8];
        let mut reader = site.readers.remove(0);
        assert_eq!(reader.read(&mut poked).unwrap(), 1, "rank 0's pipe poked");
        // Half a dump (still being written) waits; the whole one is read.
        let bytes = pickled(100, 400.0);
        std::fs::write(site.dump(0), &bytes[..bytes.len() / 2]).unwrap();
        assert!(g.tick(&[live(0)], false).is_empty());
        std::fs::write(site.dump(0), &bytes).unwrap();
        let t = gpu_times(&g.tick(&[live(0)], false));
        assert_eq!(t.len(), 1, "{t:?}");
        assert!((t[0].share() - 0.4).abs() < 0.01, "{}", t[0].share());
        assert!(!site.dump(0).exists(), "moved out of the dump folder");
        assert!(site.dir.path().join("fr-sampled/rank_0").exists());
        // Not due yet: nothing asked.
        assert!(g.tick(&[live(0)], false).is_empty());
        let poked_again = matches!(reader.read(&mut poked), Ok(n) if n > 0);
        assert!(!poked_again, "no second poke before `every`");
        // Due, but no rank's stack moved since the last ask (a hang): nothing asked.
        g.last = None;
        assert!(g.tick(&[live(0)], false).is_empty());
        let poked_still = matches!(reader.read(&mut poked), Ok(n) if n > 0);
        assert!(!poked_still, "ranks standing still are not asked");
        assert!(g.tick(&[live(0)], true).is_empty());
        assert_eq!(reader.read(&mut poked).unwrap(), 1, "moved again: asked");
        // Paused (a failure reads the dumps): nothing asked, nothing moved.
        paused.pause();
        std::fs::write(site.dump(0), &bytes).unwrap();
        g.last = None;
        assert!(g.tick(&[live(0)], true).is_empty());
        assert!(site.dump(0).exists());
    }
}

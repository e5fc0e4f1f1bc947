//! Linux CPU list syntax ("0-23,48-71"), as in /sys, cpusets and nvidia-smi.

/// The highest CPU number accepted (Linux's NR_CPUS tops out at 8192; cpusets and
/// forged facts must not size allocations beyond this).
pub const MAX_CPU: u32 = 65535;

/// Parses a CPU list; `None` when it is not one. Ranges are merged before they are
/// expanded, so a list repeating "0-65535" a thousand times costs what one does.
pub fn parse(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut ranges = Vec::new();
    for part in text.split(',') {
        let (lo, hi): (u32, u32) = match part.trim().split_once('-') {
            Some((lo, hi)) => (lo.trim().parse().ok()?, hi.trim().parse().ok()?),
            None => {
                let c = part.trim().parse().ok()?;
                (c, c)
            }
        };
        if hi < lo || hi > MAX_CPU {
            return None;
        }
        ranges.push((lo, hi));
    }
    ranges.sort_unstable();
    let mut cpus = Vec::new();
    let mut next = 0u32; // first CPU not yet emitted
    for (lo, hi) in ranges {
        let from = lo.max(next);
        if from <= hi {
            cpus.extend(from..=hi);
            next = hi + 1;
        }
    }
    Some(cpus)
}

/// Formats CPUs as a compact list: [0,1,2,5] -> "0-2,5".
pub fn format(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        while i + 1 < sorted.len() && sorted[i + 1] == sorted[i] + 1 {
            i += 1;
        }
        out.push(if sorted[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", sorted[i])
        });
        i += 1;
    }
    out.join(",")
}

/// CPUs from NVML-style affinity words (64 CPUs per word, lowest first).
pub fn from_mask_words(words: &[u64]) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (w, word) in words.iter().enumerate() {
        for bit in 0..64 {
            if word & (1u64 << bit) != 0 {
                cpus.push(w as u32 * 64 + bit);
            }
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_ranges() {
        let cpus = parse("0-23,48-71").unwrap();
        assert_eq!(cpus.len(), 48);
        assert_eq!(format(&cpus), "0-23,48-71");
        assert_eq!(format(&[5, 0, 1, 2]), "0-2,5");
    }

    #[test]
    fn overlapping_and_repeated_ranges_merge() {
        assert_eq!(parse("4-6,0-2,1-5,5"), Some((0..=6).collect()));
        let huge = vec!["0-65535"; 10_000].join(",");
        let t = std::time::Instant::now();
        assert_eq!(parse(&huge).map(|c| c.len()), Some(65536));
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(parse("65536"), None);
        assert_eq!(parse("0-4294967295"), None);
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse("N/A"), None);
        assert_eq!(parse("5-3"), None);
    }

    #[test]
    fn mask_words_map_to_cpus() {
        assert_eq!(from_mask_words(&[0b101, 1]), vec![0, 2, 64]);
        assert_eq!(from_mask_words(&[u64::MAX]).len(), 64);
    }
}

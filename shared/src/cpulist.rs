//! Linux CPU list syntax ("0-23,48-71"), as in /sys, cpusets and nvidia-smi.

/// Parses a CPU list; `None` when it is not one.
pub fn parse(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Vec::new());
    }
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.trim().split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                if hi < lo || hi - lo > 1 << 16 {
                    return None;
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
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

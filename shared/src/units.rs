//! Byte sizes as people and Kubernetes write them: 16Gi, 1G, 512Mi, 1073741824.

/// Parses a size; binary (Ki/Mi/Gi/Ti) and decimal (K/M/G/T, with or without B)
/// units, fractions allowed (the parse-size crate, exact to the byte).
pub fn parse_size(text: &str) -> Option<u64> {
    parse_size::parse_size(text.trim()).ok()
}

/// Formats bytes with binary units: 67108864 -> "64 MiB".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_and_decimal_units() {
        assert_eq!(parse_size("16Gi"), Some(16 << 30));
        assert_eq!(parse_size("1G"), Some(1_000_000_000));
        assert_eq!(parse_size("512Mi"), Some(512 << 20));
        assert_eq!(parse_size("1024"), Some(1024));
        assert_eq!(parse_size("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("5Xi"), None);
        assert_eq!(parse_size("-1Gi"), None);
        assert_eq!(parse_size("99999999999Ei"), None);
    }

    #[test]
    fn formats_binary_units() {
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
    }
}

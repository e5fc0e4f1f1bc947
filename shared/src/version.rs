//! Dotted versions (NCCL 2.28.9, aws-ofi-nccl 1.16.2) for "needs at least" rules.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl Version {
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version(major, minor, patch)
    }

    /// Parses "2.28.9", "2.28.9-1", "v1.7.0", "(2, 28, 9)".
    pub fn parse(text: &str) -> Option<Self> {
        let nums: Vec<u32> = text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .take(3)
            .map(|s| s.parse().ok())
            .collect::<Option<_>>()?;
        match nums.as_slice() {
            [a, b, c] => Some(Version(*a, *b, *c)),
            [a, b] => Some(Version(*a, *b, 0)),
            _ => None,
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_seen() {
        assert_eq!(Version::parse("2.28.9"), Some(Version(2, 28, 9)));
        assert_eq!(Version::parse("(2, 28, 9)"), Some(Version(2, 28, 9)));
        assert_eq!(Version::parse("v1.7"), Some(Version(1, 7, 0)));
        assert_eq!(Version::parse("none"), None);
        assert!(Version(2, 26, 5) > Version(2, 26, 4));
    }
}

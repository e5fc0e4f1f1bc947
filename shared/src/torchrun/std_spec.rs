//! `--redirects` / `--tee` values: 0 none, 1 stdout, 2 stderr, 3 both; or a per
//! local rank map `0:1,1:2`.

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Std {
    pub stdout: bool,
    pub stderr: bool,
}

impl Std {
    fn from_code(code: u8) -> Option<Std> {
        (code <= 3).then_some(Std {
            stdout: code & 1 != 0,
            stderr: code & 2 != 0,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdSpec {
    All(Std),
    PerRank(Vec<(u32, Std)>),
}

impl Default for StdSpec {
    fn default() -> Self {
        StdSpec::All(Std::default())
    }
}

/// A `--redirects`/`--tee` value that is neither a code nor a rank map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not 0, 1, 2, 3 or a map like 0:1,1:3")]
pub struct BadStdSpec(pub String);

impl StdSpec {
    pub fn parse(text: &str) -> Result<StdSpec, BadStdSpec> {
        let bad = || BadStdSpec(text.to_string());
        let t = text.trim();
        if !t.contains(':') {
            return Std::from_code(t.parse().map_err(|_| bad())?)
                .map(StdSpec::All)
                .ok_or_else(bad);
        }
        t.split(',')
            .map(|pair| {
                let (r, c) = pair.split_once(':').ok_or_else(bad)?;
                Ok((
                    r.trim().parse().map_err(|_| bad())?,
                    Std::from_code(c.trim().parse().map_err(|_| bad())?).ok_or_else(bad)?,
                ))
            })
            .collect::<Result<_, _>>()
            .map(StdSpec::PerRank)
    }

    pub fn for_rank(&self, local_rank: u32) -> Std {
        match self {
            StdSpec::All(s) => *s,
            StdSpec::PerRank(m) => m
                .iter()
                .find(|(r, _)| *r == local_rank)
                .map(|(_, s)| *s)
                .unwrap_or_default(),
        }
    }

    pub fn any(&self) -> bool {
        match self {
            StdSpec::All(s) => s.stdout || s.stderr,
            StdSpec::PerRank(m) => m.iter().any(|(_, s)| s.stdout || s.stderr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_maps() {
        assert_eq!(
            StdSpec::parse("3").unwrap().for_rank(5),
            Std {
                stdout: true,
                stderr: true
            }
        );
        let m = StdSpec::parse("0:1,1:2").unwrap();
        assert!(m.for_rank(0).stdout && !m.for_rank(0).stderr);
        assert!(m.for_rank(1).stderr);
        assert_eq!(m.for_rank(2), Std::default());
        assert!(StdSpec::parse("4").is_err());
        assert!(StdSpec::parse("x").is_err());
    }
}

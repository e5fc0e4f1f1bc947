//! torchrun's `--duplicate-stdout-filters` and `--duplicate-stderr-filters`: the lines
//! of the tee'd streams that contain any of the strings are also written, with their
//! console prefix, to `attempt_N/filtered_stdout.log` (`filtered_stderr.log`), one
//! file for all the node's ranks (torch 2.11 `elastic/multiprocessing/api.py`).

/// The strings of each stream (empty: no file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineFilters {
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

impl LineFilters {
    pub fn of(&self, stderr: bool) -> &[String] {
        if stderr {
            &self.stderr
        } else {
            &self.stdout
        }
    }
}

/// torchrun's comma-separated list: `,,` stands for a comma. An empty value is one
/// empty string, which every line contains, as in torchrun.
pub fn needles(v: &str) -> Vec<String> {
    const PLACEHOLDER: &str = "\u{0}";
    v.replace(",,", PLACEHOLDER)
        .split(',')
        .map(|s| s.replace(PLACEHOLDER, ","))
        .collect()
}

/// Whether the line (read as text, bad bytes replaced) contains any of `needles`.
pub fn matches(needles: &[String], line: &[u8]) -> bool {
    let text = String::from_utf8_lossy(line);
    needles.iter().any(|n| text.contains(n.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_split_on_single_commas() {
        assert_eq!(needles("apple,orange"), ["apple", "orange"]);
        assert_eq!(needles("loss,,acc,step"), ["loss,acc", "step"]);
        assert_eq!(needles(""), [""]);
    }

    #[test]
    fn a_line_matches_any_needle() {
        let n = needles("loss,step 1");
        assert!(matches(&n, b"epoch 0 loss 0.5\n"));
        assert!(matches(&n, b"step 12\n"));
        assert!(!matches(&n, b"accuracy\n"));
        assert!(matches(&needles(""), b"anything\n"));
        assert!(matches(&n, b"\xff loss"), "bad bytes do not hide the rest");
    }
}

//! A rank's last Python exception, read from the tail of its stderr: without torch's
//! `@record` the failure summary says only "To enable traceback see ...", yet the
//! interpreter printed the traceback on the way out.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonError {
    /// The exception's first line: `ValueError: bad batch shape (3, 224)`.
    pub exception: String,
    /// The innermost frame of the user's code (not the standard library or an
    /// installed package): (file, line, function).
    pub frame: Option<(String, u32, String)>,
    /// NCCL's own explanation, where the exception is NCCL's (the lines after the
    /// first: its class and `Last error:`).
    #[serde(default)]
    pub nccl: Option<super::nccl_error::NcclError>,
}

impl PythonError {
    /// `ValueError: bad batch shape (3, 224) (train.py:4)`.
    pub fn line(&self) -> String {
        self.with_place(&self.exception)
    }

    /// `torch.distributed.DistBackendError (train.py:4)`: the exception's type alone,
    /// where its message is told another way.
    pub fn kind_and_place(&self) -> String {
        let kind = self.exception.split(':').next().unwrap_or(&self.exception);
        self.with_place(kind.trim())
    }

    fn with_place(&self, text: &str) -> String {
        match &self.frame {
            Some((file, line, _)) => {
                let name = file.rsplit('/').next().unwrap_or(file);
                format!("{text} ({name}:{line})")
            }
            None => text.to_string(),
        }
    }
}

/// A line without the prefixes put before a rank's lines: torch's `[rank3]: ` and
/// torchrun's `[default0]:`.
pub(crate) fn unprefixed(line: &str) -> &str {
    let mut l = line.trim_end_matches('\r');
    while let Some(rest) = l.strip_prefix('[') {
        match rest.find("]:") {
            Some(i) if !rest[..i].contains(' ') => {
                l = rest[i + 2..].strip_prefix(' ').unwrap_or(&rest[i + 2..])
            }
            _ => break,
        }
    }
    l
}

/// `  File "/app/train.py", line 4, in step`.
fn frame(line: &str) -> Option<(String, u32, String)> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once("\", line ")?;
    let (num, func) = rest.split_once(", in ")?;
    Some((
        file.to_string(),
        num.trim().parse().ok()?,
        func.trim().to_string(),
    ))
}

/// Code of the standard library or of an installed package, not the user's.
pub(crate) fn library(file: &str) -> bool {
    file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.starts_with('<')
        || file
            .split('/')
            .any(|c| c.starts_with("python3.") || c.starts_with("python2."))
}

/// The last complete traceback in `text`: its exception and innermost user frame.
pub fn last_exception(text: &str) -> Option<PythonError> {
    let lines: Vec<&str> = text.lines().map(unprefixed).collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))?;
    let mut frames = Vec::new();
    for (i, l) in lines.iter().enumerate().skip(start + 1) {
        if let Some(f) = frame(l) {
            frames.push(f);
            continue;
        }
        if l.starts_with(char::is_whitespace) || l.is_empty() {
            continue; // source lines, carets
        }
        let user = frames.iter().rev().find(|(file, ..)| !library(file));
        return Some(PythonError {
            exception: l.trim().to_string(),
            frame: user.or(frames.last()).cloned(),
            nccl: super::nccl_error::parse(&lines[i..]),
        });
    }
    None
}

/// Whether `text` ends with a complete traceback (nothing after its exception line
/// but blank lines): the interpreter is on its way out after an uncaught exception.
pub fn ends_in_exception(text: &str) -> bool {
    let lines: Vec<&str> = text.lines().map(unprefixed).collect();
    let Some(last) = lines.iter().rposition(|l| !l.trim().is_empty()) else {
        return false;
    };
    let Some(start) = lines[..last]
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))
    else {
        return false;
    };
    // Every line between is a frame or indented source; the last is the exception.
    !lines[last].starts_with(char::is_whitespace)
        && lines[start + 1..last]
            .iter()
            .all(|l| l.is_empty() || l.starts_with(char::is_whitespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "step 16 ok
[rank2]: Traceback (most recent call last):
[rank2]:   File \"/app/train.py\", line 80, in <module>
[rank2]:     main()
[rank2]:   File \"/app/train.py\", line 4, in step
[rank2]:     check(batch)
[rank2]:     ^^^^^^^^^^^^
[rank2]:   File \"/usr/lib/python3.12/site-packages/lib/check.py\", line 9, in check
[rank2]:     raise ValueError(f\"bad batch shape {shape} at step {step}\")
[rank2]: ValueError: bad batch shape (3, 224) at step 17
";

    #[test]
    fn the_exception_and_the_innermost_user_frame() {
        let e = last_exception(TRACE).expect("a traceback");
        assert_eq!(
            e.exception,
            "ValueError: bad batch shape (3, 224) at step 17"
        );
        assert_eq!(e.frame, Some(("/app/train.py".into(), 4, "step".into())));
        assert_eq!(
            e.line(),
            "ValueError: bad batch shape (3, 224) at step 17 (train.py:4)"
        );
    }

    #[test]
    fn the_last_of_chained_tracebacks_and_torchrun_prefixes() {
        let text = "[default0]:Traceback (most recent call last):
[default0]:  File \"a.py\", line 1, in <module>
[default0]:KeyError: 'x'
[default0]:
[default0]:During handling of the above exception, another exception occurred:
[default0]:
[default0]:Traceback (most recent call last):
[default0]:  File \"a.py\", line 3, in <module>
[default0]:RuntimeError: wrapped
";
        let e = last_exception(text).unwrap();
        assert_eq!(e.line(), "RuntimeError: wrapped (a.py:3)");
    }

    #[test]
    fn a_rank_on_its_way_out_ends_in_its_exception() {
        assert!(ends_in_exception(TRACE));
        assert!(ends_in_exception(
            "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n    import torch\nModuleNotFoundError: No module named 'torch'\n\n"
        ));
        // A logged traceback the rank went on after, a cut one, none.
        assert!(!ends_in_exception(&format!("{TRACE}step 18 ok\n")));
        assert!(!ends_in_exception(
            "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"
        ));
        assert!(!ends_in_exception("all fine\n"));
        assert!(!ends_in_exception(""));
    }

    /// NCCL's reason follows the exception's first line: kept with it.
    #[test]
    fn an_nccl_error_keeps_ncclss_own_reason() {
        let text = "[rank1]: Traceback (most recent call last):
[rank1]:   File \"/app/train.py\", line 12, in main
[rank1]:     dist.all_reduce(t)
[rank1]:   File \"/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py\", line 3068, in all_reduce
[rank1]:     work = group.allreduce([tensor], opts)
[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[rank1]: Last error:
[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000
";
        let e = last_exception(text).expect("a traceback");
        assert_eq!(
            e.kind_and_place(),
            "torch.distributed.DistBackendError (train.py:12)"
        );
        let n = e.nccl.expect("NCCL's error");
        assert_eq!(
            n.last_error.as_deref(),
            Some("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000")
        );
        assert_eq!(last_exception(TRACE).expect("a traceback").nccl, None);
    }

    #[test]
    fn no_traceback_or_a_cut_one_is_none() {
        assert_eq!(last_exception("all fine\n"), None);
        assert_eq!(
            last_exception("Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n"),
            None
        );
    }
}

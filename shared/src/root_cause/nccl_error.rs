//! NCCL's own explanation of an error, as PyTorch raises it: the exception's first
//! line says only the result class (`NCCL error in: .../NCCLUtils.cpp:93, invalid
//! usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9`); the lines
//! after it name the class (`ncclInvalidUsage: ...`) and, after `Last error:`, what
//! NCCL itself said went wrong (its last WARN). That last line is what the user needs.

use serde::{Deserialize, Serialize};

/// NCCL's result classes (`ncclResult_t`), as PyTorch names them on the line after
/// the exception.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NcclResult {
    UnhandledCudaError,
    SystemError,
    InternalError,
    InvalidArgument,
    InvalidUsage,
    RemoteError,
    InProgress,
}

/// Each class: PyTorch's name for it, NCCL's words (`ncclGetErrorString`), what it
/// means and what to do.
struct ClassInfo {
    result: NcclResult,
    name: &'static str,
    words: &'static str,
    meaning: &'static str,
    fix: &'static str,
}

const CLASSES: [ClassInfo; 7] = [
    ClassInfo {
        result: NcclResult::UnhandledCudaError,
        name: "ncclUnhandledCudaError",
        words: "unhandled cuda error",
        meaning: "a CUDA call NCCL made failed (the GPU faulted, ran out of memory, or an earlier kernel of the rank failed)",
        fix: "run the rank with CUDA_LAUNCH_BLOCKING=1 to find the kernel that failed first, and look for an Xid in the node's log (nvidia-smi -q, dmesg)",
    },
    ClassInfo {
        result: NcclResult::SystemError,
        name: "ncclSystemError",
        words: "unhandled system error",
        meaning: "a system call or library NCCL uses failed (a socket, shared memory, memory registration, the InfiniBand/EFA library)",
        fix: "run with NCCL_DEBUG=WARN to see the failing call; check /dev/shm's size, the memlock limit (ulimit -l) and that the pods of one host share what NCCL expects (`toporun preflight`)",
    },
    ClassInfo {
        result: NcclResult::InternalError,
        name: "ncclInternalError",
        words: "internal error",
        meaning: "a check inside NCCL failed",
        fix: "run with NCCL_DEBUG=INFO and report NCCL's last lines with its version; an NCCL_* variable set by hand (NCCL_ALGO, NCCL_PROTO, NCCL_P2P_LEVEL) is the usual suspect: unset it and retry",
    },
    ClassInfo {
        result: NcclResult::InvalidArgument,
        name: "ncclInvalidArgument",
        words: "invalid argument",
        meaning: "a collective was called with an argument NCCL refuses (a tensor on another device, an unsupported datatype, a count that does not match)",
        fix: "check the tensors given to the collective: on this rank's own GPU (torch.cuda.current_device()), contiguous, the same dtype and size on every rank",
    },
    ClassInfo {
        result: NcclResult::InvalidUsage,
        name: "ncclInvalidUsage",
        words: "invalid usage",
        meaning: "NCCL was used in a way it does not allow (two ranks on one GPU, a communicator used after an error or from two threads)",
        fix: "give each rank its own GPU (torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before init_process_group) and follow NCCL's own reason above",
    },
    ClassInfo {
        result: NcclResult::RemoteError,
        name: "ncclRemoteError",
        words: "remote process exited or there was a network error",
        meaning: "a peer rank exited or the network to it failed",
        fix: "look at the rank that failed first: its own cause, not this one's, is the job's",
    },
    ClassInfo {
        result: NcclResult::InProgress,
        name: "ncclInProgress",
        words: "NCCL operation in progress",
        meaning: "a non-blocking NCCL call was still in progress",
        fix: "wait for the communicator to be ready (ncclCommGetAsyncError) before using it",
    },
];

fn info(r: NcclResult) -> &'static ClassInfo {
    CLASSES
        .iter()
        .find(|c| c.result == r)
        .expect("every class is in CLASSES")
}

/// NCCL's error as a rank raised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclError {
    pub result: NcclResult,
    /// What NCCL said went wrong (`Last error:`), bounded and printable; None where
    /// NCCL said nothing (`Unknown NCCL Error`, or an empty line).
    pub last_error: Option<String>,
    /// `2.28.9`, from the exception's line.
    pub version: Option<String>,
}

/// The most of NCCL's last error kept: its WARN lines are one sentence.
const LAST_ERROR_CHARS: usize = 400;
const LAST_ERROR_LINES: usize = 4;

/// NCCL's error in the lines of a traceback's exception, `lines[0]` being the
/// exception's first line (rank prefixes already removed).
pub fn parse(lines: &[&str]) -> Option<NcclError> {
    let first = lines.first()?;
    let class_line = |c: &&ClassInfo| {
        lines
            .iter()
            .take(LAST_ERROR_LINES)
            .any(|l| l.starts_with(&format!("{}:", c.name)))
    };
    let named = CLASSES.iter().find(class_line);
    // NCCL's own words after the file (`, internal error - please report...`), where
    // torch put the failure's reason in place of the class line.
    let worded = || {
        let said = |c: &&ClassInfo| {
            first.split(", ").any(|part| {
                part.strip_prefix(c.words)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', ',', '-']))
            })
        };
        first
            .contains("NCCL error")
            .then(|| CLASSES.iter().find(said))
            .flatten()
    };
    let class = named.or_else(worded)?;
    Some(NcclError {
        result: class.result,
        last_error: last_error(lines),
        version: first
            .split("NCCL version ")
            .nth(1)
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_string),
    })
}

/// The lines after `Last error:`, up to a blank line or the next log record.
fn last_error(lines: &[&str]) -> Option<String> {
    let at = lines.iter().position(|l| l.starts_with("Last error:"))?;
    let same_line = lines[at]["Last error:".len()..].trim();
    let mut said: Vec<&str> = Vec::new();
    if !same_line.is_empty() {
        said.push(same_line);
    }
    // The next log record: glog's `[W1125 12:00:00 ...]` (NCCL's own reasons may start
    // with a bracket too: `[Service thread] Error encountered ...`).
    let glog = |l: &str| {
        let mut c = l.chars();
        c.next() == Some('[')
            && c.next().is_some_and(|k| "IWEF".contains(k))
            && c.next().is_some_and(|d| d.is_ascii_digit())
    };
    let ends = |l: &str| {
        l.trim().is_empty()
            || glog(l)
            || l.starts_with("Traceback")
            || l.starts_with("Exception raised from")
    };
    if said.is_empty() {
        said.extend(
            lines[at + 1..]
                .iter()
                .take_while(|l| !ends(l))
                .take(LAST_ERROR_LINES)
                .map(|l| l.trim()),
        );
    }
    let joined: String = said.join(" ").chars().take(LAST_ERROR_CHARS).collect();
    let text = crate::untrusted::printable(&joined);
    (!text.is_empty() && text != "Unknown NCCL Error").then_some(text)
}

impl NcclError {
    /// `NCCL invalid usage (NCCL 2.28.9): "Duplicate GPU detected : ..."`.
    pub fn text(&self) -> String {
        self.said(Some(info(self.result).meaning))
    }

    /// As `text`, without what the class usually means: where NCCL's reason says
    /// otherwise (a size mismatch is "invalid usage" too).
    pub fn reason_text(&self) -> String {
        self.said(None)
    }

    fn said(&self, meaning: Option<&str>) -> String {
        let c = info(self.result);
        let version = self.version.as_ref().map(|v| format!("NCCL {v}"));
        let inside: Vec<&str> = meaning.into_iter().chain(version.as_deref()).collect();
        let said = match &self.last_error {
            Some(s) => format!("; NCCL's reason: \"{s}\""),
            None => "; NCCL gave no reason (NCCL_DEBUG=WARN prints it)".into(),
        };
        match inside.is_empty() {
            true => format!("NCCL {}{said}", c.words),
            false => format!("NCCL {} ({}){said}", c.words, inside.join(", ")),
        }
    }

    /// What to do: NCCL's reason read where it names ranks and a GPU, else the class's
    /// advice.
    pub fn fix(&self) -> String {
        if let Some((a, b, device)) = self.last_error.as_deref().and_then(duplicate_gpu) {
            return format!(
                "ranks {a} and {b} run on one GPU (PCI bus {device}): each rank must use its own, torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before init_process_group (or init_process_group(device_id=...)); with toporun, do not set CUDA_VISIBLE_DEVICES per rank by hand"
            );
        }
        info(self.result).fix.to_string()
    }
}

/// NCCL's `Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1b000`.
fn duplicate_gpu(said: &str) -> Option<(u32, u32, String)> {
    let rest = said.split("Duplicate GPU detected").nth(1)?;
    let nums: Vec<&str> = rest
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let rank_after = |i: usize| nums.get(i + 1)?.parse::<u32>().ok();
    let mut ranks = nums
        .iter()
        .enumerate()
        .filter(|(_, w)| **w == "rank")
        .filter_map(|(i, _)| rank_after(i));
    let (a, b) = (ranks.next()?, ranks.next()?);
    let device = rest.split("device").nth(1)?.trim().to_string();
    Some((a, b, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    /// torch 2.11, NCCL 2.28.9: two ranks on one GPU.
    const INVALID_USAGE: &str = "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
Last error:
Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000";

    #[test]
    fn invalid_usage_keeps_ncclss_reason_and_names_the_ranks_and_gpu() {
        let e = parse(&lines(INVALID_USAGE)).expect("an NCCL error");
        assert_eq!(e.result, NcclResult::InvalidUsage);
        assert_eq!(e.version.as_deref(), Some("2.28.9"));
        assert_eq!(
            e.last_error.as_deref(),
            Some("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000")
        );
        assert!(e.text().starts_with("NCCL invalid usage ("), "{}", e.text());
        assert!(e
            .fix()
            .starts_with("ranks 1 and 0 run on one GPU (PCI bus 18000)"));
    }

    /// The system error of tests/fixtures/device/nccl-evidence-run1: `Last error:`
    /// and nothing after it.
    #[test]
    fn an_empty_last_error_says_nccl_gave_none_and_the_class_fix() {
        let text = "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9
ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. 
Last error:
";
        let e = parse(&lines(text)).expect("an NCCL error");
        assert_eq!(e.result, NcclResult::SystemError);
        assert_eq!(e.last_error, None);
        assert!(e.text().contains("NCCL gave no reason"), "{}", e.text());
        assert!(e.fix().contains("/dev/shm"), "{}", e.fix());
    }

    #[test]
    fn the_reason_stops_at_the_next_log_record_and_is_bounded() {
        let long = "x".repeat(2000);
        let text = format!("torch.distributed.DistBackendError: NCCL error in: a.cpp:1, internal error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9\nncclInternalError: Internal check failed.\nLast error:\nbad \u{1b}[31mthing {long}\n[W1125 12:00:00 ProcessGroupNCCL.cpp:1] not this");
        let e = parse(&lines(&text)).expect("an NCCL error");
        let said = e.last_error.expect("a reason");
        assert!(said.starts_with("bad "), "{said}");
        assert!(
            !said.contains('\u{1b}') && !said.contains("not this"),
            "{said}"
        );
        assert!(
            said.chars().count() <= LAST_ERROR_CHARS + 3,
            "{}",
            said.len()
        );
    }

    /// A reason in brackets is NCCL's own (its service threads name themselves so);
    /// the class is found from NCCL's words where torch put no class line.
    #[test]
    fn a_bracketed_reason_and_a_class_from_its_words() {
        let text = "torch.distributed.DistBackendError: NCCL error in: a.cpp:1, remote process exited or there was a network error, NCCL version 2.28.9\nLast error:\n[Service thread] Error encountered progressing operation=Connect, res=3, closing connection\n[E1125 12:00:00 ProcessGroupNCCL.cpp:1] not this";
        let e = parse(&lines(text)).expect("an NCCL error");
        assert_eq!(e.result, NcclResult::RemoteError);
        assert_eq!(
            e.last_error.as_deref(),
            Some("[Service thread] Error encountered progressing operation=Connect, res=3, closing connection")
        );
        let internal = "torch.distributed.DistBackendError: NCCL error in: a.cpp:1, internal error - please report this issue to the NCCL developers, NCCL version 2.28.9";
        assert_eq!(
            parse(&lines(internal)).map(|e| e.result),
            Some(NcclResult::InternalError)
        );
    }

    #[test]
    fn other_exceptions_are_no_nccl_error() {
        assert_eq!(parse(&lines("ValueError: bad batch shape")), None);
        assert_eq!(parse(&lines("RuntimeError: NCCL error somewhere")), None);
    }
}

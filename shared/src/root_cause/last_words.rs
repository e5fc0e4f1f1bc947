//! What a rank said last before it exited without a traceback: `sys.exit("config
//! error: ...")`, argparse's usage error, a logger's fatal line, a C library that
//! prints and exits. The message is the cause; toporun quotes it, bounded and
//! printable, leaving out the lines that are not the rank's own words (PyTorch's and
//! NCCL's log lines, torchrun's banners).

/// Lines quoted at most, each made printable and cut as any untrusted text
/// (`untrusted::printable`: control characters out, 200 characters).
const LINES: usize = 2;

/// A line written by a library's logger, not the program: c10's glog-style lines
/// (`W1128 16:04:23.587 ...`, torch prefixes them with `[rank1]:`), NCCL's own, and
/// the OMP banner torchrun prints.
fn not_its_words(line: &str) -> bool {
    let l = without_rank_prefix(line);
    let glog = l.len() > 5
        && matches!(l.as_bytes()[0], b'I' | b'W' | b'E' | b'F')
        && l.as_bytes()[1..5].iter().all(u8::is_ascii_digit);
    let bracketed_glog = l.starts_with('[')
        && l.len() > 6
        && matches!(l.as_bytes()[1], b'I' | b'W' | b'E' | b'F')
        && l.as_bytes()[2..6].iter().all(u8::is_ascii_digit);
    glog || bracketed_glog
        || python_warning(l)
        || l.contains(" NCCL INFO ")
        || l.contains(" NCCL WARN ")
        || l.starts_with("*****")
        || l.starts_with("Setting OMP_NUM_THREADS")
}

/// The line without torch's `[rank1]:` prefix.
fn without_rank_prefix(line: &str) -> &str {
    line.strip_prefix('[')
        .and_then(|r| r.split_once("]:"))
        .map_or(line, |(_, rest)| rest)
        .trim_start()
}

/// A Python warning's first line, `path.py:21: DeprecationWarning: ...` (Lightning's
/// leave out the category): a library's notice, not why the rank exited.
fn python_warning(line: &str) -> bool {
    let Some((path, rest)) = line.split_once(".py:") else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    !path.contains(' ') && digits > 0 && rest[digits..].starts_with(": ")
}

/// The rank's last words in `output` (its stderr's tail, escapes removed): its last
/// lines of its own, oldest first, printable and bounded; None where it said nothing.
pub fn last_words(output: &str) -> Option<String> {
    let own: Vec<&str> = own_lines(output).collect();
    let lines: Vec<String> = own[own.len().saturating_sub(LINES)..]
        .iter()
        .map(|l| crate::untrusted::printable(l))
        .collect();
    (!lines.is_empty()).then(|| lines.join(" / "))
}

/// The lines of `output` that are the rank's own, trimmed: not a library's log line,
/// nor a Python warning with the indented source line the warnings module prints
/// under it (`  return Variable._execution_engine.run_backward(...`).
fn own_lines(output: &str) -> impl Iterator<Item = &str> {
    let mut after_warning = false;
    output.lines().filter_map(move |raw| {
        let its_source = after_warning && raw.starts_with(char::is_whitespace);
        let l = raw.trim();
        after_warning = python_warning(without_rank_prefix(l));
        (!its_source && !l.is_empty() && !not_its_words(l)).then_some(l)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lightning's rank 1 on two nodes (tests/fixtures/device/cross-node-trainers-h200x1,
    /// run 2, `lightning-exit`): autograd's warning and the source line under it, then
    /// `sys.exit`'s message. The message alone is quoted.
    #[test]
    fn a_warning_s_source_line_is_not_the_rank_s_words() {
        let out = "/opt/torch/.venv/lib/python3.12/site-packages/torch/autograd/graph.py:869: UserWarning: The AccumulateGrad node's stream does not match the stream of the node that produced the incoming gradient.\n  return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass\nrank 1: giving up at step 30: the shard's checksum does not match\n";
        assert_eq!(
            last_words(out).as_deref(),
            Some("rank 1: giving up at step 30: the shard's checksum does not match")
        );
        // An indented line of the rank's own after a line of its own stays.
        let own = "step 30 failed:\n  the shard's checksum does not match\n";
        assert_eq!(
            last_words(own).as_deref(),
            Some("step 30 failed: / the shard's checksum does not match")
        );
    }

    /// A line's bound: untrusted text's.
    const LINE_CHARS: usize = crate::untrusted::MAX_SHOWN;

    /// As ranks print them: sys.exit's message after torch's and NCCL's lines, an
    /// argparse error, a C library's message; nothing to quote from loggers alone.
    #[test]
    fn the_rank_s_own_last_lines_are_quoted() {
        let exit = "[rank1]:[W1128 16:04:23.587 ProcessGroupNCCL.cpp:1536] Warning: destroy_process_group() was not called\nconfig error: lr must be positive\n";
        assert_eq!(
            last_words(exit).as_deref(),
            Some("config error: lr must be positive")
        );
        let argparse = "usage: train.py [-h] --lr LR\ntrain.py: error: argument --lr: invalid float value: 'fast'\n";
        assert_eq!(
            last_words(argparse).as_deref(),
            Some("usage: train.py [-h] --lr LR / train.py: error: argument --lr: invalid float value: 'fast'")
        );
        // Lightning's deprecation notice just before sys.exit's message (2x H200).
        let lightning = "/venv/lib/python3.12/site-packages/pytorch_lightning/utilities/_pytree.py:21: `isinstance(treespec, LeafSpec)` is deprecated\nrank 1: giving up at step 30: the shard's checksum does not match\n";
        assert_eq!(
            last_words(lightning).as_deref(),
            Some("rank 1: giving up at step 30: the shard's checksum does not match")
        );
        let nccl = "host:123:456 [0] NCCL INFO comm 0x1 rank 0 nranks 2\nW1128 16:04:23.587000 12 torch/distributed/x.py:1] gone\n";
        assert_eq!(last_words(nccl), None);
        let long = format!("{}\u{7}\n", "x".repeat(500));
        let said = last_words(&long).unwrap();
        assert_eq!(
            said.chars().count(),
            LINE_CHARS + 3,
            "cut, with its ellipsis"
        );
        assert!(!said.contains('\u{7}'));
    }
}

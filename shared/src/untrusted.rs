//! Text that came from outside (another node through the store, a facts file) made
//! safe to print: no escape sequence reaches the operator's terminal, no line break
//! forges a log line, and no value floods the console.

/// Longest untrusted text printed whole.
pub const MAX_SHOWN: usize = 200;

/// Control characters become `?`; beyond MAX_SHOWN characters the rest is cut.
pub fn printable(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(MAX_SHOWN)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if text.chars().nth(MAX_SHOWN).is_some() {
        out.push_str("...");
    }
    out
}

/// A host name or address as a node may describe itself: printable, not empty, at
/// most 253 bytes (DNS's limit), no whitespace.
pub fn valid_host(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 253
        && !text.chars().any(|c| c.is_control() || c.is_whitespace())
}

/// A shell identifier: what a variable name must be to be exported or sourced.
pub fn valid_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An environment variable another node asks this node's ranks to get: a shell
/// identifier for a name, no NUL in the value.
pub fn valid_env(name: &str, value: &str) -> bool {
    valid_name(name) && !value.contains('\0')
}

/// A rank's output without terminal escape sequences (colours, cursor moves): what
/// its parsers read. Python 3.13 colours a traceback written to a terminal, as a rank's
/// stderr is where toporun runs on one.
pub fn without_escapes(text: &str) -> String {
    strip_ansi_escapes::strip_str(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_codes_and_line_breaks_never_print() {
        assert_eq!(printable("\u{1b}[2J\u{1b}[31mEVIL\nx"), "?[2J?[31mEVIL?x");
        let long = "a".repeat(1000);
        assert_eq!(printable(&long).len(), MAX_SHOWN + 3);
    }

    #[test]
    fn hosts_and_variables() {
        assert!(valid_host("node-1.cluster.local"));
        assert!(!valid_host("\u{1b}[2Jevil"));
        assert!(!valid_host(""));
        assert!(valid_env("NCCL_HOSTID", "x"));
        assert!(!valid_env("LD_PRELOAD=", "x"));
        assert!(!valid_env("A B", "x"));
    }

    /// Python 3.13's coloured traceback reads as the plain one.
    #[test]
    fn colours_are_taken_out_before_parsing() {
        let coloured = "Traceback (most recent call last):\n  File \x1b[35m\"/app/t.py\"\x1b[0m, line \x1b[35m10\x1b[0m, in \x1b[35mcheck\x1b[0m\n\x1b[1;35mValueError\x1b[0m: \x1b[35mbad batch\x1b[0m\n";
        let plain = without_escapes(coloured);
        assert!(!plain.contains('\x1b'), "{plain:?}");
        let e = crate::root_cause::python_error::last_exception(&plain).expect("a traceback");
        assert_eq!(e.line(), "ValueError: bad batch (t.py:10)");
    }
}

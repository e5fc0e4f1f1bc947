//! Yes/no values, with one rule per source, each the rule of the program that reads
//! the same value:
//! - [`torch_bool`]: torch's `RendezvousParameters.get_as_bool` (`--rdzv-conf is_host`),
//!   also used for toporun's own `TOPORUN_*` switches so that one spelling works
//!   everywhere a user types a yes/no for toporun;
//! - [`nccl_flag`]: NCCL's own reading of its integer switches (`NCCL_P2P_DISABLE`):
//!   the leading integer, non-zero is on; "true" is 0 to NCCL and off here too.

/// torch's rule: 1/true/t/yes/y or 0/false/f/no/n, any case; anything else is no
/// boolean (None).
pub fn torch_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "t" | "yes" | "y" => Some(true),
        "0" | "false" | "f" | "no" | "n" => Some(false),
        _ => None,
    }
}

/// NCCL's rule (strtoll of the value): the leading integer is non-zero.
pub fn nccl_flag(v: &str) -> bool {
    let t = v.trim_start();
    let digits: String = t
        .char_indices()
        .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && (*c == '-' || *c == '+')))
        .map(|(_, c)| c)
        .collect();
    digits.parse::<i64>().is_ok_and(|n| n != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_spellings() {
        for v in ["1", "true", "True", "T", "yes", "Y"] {
            assert_eq!(torch_bool(v), Some(true), "{v}");
        }
        for v in ["0", "false", "F", "no", "N"] {
            assert_eq!(torch_bool(v), Some(false), "{v}");
        }
        assert_eq!(torch_bool("2"), None);
        assert_eq!(torch_bool("on"), None);
    }

    #[test]
    fn nccl_reads_the_leading_integer() {
        assert!(nccl_flag("1"));
        assert!(nccl_flag("2abc"));
        assert!(!nccl_flag("0"));
        assert!(!nccl_flag("true"));
        assert!(!nccl_flag(""));
    }
}

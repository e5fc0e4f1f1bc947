//! toporun's own environment and command line as text. std's `vars()` and `args()`
//! panic at a name, value or argument that is not UTF-8. toporun reads the variables
//! that are text and names the others once at launch (it takes them for unset, and
//! may set its own value over theirs); the ranks get every other variable byte for
//! byte (`vfork_exec` takes the environment as it is). An argument that is not text
//! is refused by name: torchrun, in Python, would pass it on byte for byte.

use std::collections::BTreeMap;

/// The variables whose name and value are UTF-8: all toporun reads or decides on.
pub fn variables() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// The same, as a map.
pub fn variable_map() -> BTreeMap<String, String> {
    variables().collect()
}

/// The names (made printable) of the variables that are not text.
pub fn not_text() -> Vec<String> {
    std::env::vars_os()
        .filter(|(k, v)| k.to_str().is_none() || v.to_str().is_none())
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect()
}

/// The command line; an argument after argv[0] that is not UTF-8 is an error naming
/// it (argv[0], the name toporun was started as, is read as far as it is text).
pub fn arguments() -> Result<Vec<String>, String> {
    arguments_of(std::env::args_os())
}

fn arguments_of(args: impl Iterator<Item = std::ffi::OsString>) -> Result<Vec<String>, String> {
    args.enumerate()
        .map(|(i, a)| {
            if i == 0 {
                return Ok(a.to_string_lossy().into_owned());
            }
            a.into_string().map_err(|a| {
                format!(
                    "argument {i} ({}) is not valid UTF-8: toporun passes the command line on as text; rename the file or pass that value another way (a config file, an environment variable)",
                    a.to_string_lossy()
                )
            })
        })
        .collect()
}

/// The name toporun was started as (argv[0]), as text where it is not.
pub fn invoked_as() -> String {
    std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;

    #[test]
    fn an_argument_that_is_not_text_is_named_not_a_panic() {
        let ok = [OsString::from("toporun"), OsString::from("train.py")];
        assert_eq!(
            arguments_of(ok.into_iter()).unwrap(),
            ["toporun", "train.py"]
        );
        let bad = [
            OsString::from("toporun"),
            OsString::from_vec(b"data-\xff.bin".to_vec()),
        ];
        let e = arguments_of(bad.into_iter()).unwrap_err();
        assert!(
            e.starts_with("argument 1 (data-\u{fffd}.bin) is not valid UTF-8"),
            "{e}"
        );
        // Installed under a path that is not text: toporun still starts.
        let odd_home = [OsString::from_vec(b"/opt/\xff/toporun".to_vec())];
        assert_eq!(
            arguments_of(odd_home.into_iter()).unwrap(),
            ["/opt/\u{fffd}/toporun"]
        );
    }
}

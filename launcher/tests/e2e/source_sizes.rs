//! Sizes a newcomer can read: no source file over 600 lines before its tests, no
//! function outside tests over 120 lines, in any crate of the workspace.

use crate::support::code_before_tests;
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 120;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// What is over the limits in one file's text, as lines a reader can act on.
fn oversize(name: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let end = code_before_tests(text).lines().count();
    let mut found = Vec::new();
    if end > MAX_FILE_LINES {
        found.push(format!("{name}: {end} lines before its tests"));
    }
    for (i, l) in lines[..end].iter().enumerate() {
        let Some(at) = l.find("fn ") else { continue };
        let head = &l[..at];
        let indent = &l[..l.len() - l.trim_start().len()];
        let words = head.trim();
        let is_fn = words.split_whitespace().all(|w| {
            ["pub", "async", "const", "unsafe", "extern"].contains(&w) || w.starts_with("pub(")
        });
        if !is_fn || l.trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{indent}}}");
        let Some(len) = lines[i..end].iter().position(|x| *x == close) else {
            continue;
        };
        if len + 1 > MAX_FN_LINES {
            let f = l[at + 3..].split(['(', '<']).next().unwrap_or("");
            found.push(format!("{name}:{}: fn {f} is {} lines", i + 1, len + 1));
        }
    }
    found
}

#[test]
fn no_file_or_function_is_over_its_size() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["launcher", "agent", "shared"] {
        sources(&root.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 100, "{} sources found", files.len());
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let name = f.strip_prefix(&root).unwrap_or(f).display().to_string();
            oversize(&name, &std::fs::read_to_string(f).unwrap())
        })
        .collect();
    assert!(found.is_empty(), "split these:\n{}", found.join("\n"));
}

#[test]
fn the_size_check_sees_a_long_function_and_a_long_file() {
    let body = "    x();\n".repeat(MAX_FN_LINES);
    let long_fn = format!("pub(crate) async fn big(a: u8) {{\n{body}}}\n");
    assert_eq!(oversize("a.rs", &long_fn), ["a.rs:1: fn big is 122 lines"]);
    let fine = format!("fn small() {{\n{}}}\n", "    x();\n".repeat(10));
    assert!(oversize("b.rs", &fine).is_empty());
    let long_file = format!(
        "{}#[cfg(test)]\nmod tests {{\n{long_fn}}}\n",
        "// x\n".repeat(MAX_FILE_LINES + 1)
    );
    assert_eq!(
        oversize("c.rs", &long_file),
        ["c.rs: 601 lines before its tests"]
    );
    // A test-only item early in the file is no start of its tests: the code after it
    // counts (the rule stopped there before).
    let early = format!(
        "#[cfg(test)]\nuse x::Y;\n{}#[cfg(test)]\nmod tests {{}}\n",
        "// x\n".repeat(MAX_FILE_LINES)
    );
    assert_eq!(
        oversize("d.rs", &early),
        ["d.rs: 602 lines before its tests"]
    );
}

//! The docs stay true: every finding id in the code is in the catalogue, every
//! `TOPORUN_*` variable the code reads is in the README's table, every relative link
//! resolves, and every `toporun`/`torchrun` command line in a shell block parses with
//! toporun's own parser (as the manifests' command lines do).

use crate::support;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use support::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Non-test Rust code of the workspace's crates, file by file.
fn sources() -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = [
        "shared/src",
        "agent/src",
        "launcher/src",
        "nccl-profiler/src",
    ]
    .iter()
    .map(|d| repo().join(d))
    .collect();
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                let code = crate::support::code_before_tests(&text).to_string();
                out.push((p, code));
            }
        }
    }
    out
}

/// The contents of every string literal (no escapes needed for ids and names).
fn literals(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            let start = i + 1;
            let mut j = start;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push((i, code[start..j.min(code.len())].to_string()));
            i = j + 1;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn every_finding_id_is_in_the_catalogue() {
    let catalogue = std::fs::read_to_string(repo().join("docs/findings.md")).unwrap();
    // Every id is a variant of one type: the catalogue is checked against all of them.
    let ids = toporun_shared::finding::FindingId::ALL;
    assert!(ids.len() > 30, "{ids:?}");
    let missing: Vec<_> = ids
        .iter()
        .filter(|id| !catalogue.contains(&format!("| `{id}` |")))
        .collect();
    assert!(missing.is_empty(), "not in docs/findings.md: {missing:?}");
}

#[test]
fn every_toporun_variable_is_in_the_readme_table() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    // Every variable is read through one table; no other source names one.
    let mut strays = Vec::new();
    for (path, code) in sources() {
        for (_, lit) in literals(&code) {
            if lit.starts_with("TOPORUN_")
                && lit.len() > 8
                && lit.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !path.ends_with("toporun_vars.rs")
            {
                strays.push(format!("{lit} in {}", path.display()));
            }
        }
    }
    assert!(strays.is_empty(), "read outside toporun_vars: {strays:?}");
    let vars = toporun_shared::toporun_vars::ToporunVar::ALL;
    assert!(vars.len() > 20, "{vars:?}");
    let missing: Vec<_> = vars
        .iter()
        .map(|v| v.name())
        .filter(|v| !readme.contains(&format!("| `{v}` |")))
        .collect();
    assert!(missing.is_empty(), "not in the README's table: {missing:?}");
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md"]
        .iter()
        .map(|f| repo().join(f))
        .collect();
    for e in std::fs::read_dir(repo().join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            files.push(e.path());
        }
    }
    files
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for part in text.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or("");
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !file.parent().unwrap().join(path).exists() {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// The script paths a text cites (`scripts/dev/test.sh`, `launcher/tests/scripts/x.py`),
/// not those in a stack's output (`hang_rank.py:14`, a frame's file and line).
fn cited_scripts(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("scripts/") {
        let start = text[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "._/-".contains(c)))
            .map_or(0, |j| j + 1);
        let rest = &text[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "._/-".contains(c)))
            .unwrap_or(rest.len());
        let path = text[start..i + end].trim_end_matches(['.', '/']);
        let frame = rest[end..].starts_with(':')
            && rest[end + 1..].starts_with(|c: char| c.is_ascii_digit());
        if (path.ends_with(".sh") || path.ends_with(".py")) && !frame && !path.starts_with('/') {
            out.push(path.trim_start_matches("./").to_string());
        }
    }
    out
}

/// Every script the README, the docs and CONTRIBUTING cite is there (relative to the
/// repository's root).
#[test]
fn every_cited_script_exists() {
    let (mut missing, mut cited) = (Vec::new(), 0);
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for path in cited_scripts(&text) {
            cited += 1;
            if !repo().join(&path).exists() {
                missing.push(format!("{}: {path}", file.display()));
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    assert!(cited > 50, "{cited} script paths found in the docs");
    let found = cited_scripts(
        "run `scripts/dev/test.sh`, or (bash scripts/nope.sh); at main (scripts/hang_rank.py:14)",
    );
    assert_eq!(found, ["scripts/dev/test.sh", "scripts/nope.sh"]);
}

/// `toporun`/`torchrun` lines of the shell blocks (`cargo run --release --` counts as
/// toporun), as argument lists (prompt, trailing
/// comment and redirection removed); lines with placeholders are left out.
fn documented_commands(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_shell = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_shell = matches!(t, "```sh" | "```bash" | "```console");
            continue;
        }
        let t = t.strip_prefix("$ ").unwrap_or(t);
        // The README's "Try it" runs toporun from a clone.
        let cargo = t
            .strip_prefix("cargo run --release -- ")
            .map(|r| format!("toporun {r}"));
        let t = cargo.as_deref().unwrap_or(t);
        if !in_shell || !(t.starts_with("toporun ") || t.starts_with("torchrun ")) {
            continue;
        }
        let t = t.split(" #").next().unwrap_or(t);
        let t = t.split(" > ").next().unwrap_or(t);
        let t = t.split(" | ").next().unwrap_or(t);
        let words: Vec<String> = t.split_whitespace().map(String::from).collect();
        let placeholder = |w: &String| {
            w.contains('[')
                || w.contains("...")
                || w.contains('"')
                || w.contains('\'')
                || (w.len() > 1 && w.chars().all(|c| c.is_ascii_uppercase()))
        };
        if !words.iter().any(placeholder) {
            out.push(words);
        }
    }
    out
}

#[test]
fn every_documented_command_line_parses() {
    let mut checked = 0;
    let mut bad = Vec::new();
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for words in documented_commands(&text) {
            // A captured host instead of whatever the line names (or this machine).
            let mut args: Vec<String> = vec!["--facts".into(), host("h200x4")];
            let mut rest = words[1..].iter();
            while let Some(w) = rest.next() {
                if w == "--facts" {
                    rest.next();
                } else {
                    args.push(w.clone());
                }
            }
            let launch = words[0] == "torchrun"
                || !args.iter().any(|a| {
                    matches!(
                        a.as_str(),
                        "preflight" | "probe" | "topo" | "nccl-log" | "bench" | "launch"
                    )
                });
            if launch {
                args.splice(2..2, ["launch".to_string(), "--dry-run".to_string()]);
            } else if args.iter().any(|a| a == "launch") && !args.iter().any(|a| a == "--dry-run") {
                continue;
            }
            if args.iter().any(|a| a == "bench") {
                continue; // benchmarks run for seconds; their options are tested by their own tests
            }
            let (code, _, err) = run(toporun().args(&args));
            checked += 1;
            // The fixture host may fail a check (exit 1); a usage error never passes.
            if code == 2 || (launch && code != 0) {
                bad.push(format!("{}: {words:?}: exit {code}: {err}", file.display()));
            }
        }
    }
    assert!(checked >= 5, "only {checked} command lines found");
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn a_misspelled_flag_in_a_doc_is_found() {
    let cmds = documented_commands(
        "```sh\ntoporun preflight --expect-gpu-count 8   # wrong\ntoporun nccl-log FILE...\n```\n",
    );
    assert_eq!(cmds.len(), 1);
    let mut args = vec!["--facts".to_string(), host("h200x4")];
    args.extend(cmds[0][1..].iter().cloned());
    let (code, _, _) = run(toporun().args(&args));
    assert_eq!(code, 2);
}

/// The README's "Try it" block runs as written from the repository's root, with
/// `cargo run --release --` standing for this build's binary (a test must not start
/// a release build): preflight, the dry run, the virtualenv, a real 2-rank CPU run.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_readme_try_it_block_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split("\n## Try it\n")
        .nth(1)
        .and_then(|r| r.split("```sh\n").nth(1))
        .and_then(|b| b.split("\n```").next())
        .expect("a ```sh block under ## Try it");
    let bin = std::env::var("TOPORUN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_toporun").into());
    assert_eq!(
        block.matches("cargo run --release -- ").count(),
        3,
        "{block}"
    );
    let script = block.replace("cargo run --release --", &bin);
    let mut c = std::process::Command::new("bash");
    c.args(["-euo", "pipefail", "-c", &script])
        .current_dir(repo())
        .env_remove("PYTHON_EXEC");
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") || k.starts_with("NCCL_") || k == "CUDA_VISIBLE_DEVICES" {
            c.env_remove(k);
        }
    }
    let (code, out, err) = run(&mut c);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("\nfit: "), "preflight's verdict:\n{out}");
    assert!(out.contains("NCCL expected: "), "the dry run:\n{out}");
    assert!(
        out.contains("done: 20 steps on 2 rank(s), loss "),
        "the real run:\n{out}\n{err}"
    );
}

/// Every source file of the crates is named in ARCHITECTURE.md (its stem in a
/// code span: `shm`, `shm.rs`, `root_cause/{judge,disk}.rs`), so a newcomer finds it.
#[test]
fn every_source_file_is_named_in_the_architecture() {
    let arch = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let named: BTreeSet<&str> = arch
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .collect();
    let missing: Vec<String> = sources()
        .iter()
        .filter_map(|(path, _)| {
            let stem = path.file_stem()?.to_str()?;
            let entry = ["mod", "lib", "main"].contains(&stem);
            (!entry && !named.contains(stem)).then(|| path.display().to_string())
        })
        .collect();
    assert!(missing.is_empty(), "not in ARCHITECTURE.md: {missing:#?}");
}

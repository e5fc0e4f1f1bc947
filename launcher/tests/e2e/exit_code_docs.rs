//! The exit codes a user reads are the table's (shared/src/root_cause/exit_codes.rs):
//! the README's list of classes, the docs' two tables and podFailurePolicy block, and
//! every manifest's podFailurePolicy. A copy that drifts fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use toporun_shared::root_cause::exit_codes::{ExitClass, GATE, HANG, POLICY_EXTRA, TABLE};

fn read(f: &str) -> String {
    let at = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(f);
    std::fs::read_to_string(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display()))
}

fn codes_in(s: &str) -> BTreeSet<u8> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn actions<'a>(classes: impl Iterator<Item = &'a ExitClass>) -> BTreeMap<u8, String> {
    classes
        .map(|c| (c.code, format!("{:?}", c.action)))
        .collect()
}

/// `- action: X` then `onExitCodes: {.., values: [..]}`, as the manifests write them:
/// each code with its action.
fn policy(yaml: &str) -> BTreeMap<u8, String> {
    let (mut out, mut action) = (BTreeMap::new(), String::new());
    for l in yaml.lines() {
        let t = l.trim().trim_start_matches("- ");
        if let Some(a) = t.strip_prefix("action:") {
            action = a.split('#').next().unwrap_or_default().trim().to_string();
        } else if let Some(v) = t.strip_prefix("onExitCodes:") {
            let list = v
                .split("values: [")
                .nth(1)
                .and_then(|r| r.split(']').next());
            for n in list.expect("values: [...]").split(',') {
                let code: u8 = n.trim().parse().expect("a code");
                assert!(out.insert(code, action.clone()).is_none(), "{code} twice");
            }
        }
    }
    out
}

#[test]
fn the_readme_docs_and_manifests_say_the_exit_code_table() {
    let classes = actions(TABLE.iter());
    let policy_want = actions(TABLE.iter().chain(&POLICY_EXTRA));
    let readme = read("README.md");
    let list = readme
        .split("exits with the cause's class (")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect("the README's list of classes");
    assert_eq!(
        codes_in(list),
        classes.keys().copied().collect(),
        "README: {list}"
    );
    let doc = read("docs/failures-and-exit-codes.md");
    let (torchrun, classified) = doc
        .split_once("## `--exit-codes classified`")
        .expect("the classified section");
    for c in [GATE, HANG] {
        assert!(
            torchrun.contains(&format!("\n| {} |", c.code)),
            "{}",
            c.code
        );
    }
    let rows: BTreeMap<u8, String> = classified
        .split("| code | class | podFailurePolicy | why |")
        .nth(1)
        .expect("the classified table")
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (c[1].parse().expect("a code"), c[3].to_string())
        })
        .collect();
    assert_eq!(rows, classes, "the docs' classified table");
    let block = classified
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the docs' podFailurePolicy block");
    assert_eq!(policy(block), policy_want, "the docs' podFailurePolicy");
    let mut manifests = 0;
    for dir in ["container/k8s", "examples"] {
        let at = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir);
        for e in std::fs::read_dir(at).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            if text.contains("onExitCodes") {
                manifests += 1;
                assert_eq!(policy(&text), policy_want, "{}", e.path().display());
            }
        }
    }
    assert!(manifests >= 1, "no manifest with a podFailurePolicy");
}

/// A podFailurePolicy as the manifests write it, each action's codes on one rule.
fn policy_yaml(codes: &BTreeMap<u8, String>) -> String {
    let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (c, a) in codes {
        by.entry(a.as_str()).or_default().push(c.to_string());
    }
    by.iter()
        .map(|(a, cs)| {
            format!(
                "- action: {a}\n  onExitCodes: {{operator: In, values: [{}]}}\n",
                cs.join(", ")
            )
        })
        .collect()
}

/// The check itself: the table's own policy reads back as the table; the same with
/// one code under another action, or one class missing from the README's list, is
/// caught.
#[test]
fn a_drifted_copy_is_caught() {
    let want = actions(TABLE.iter().chain(&POLICY_EXTRA));
    assert_eq!(policy(&policy_yaml(&want)), want);
    let mut moved = want.clone();
    moved.insert(85, "Count".into());
    assert_ne!(policy(&policy_yaml(&moved)), want);
    let classes: BTreeSet<u8> = actions(TABLE.iter()).keys().copied().collect();
    let listed: Vec<String> = classes
        .iter()
        .filter(|c| **c != 85)
        .map(u8::to_string)
        .collect();
    let short = format!("({})", listed.join(", "));
    assert_ne!(codes_in(&short), classes);
}

//! Dependencies run one way: inside each crate no module imports from a module that
//! contains it (a child reaching back into its parent), and the modules' imports form
//! no cycle. Reads the sources; test modules (support::code_before_tests) are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut m: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                m.pop();
            }
            out.insert(m, p);
        }
    }
    out
}

/// Every `crate::a::b` and `super::a` path in non-test code, as written.
fn paths(text: &str) -> Vec<(String, Vec<String>)> {
    let code: String = crate::support::code_before_tests(text)
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for root in ["crate::", "super::"] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(root) {
            let before = rest[..i].chars().last();
            rest = &rest[i + root.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let mut segs = Vec::new();
            let mut s = rest;
            loop {
                let end = s
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(s.len());
                if end == 0 {
                    break;
                }
                segs.push(s[..end].to_string());
                s = &s[end..];
                match s.strip_prefix("::") {
                    Some(t) if !t.starts_with('{') => s = t,
                    _ => break,
                }
            }
            // `super::{a, b}`: each item of the group.
            let group = s
                .strip_prefix("::{")
                .or_else(|| segs.is_empty().then(|| rest.strip_prefix('{')).flatten());
            match group {
                Some(g) => {
                    let g = &g[..g.find('}').unwrap_or(g.len())];
                    for item in g.split(',') {
                        let first = item.trim().split("::").next().unwrap_or("").trim();
                        if !first.is_empty() && first != "self" {
                            let mut p = segs.clone();
                            p.push(first.to_string());
                            out.push((root.to_string(), p));
                        }
                    }
                }
                None => out.push((root.to_string(), segs)),
            }
        }
    }
    out
}

/// The module a path lands in: the longest prefix that is a module.
fn resolve(
    known: &BTreeMap<Module, PathBuf>,
    from: &Module,
    root: &str,
    segs: &[String],
) -> Module {
    let mut base: Module = if root == "crate::" {
        Vec::new()
    } else {
        from[..from.len().saturating_sub(1)].to_vec()
    };
    let mut segs = segs;
    while segs.first().map(String::as_str) == Some("super") {
        base.pop();
        segs = &segs[1..];
    }
    let mut best = base.clone();
    for s in segs {
        base.push(s.clone());
        if known.contains_key(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    best
}

fn check(krate: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    check_tree(krate, &src)
}

fn check_tree(krate: &str, src: &Path) -> Vec<String> {
    let known = modules(src);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    let mut bad = Vec::new();
    for (m, file) in &known {
        let text = std::fs::read_to_string(file).unwrap();
        for (root, segs) in paths(&text) {
            let t = resolve(&known, m, &root, &segs);
            if &t == m || t.starts_with(m) {
                continue; // itself or its own children
            }
            if m.starts_with(&t) {
                bad.push(format!(
                    "{krate}: {} imports {}{} from its ancestor {}",
                    m.join("::"),
                    root,
                    segs.join("::"),
                    if t.is_empty() {
                        "the crate root".into()
                    } else {
                        t.join("::")
                    }
                ));
            }
            edges.entry(m.clone()).or_default().insert(t);
        }
    }
    // Cycles between modules (depth-first search with colours).
    fn visit(
        n: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        state: &mut BTreeMap<Module, u8>,
        path: &mut Vec<Module>,
        bad: &mut Vec<String>,
    ) {
        match state.get(n) {
            Some(1) => {
                let at = path.iter().position(|p| p == n).unwrap_or(0);
                let cycle: Vec<String> = path[at..].iter().map(|m| m.join("::")).collect();
                bad.push(format!("cycle: {} -> {}", cycle.join(" -> "), n.join("::")));
                return;
            }
            Some(_) => return,
            None => {}
        }
        state.insert(n.clone(), 1);
        path.push(n.clone());
        for t in edges.get(n).into_iter().flatten() {
            visit(t, edges, state, path, bad);
        }
        path.pop();
        state.insert(n.clone(), 2);
    }
    let mut state = BTreeMap::new();
    for n in known.keys() {
        visit(n, &edges, &mut state, &mut Vec::new(), &mut bad);
    }
    bad
}

#[test]
fn modules_depend_one_way() {
    let bad: Vec<String> = ["shared", "agent", "launcher", "nccl-profiler"]
        .iter()
        .flat_map(|k| check(k))
        .collect();
    assert!(
        bad.is_empty(),
        "imports against the grain:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_checker_sees_a_child_importing_its_parent() {
    let p = paths("use super::{job_env, NodePlace};\nuse crate::a::b::C;\n");
    assert!(p.contains(&("super::".into(), vec!["job_env".into()])));
    assert!(p.contains(&("crate::".into(), vec!["a".into(), "b".into(), "C".into()])));
    let known: BTreeMap<Module, PathBuf> = [
        vec![],
        vec!["a".to_string()],
        vec!["a".to_string(), "b".to_string()],
    ]
    .into_iter()
    .map(|m| (m, PathBuf::new()))
    .collect();
    let from = vec!["a".to_string(), "b".to_string()];
    assert_eq!(
        resolve(&known, &from, "super::", &["X".into()]),
        vec!["a".to_string()]
    );
}

#[test]
fn the_checker_finds_back_imports_and_cycles() {
    let t = tempfile::tempdir().unwrap();
    let w = |p: &str, s: &str| {
        let f = t.path().join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, s).unwrap();
    };
    w("lib.rs", "mod a;\nmod b;\nmod job;\n");
    w("a.rs", "use crate::b::X;\n");
    w(
        "b.rs",
        "use crate::a::Y;\n#[cfg(test)]\nuse crate::job::Z;\n",
    );
    w("job/mod.rs", "mod session;\npub struct Job;\n");
    w("job/session.rs", "use super::{Job};\n");
    let bad = check_tree("t", t.path());
    assert!(
        bad.iter()
            .any(|b| b.starts_with("cycle: a -> b -> a") || b.starts_with("cycle: b -> a -> b")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b.contains("job::session imports super::Job from its ancestor job")),
        "{bad:?}"
    );
    assert_eq!(bad.len(), 2, "{bad:?}");
}

/// Literals that name a rendezvous key (a segment under `toporun/<run>/r<N>/`).
const KEY_LITERALS: &[&str] = &[
    "\"join\"",
    "\"closed\"",
    "\"stop\"",
    "\"waiting\"",
    "\"done\"",
    "\"done_seen\"",
    "\"refused_seen\"",
    "\"coordinator\"",
    "\"master\"",
    "\"round\"",
    "\"finished\"",
    "\"layout/",
    "\"env/",
    "\"name/",
    "\"node/",
    "\"alive/",
    "\"claim/",
    "\"nccl/",
    "\"toporun/",
    "}join",
    "}node/",
];

/// Rendezvous keys in non-test code outside `rendezvous/keys.rs`, as file:line.
fn stray_keys(src: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (_, file) in modules(src) {
        if file.ends_with("rendezvous/keys.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = crate::support::code_before_tests(&text);
        for (i, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            // The etcd client's reachability probe reads a key of no rendezvous.
            if line.contains("b\"toporun/ping\"") {
                continue;
            }
            if KEY_LITERALS.iter().any(|k| line.contains(k)) {
                out.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn no_rendezvous_key_exists_outside_round_keys() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/src");
    let stray = stray_keys(&src);
    assert!(
        stray.is_empty(),
        "name these keys in RoundKeys/RunKeys: {stray:#?}"
    );
}

#[test]
fn the_key_check_finds_a_literal_key() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("lib.rs"), "mod a;\n").unwrap();
    std::fs::write(
        t.path().join("a.rs"),
        "fn f(p: &str) -> String { format!(\"{p}closed\") + \"closed\" }\n",
    )
    .unwrap();
    assert_eq!(stray_keys(t.path()).len(), 1);
}

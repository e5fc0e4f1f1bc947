//! The manifests in container/k8s: each validates against Kubernetes' own schema
//! (kubernetes-validate, strict: an unknown field fails), and each toporun/torchrun
//! command line in them parses with toporun's own parser (a misspelled flag fails).
//! TrainJobs are checked with the Kubeflow Trainer's API models (kubeflow-trainer-api).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;

fn manifests(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    v.sort();
    v
}

/// Problems found in the manifests of `dir`: schema errors, then command lines that
/// toporun refuses.
fn problems(dir: &Path) -> Vec<String> {
    let out = Command::new(python())
        .arg(scripts().join("check_manifests.py"))
        .args(manifests(dir))
        .output()
        .unwrap();
    let mut bad = Vec::new();
    if !out.status.success() {
        bad.push(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let cmd: Vec<String> = v["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect();
        let mut c = toporun();
        c.args(["--facts", &host("h200x4")]);
        if cmd[0].ends_with("torchrun") {
            c.args(["launch", "--dry-run"]);
        }
        let (code, _, err) = run(c.args(&cmd[1..]));
        // The fixture host may fail a check (exit 1); a usage error never passes.
        if code == 2 || (cmd[0].ends_with("torchrun") && code != 0) {
            bad.push(format!("{}: {cmd:?}: exit {code}: {err}", v["file"]));
        }
    }
    bad
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn every_manifest_validates_and_its_commands_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../container/k8s");
    assert!(manifests(&dir).len() >= 2);
    let bad = problems(&dir);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_wrong_field_or_a_misspelled_flag_fails() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../container/k8s");
    // (`--nproc-per-nod` would pass: argparse, and so toporun, accepts a unique prefix.)
    for (from, to, says) in [
        ("restartPolicy:", "restartPolicyy:", "restartPolicyy"),
        ("numNodes:", "numNodez:", "numNodez"),
        ("numProcPerNode: 8", "numProcPerNode: gpu", "numProcPerNode"),
        ("\"--expect-gpus\"", "\"--expect-gpuz\"", "--expect-gpuz"),
        (
            "\"train.py\"",
            "\"--nprocs-per-node=8\", \"train.py\"",
            "nprocs-per-node",
        ),
        // Optional from 1.35 only: the older versions managed clusters run refuse it.
        (
            ", status: \"True\"}",
            "}",
            "(Kubernetes 1.31.0): 'status' is a required property",
        ),
    ] {
        let t = tempfile::tempdir().unwrap();
        let mut changed = false;
        for m in manifests(&dir) {
            let text = std::fs::read_to_string(&m).unwrap();
            changed |= text.contains(from);
            std::fs::write(
                t.path().join(m.file_name().unwrap()),
                text.replace(from, to),
            )
            .unwrap();
        }
        assert!(changed, "no manifest holds {from}");
        let bad = problems(t.path());
        assert!(
            bad.iter().any(|b| b.contains(says)),
            "{from} -> {to} passed: {bad:#?}"
        );
    }
}

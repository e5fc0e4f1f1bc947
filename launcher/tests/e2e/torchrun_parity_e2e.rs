//! Usage errors, choices and defaults of torch 2.15's torchrun, side by side with the
//! installed torchrun: same exit codes, same words.

use crate::support;
use std::process::Command;
use support::*;

fn both(args: &[&str]) -> [(i32, String); 2] {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let script = dir.path().join("touch.py");
    std::fs::write(
        &script,
        format!("open({:?}, 'a').write('x')\n", marker.display().to_string()),
    )
    .unwrap();
    let mut out = Vec::new();
    for mut c in [Command::new(torchrun()), toporun()] {
        c.args(args).arg(&script).env("PYTHON_EXEC", python());
        let (code, so, se) = run(&mut c);
        out.push((code, format!("{so}{se}")));
    }
    [out.remove(0), out.remove(0)]
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn usage_errors_match_torchrun() {
    for (args, code, words) in [
        (
            &["--nproc", "2"][..],
            2,
            "ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node",
        ),
        (&["--start-method=thread"], 2, "thread"),
        (&["--numa-binding=none"], 2, "none"),
        (
            &["--logs-specs=DOESNOT_EXIST"],
            1,
            "Could not find entrypoint under 'torchrun.logs_specs[DOESNOT_EXIST]' key",
        ),
    ] {
        let [(tc, to), (oc, oo)] = both(args);
        assert_eq!(
            (oc, tc),
            (code, code),
            "{args:?}\ntorchrun: {to}\ntoporun: {oo}"
        );
        assert!(
            oo.contains(words) && to.contains(words),
            "{args:?}\ntorchrun: {to}\ntoporun: {oo}"
        );
    }
}

#[test]
fn a_held_29500_does_not_stop_a_one_node_job() {
    let _held = std::net::TcpListener::bind("0.0.0.0:29500");
    let (code, out, err) = run(toporun().args([
        "--nproc-per-node=1",
        "--no-python",
        "sh",
        "-c",
        "echo PORT=$MASTER_PORT",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let port = out.trim().strip_prefix("PORT=").unwrap();
    assert_ne!(port, "29500", "{out}");
}

#[test]
fn completion_scripts_work_in_bash() {
    let (code, script, _) = run(toporun().args(["--print-completion", "bash"]));
    assert_eq!(code, 0);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &script).unwrap();
    let out = Command::new("bash")
        .args([
            "-c",
            &format!("source {} && complete -p toporun", f.path().display()),
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("toporun"),
        "{out:?}"
    );
    let (code, zsh, _) = run(toporun().args(["--print-completion=zsh"]));
    assert!(code == 0 && zsh.starts_with("#compdef toporun"), "{zsh}");
    let (code, tcsh, _) = run(toporun().args(["--print-completion", "tcsh"]));
    assert!(
        code == 0 && tcsh.starts_with("complete toporun") && tcsh.contains("nproc-per-node"),
        "{tcsh}"
    );
}

#[test]
fn log_line_prefix_template_option() {
    let (code, out, _) = run(toporun().args([
        "--standalone",
        "--nproc-per-node=2",
        "--tee=3",
        "--log-line-prefix-template=<${rank}|${local_rank}>",
        "--no-python",
        "sh",
        "-c",
        "echo hi",
    ]));
    assert_eq!(code, 0);
    assert!(out.contains("<0|0>hi") && out.contains("<1|1>hi"), "{out}");
}

/// The one file under `dir` named `name`, read as sorted lines (ranks interleave).
fn lines_of(dir: &std::path::Path, name: &str) -> Vec<String> {
    let found: Vec<std::path::PathBuf> = files_under(dir)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == name))
        .collect();
    assert_eq!(found.len(), 1, "{name} under {}: {found:?}", dir.display());
    let mut lines: Vec<String> = std::fs::read_to_string(&found[0])
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// `--duplicate-stdout-filters` and `--duplicate-stderr-filters`: the tee'd lines that
/// contain a filter go, prefixed, to `attempt_0/filtered_std{out,err}.log`, the same
/// lines as torchrun's (`,,` a comma).
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn duplicate_filters_write_the_lines_torchrun_writes() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.py");
    std::fs::write(
        &script,
        "import os, sys\nr = os.environ['RANK']\n\
         for i in range(3):\n    print(f'step {i} loss {i / 2} rank {r}', flush=True)\n\
         print(f'acc, {r}', flush=True)\nprint('noise', flush=True)\n\
         print(f'warn: rank {r} slow', file=sys.stderr, flush=True)\n\
         print('other', file=sys.stderr, flush=True)\n",
    )
    .unwrap();
    let mut got = Vec::new();
    for (name, mut c) in [
        ("torchrun", Command::new(torchrun())),
        ("toporun", toporun()),
    ] {
        let logs = dir.path().join(name);
        c.args(["--standalone", "--nproc-per-node=2", "--tee=3"])
            .arg(format!("--log-dir={}", logs.display()))
            .args([
                "--duplicate-stdout-filters=loss,acc,, ",
                "--duplicate-stderr-filters=warn",
            ])
            .arg(&script)
            .env("PYTHON_EXEC", python());
        let (code, out, err) = run(&mut c);
        assert_eq!(code, 0, "{name}: {out}{err}");
        got.push((
            lines_of(&logs, "filtered_stdout.log"),
            lines_of(&logs, "filtered_stderr.log"),
        ));
    }
    let (out, err) = &got[1];
    assert_eq!(out.len(), 8, "3 losses and 1 acc a rank: {out:?}");
    assert!(out.contains(&"[default1]:acc, 1".to_string()), "{out:?}");
    assert_eq!(
        err,
        &[
            "[default0]:warn: rank 0 slow",
            "[default1]:warn: rank 1 slow"
        ]
    );
    assert_eq!(got[0], got[1], "torchrun's lines, then toporun's");
}

/// A mistyped option is named with the nearest one (torchrun says only
/// "unrecognized arguments"); exit 2 as argparse's.
#[test]
fn a_mistyped_option_gets_the_nearest_one() {
    for (typo, near) in [
        ("--nproc-pr-node=2", "--nproc-per-node"),
        ("--rdzv-endpont=h:1", "--rdzv-endpoint"),
    ] {
        let (code, _, err) = run(toporun().args([typo, "train.py"]));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("did you mean '{near}'?")), "{err}");
    }
    let (code, _, err) = run(toporun().args(["--zzz", "train.py"]));
    assert_eq!(code, 2);
    assert!(!err.contains("did you mean"), "{err}");
}

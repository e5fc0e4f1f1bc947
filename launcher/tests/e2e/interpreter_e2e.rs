//! The ranks' Python, chosen like torchrun's: toporun linked as `<venv>/bin/torchrun`
//! runs `<venv>/bin/python3` even when PATH's python3 has no torch.

use crate::support;
use support::*;

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn torchrun_symlink_in_a_venv_runs_that_venvs_python() {
    let real = python();
    let venv = real.parent().unwrap().parent().unwrap();
    // A second virtualenv in a temp dir sharing the cached one's packages.
    let dir = tempfile::tempdir().unwrap();
    let v = dir.path();
    std::fs::create_dir_all(v.join("bin")).unwrap();
    std::fs::copy(venv.join("pyvenv.cfg"), v.join("pyvenv.cfg")).unwrap();
    std::os::unix::fs::symlink(venv.join("lib"), v.join("lib")).unwrap();
    std::os::unix::fs::symlink(std::fs::canonicalize(&real).unwrap(), v.join("bin/python3"))
        .unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_toporun"), v.join("bin/torchrun")).unwrap();
    let script = v.join("which.py");
    std::fs::write(
        &script,
        "import sys, torch\nprint('EXE', sys.executable, flush=True)\n",
    )
    .unwrap();
    let mut c = std::process::Command::new(v.join("bin/torchrun"));
    c.args(["--standalone", "--nproc-per-node=1", "--nccl-report=off"])
        .arg(&script)
        .env("PATH", "/usr/bin:/bin")
        .env_remove("PYTHON_EXEC")
        .env_remove("VIRTUAL_ENV");
    let (code, out, err) = run(&mut c);
    assert_eq!(code, 0, "{out}\n{err}");
    let want = v.join("bin/python3");
    assert!(out.contains(&format!("EXE {}", want.display())), "{out}");
    assert!(
        err.contains(&format!("toporun: python: {} (beside", want.display())),
        "{err}"
    );
}

#[test]
fn dry_run_names_the_interpreter() {
    let (code, out, _) = run(toporun()
        .args(["launch", "--dry-run", "--standalone", "train.py"])
        .env("PYTHON_EXEC", "/opt/conda/bin/python"));
    assert_eq!(code, 0);
    assert!(
        out.contains("python: /opt/conda/bin/python (PYTHON_EXEC)"),
        "{out}"
    );
}

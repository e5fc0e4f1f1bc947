//! PyTorch's own launcher tests (test/distributed/launcher/test_run.py, torch 2.15),
//! ported: each case runs under the installed torchrun and under toporun installed as
//! `torchrun` beside a `python3` (a virtualenv's bin/, so the interpreter is chosen as
//! torchrun chooses it), and both must give the same outcome: exit code, the ranks
//! that ran, and what the case checks. Cases needing a GPU (--virtual-local-rank's
//! compiled-code check) or mocking torch internals (agent/handler mocks, parse helpers)
//! have no command-line equivalent and are covered by the option and e2e tests.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One case at a time: torch's tests are serial, and c10d's 5 s timeouts in them
/// do not survive four launchers of four ranks each on two cores.
static SERIAL: Mutex<()> = Mutex::new(());

struct Bin {
    name: &'static str,
    path: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// A virtualenv whose bin/torchrun is toporun: its python3, lib/ and pyvenv.cfg are
/// the test virtualenv's, so its python finds torch as the real one does.
fn launchers() -> [Bin; 2] {
    let venv = tempfile::tempdir().unwrap();
    let real = support::python();
    let real_root = real.parent().unwrap().parent().unwrap();
    let bin = venv.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let link = bin.join("torchrun");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_toporun"), &link).unwrap();
    std::os::unix::fs::symlink(&real, bin.join("python3")).unwrap();
    std::os::unix::fs::symlink(real_root.join("lib"), venv.path().join("lib")).unwrap();
    std::fs::copy(real_root.join("pyvenv.cfg"), venv.path().join("pyvenv.cfg")).unwrap();
    [
        Bin {
            name: "torchrun",
            path: support::torchrun(),
            _dir: None,
        },
        Bin {
            name: "toporun as torchrun",
            path: link,
            _dir: Some(venv),
        },
    ]
}

#[derive(Debug, PartialEq)]
struct Outcome {
    code: i32,
    ranks: BTreeSet<String>,
}

struct Run {
    outcome: Outcome,
    stdout: String,
    stderr: String,
    dir: tempfile::TempDir,
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .unwrap()
        .trim()
        .replace('-', "")
}

fn script(name: &str) -> String {
    support::scripts()
        .join("pytorch_suite")
        .join(name)
        .display()
        .to_string()
}

/// `{dir}`, `{port}` and `{id}` in the arguments become a fresh directory, a free port
/// and a run id.
fn start(bin: &Path, args: &[&str], env: &[(&str, &str)], dir: &Path) -> std::process::Child {
    let (port, id) = (support::free_port().to_string(), uuid());
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("{dir}", &dir.display().to_string())
                .replace("{port}", &port)
                .replace("{id}", &id)
        })
        .collect();
    let mut c = Command::new(bin);
    c.args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("TEST_SENTINEL_PARENT", "FOOBAR");
    for (k, _) in std::env::vars() {
        if k.starts_with("PET_") || k.starts_with("TORCHELASTIC_") || k == "OMP_NUM_THREADS" {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    c.spawn().expect("start the launcher")
}

fn finish(name: &str, mut child: std::process::Child) -> (i32, String, String) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{name} did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ranks_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `copies` launchers at once (several agents of one elastic job) under each
/// launcher; returns torchrun's run and toporun's, after checking they agree.
fn both_n(args: &[&str], env: &[(&str, &str)], copies: usize) -> [Run; 2] {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runs = launchers().map(|bin| {
        let dir = tempfile::tempdir().unwrap();
        let children: Vec<_> = (0..copies)
            .map(|_| start(&bin.path, args, env, dir.path()))
            .collect();
        let (mut code, mut stdout, mut stderr) = (0, String::new(), String::new());
        for child in children {
            let (c, o, e) = finish(bin.name, child);
            code = code.max(c);
            stdout.push_str(&o);
            stderr.push_str(&e);
        }
        Run {
            outcome: Outcome {
                code,
                ranks: ranks_in(dir.path()),
            },
            stdout,
            stderr,
            dir,
        }
    });
    assert_eq!(
        runs[0].outcome, runs[1].outcome,
        "torchrun and toporun differ on {args:?} {env:?}\n--- torchrun stderr:\n{}\n--- toporun stderr:\n{}",
        runs[0].stderr, runs[1].stderr
    );
    runs
}

fn both(args: &[&str], env: &[(&str, &str)]) -> [Run; 2] {
    both_n(args, env, 1)
}

fn ranks(n: u32) -> BTreeSet<String> {
    (0..n).map(|i| i.to_string()).collect()
}

fn assert_ran(runs: &[Run; 2], n: u32) {
    for r in runs {
        assert_eq!(r.outcome.code, 0, "{}", r.stderr);
        assert_eq!(r.outcome.ranks, ranks(n), "{}", r.stderr);
    }
}

const PY: &str = "touch_rank.py";
const SH: &str = "touch_rank.sh";

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_user_script_python() {
    let s = script(PY);
    let r = both(
        &[
            "--nnodes=1",
            "--nproc-per-node=4",
            "--rdzv-id={id}",
            "--monitor-interval=1",
            "--start-method=spawn",
            &s,
            "--touch-file-dir={dir}",
        ],
        &[],
    );
    assert_ran(&r, 4);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_user_script_python_caffe2_bc() {
    let s = script(PY);
    let r = both(
        &[
            "--nnodes=1",
            "--nproc-per-node=4",
            "--monitor-interval=1",
            "--start-method=spawn",
            "--master-addr=localhost",
            "--master-port={port}",
            "--node-rank=0",
            &s,
            "--touch-file-dir={dir}",
        ],
        &[],
    );
    assert_ran(&r, 4);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_user_script_bash_and_no_python_with_module() {
    let s = script(SH);
    let base = [
        "--nnodes=1",
        "--nproc-per-node=4",
        "--rdzv-id={id}",
        "--monitor-interval=1",
        "--start-method=spawn",
        "--no-python",
    ];
    let with_module: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--module", &s, "{dir}"])
        .collect();
    let r = both(&with_module, &[]);
    for run in &r {
        assert_ne!(run.outcome.code, 0, "--no-python with --module must fail");
        assert!(run.outcome.ranks.is_empty());
    }
    let plain: Vec<&str> = base.iter().copied().chain([s.as_str(), "{dir}"]).collect();
    assert_ran(&both(&plain, &[]), 4);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_user_script_default_nproc() {
    let s = script(SH);
    let r = both(
        &[
            "--nnodes=1",
            "--rdzv-id={id}",
            "--monitor-interval=1",
            "--start-method=spawn",
            "--no-python",
            &s,
            "{dir}",
        ],
        &[],
    );
    assert_ran(&r, 1);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_with_env_vars() {
    let s = script(SH);
    let env = [
        ("PET_NNODES", "1"),
        ("PET_NPROC_PER_NODE", "4"),
        ("PET_RDZV_ID", "pet-test"),
        ("PET_MONITOR_INTERVAL", "1"),
        ("PET_START_METHOD", "spawn"),
        ("PET_NO_PYTHON", "1"),
    ];
    let mut with_module = env.to_vec();
    with_module.push(("PET_MODULE", "1"));
    for run in both(&[&s, "{dir}"], &with_module) {
        assert_ne!(
            run.outcome.code, 0,
            "PET_NO_PYTHON with PET_MODULE must fail"
        );
    }
    let mut without = env.to_vec();
    without.push(("PET_MODULE", "0"));
    assert_ran(&both(&[&s, "{dir}"], &without), 4);
}

fn nproc(value: &str) -> [Run; 2] {
    let s = script(SH);
    let arg = format!("--nproc-per-node={value}");
    both(
        &[
            "--nnodes=1",
            &arg,
            "--rdzv-id={id}",
            "--monitor-interval=1",
            "--start-method=spawn",
            "--no-python",
            &s,
            "{dir}",
        ],
        // No accelerator, as the torch test patches it away.
        &[("CUDA_VISIBLE_DEVICES", "")],
    )
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn nproc_launch_configurations() {
    assert_ran(&nproc("4"), 4);
    // auto without an accelerator: one rank per CPU this process may use.
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&c| set.is_set(c).unwrap_or(false))
                .count() as u32
        })
        .unwrap();
    assert_ran(&nproc("auto"), cpus);
    for run in nproc("unknown") {
        assert_ne!(run.outcome.code, 0, "--nproc-per-node=unknown must fail");
    }
}

fn elastic_args<'a>(
    s: &'a str,
    endpoint: &'a str,
    conf: &'a str,
    tail: &[&'a str],
) -> Vec<&'a str> {
    let mut a = vec![
        "--nnodes=1:2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        endpoint,
        conf,
        "--rdzv-id={id}",
        "--monitor-interval=1",
        "--start-method=spawn",
    ];
    a.extend(tail);
    a.push(s);
    a
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_elastic() {
    let s = script(PY);
    // The quotes are in torch's test too: they reach the launcher as part of the value.
    let a = elastic_args(
        &s,
        "--rdzv-endpoint=localhost:{port}",
        "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
        &[],
    );
    let a: Vec<&str> = a.into_iter().chain(["--touch-file-dir={dir}"]).collect();
    assert_ran(&both(&a, &[]), 4);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_elastic_worker_raise_exception() {
    let s = script(PY);
    let a = elastic_args(
        &s,
        "--rdzv-endpoint=localhost:{port}",
        "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
        &["--max-restarts=0"],
    );
    let a: Vec<&str> = a.into_iter().chain(["--fail"]).collect();
    let runs = both(&a, &[]);
    // The same host name (torch's socket.getfqdn()) in both summaries.
    let host = |r: &Run| {
        r.stderr
            .lines()
            .find(|l| l.trim_start().starts_with("host "))
            .map(str::to_string)
    };
    assert_eq!(host(&runs[0]), host(&runs[1]));
    assert!(host(&runs[0]).is_some(), "{}", runs[0].stderr);
    for run in runs {
        assert_eq!(run.outcome.code, 1);
        // torch's ChildFailedError block, which the test asserts is raised.
        assert!(
            run.stderr.contains("Root Cause (first observed failure):")
                && run.stderr.contains("exitcode  : 1"),
            "{}",
            run.stderr
        );
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_elastic_multiple_agents() {
    let s = script(PY);
    let a = elastic_args(
        &s,
        "--rdzv-endpoint=localhost:{port}",
        "--rdzv_conf=timeout=5",
        &[],
    );
    let a: Vec<&str> = a.into_iter().chain(["--touch-file-dir={dir}"]).collect();
    // Both agents must meet at one endpoint of one run: fix the port and id for the pair.
    let (port, id) = (support::free_port().to_string(), uuid());
    let a: Vec<String> = a
        .iter()
        .map(|x| x.replace("{port}", &port).replace("{id}", &id))
        .collect();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    assert_ran(&both_n(&a, &[], 2), 8);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn launch_standalone_and_run_path() {
    let s = script(PY);
    for first in ["--standalone", "--run-path"] {
        let r = both(
            &[
                first,
                "--nnodes=1",
                "--nproc-per-node=4",
                "--monitor-interval=1",
                "--start-method=spawn",
                &s,
                "--touch-file-dir={dir}",
            ],
            &[],
        );
        assert_ran(&r, 4);
    }
}

fn elastic_launched(extra: &[&str]) -> [Run; 2] {
    let s = script(PY);
    let mut a = vec![
        "--run-path",
        "--nnodes=1",
        "--nproc-per-node=1",
        "--monitor-interval=1",
    ];
    a.extend(extra);
    a.extend([s.as_str(), "--out-file={dir}/out"]);
    both(&a, &[])
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn is_torchelastic_launched() {
    for extra in [&[][..], &["--logs_specs=default"][..]] {
        for run in elastic_launched(extra) {
            assert_eq!(run.outcome.code, 0, "{}", run.stderr);
            let said = std::fs::read_to_string(run.dir.path().join("out")).unwrap();
            assert_eq!(said, "True", "{extra:?}");
        }
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn logs_specs_entrypoint_must_be_defined() {
    for run in elastic_launched(&["--logs_specs=DOESNOT_EXIST"]) {
        assert_eq!(run.outcome.code, 1, "{}", run.stderr);
        assert!(run.outcome.ranks.is_empty(), "no rank may start");
        assert!(run.stderr.contains("DOESNOT_EXIST"), "{}", run.stderr);
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn init_method_tcp_and_env_with_torchelastic() {
    let s = script(PY);
    let port = support::free_port().to_string();
    let master = format!("--master-port={port}");
    let tcp = format!("--init-method=tcp://localhost:{port}");
    for init in [tcp.as_str(), "--init-method=env://"] {
        let r = both(
            &[
                "--run-path",
                "--nnodes=1",
                "--nproc-per-node=4",
                "--master-addr=localhost",
                &master,
                "--monitor-interval=1",
                &s,
                init,
                "--touch-file-dir={dir}",
            ],
            &[],
        );
        assert_ran(&r, 4);
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn capture_logs_using_default_logs_specs() {
    let s = script(SH);
    let r = both(
        &[
            "--nnodes=1",
            "--nproc-per-node=4",
            "--rdzv-id={id}",
            "--redirect=3",
            "--tee=3",
            "--monitor-interval=1",
            "--start-method=spawn",
            "--no-python",
            &s,
            "{dir}",
        ],
        &[("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[rank${rank}]: ")],
    );
    assert_ran(&r, 4);
    for run in &r {
        for i in 0..4 {
            assert!(
                run.stdout.contains(&format!("[rank{i}]: creating ")),
                "rank {i}'s line missing:\n{}",
                run.stdout
            );
        }
    }
}

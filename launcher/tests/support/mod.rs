//! Helpers for end-to-end tests: the real binary, fixtures, the reference PyTorch.

#![allow(dead_code)]

pub mod etcd;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test: this build's, or another one (`TOPORUN_BIN`: the portable
/// release binary, the one inside the image).
pub fn toporun() -> Command {
    let bin = std::env::var("TOPORUN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_toporun").into());
    toporun_at(Path::new(&bin))
}

/// The binary at `bin` (a copy of the one under test), run as [`toporun`] runs it.
pub fn toporun_at(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env_remove("NO_COLOR");
    for (k, _) in std::env::vars().filter(|(k, _)| changes_toporun(k)) {
        c.env_remove(k);
    }
    c
}

/// A variable of the test's own shell that changes what toporun or its ranks do, so
/// the harness clears it (a test that needs one sets it): torchrun's `PET_*`, every
/// `TOPORUN_*` toporun reads, PyTorch's and NCCL's own, the GPUs shown, the ranks'
/// Python (README's "Try it" leaves no PYTHON_EXEC behind, a user's shell may).
fn changes_toporun(k: &str) -> bool {
    const PREFIXES: [&str; 4] = ["PET_", "NCCL_", "TORCH_", "TORCHELASTIC_"];
    const NAMES: [&str; 6] = [
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "OMP_NUM_THREADS",
        "PYTHON_EXEC",
        "PYTHONFAULTHANDLER",
        "LOGLEVEL",
    ];
    PREFIXES.iter().any(|p| k.starts_with(p))
        || NAMES.contains(&k)
        || toporun_shared::toporun_vars::ToporunVar::ALL
            .iter()
            .any(|v| v.name() == k)
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

pub fn host(name: &str) -> String {
    fixtures()
        .join("hosts")
        .join(format!("{name}.json"))
        .display()
        .to_string()
}

pub fn run(cmd: &mut Command) -> (i32, String, String) {
    let (code, out, err, _) = run_within(cmd, RUN_DEADLINE);
    (code, out, err)
}

/// How long one run may take: past it the test fails at once with what the run
/// printed, instead of waiting out a timeout of toporun's (a join waits 600 s). The
/// longest run of the suite takes about two minutes.
pub const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// Runs `cmd` (stdin closed, output captured); (exit code, stdout, stderr, how long).
/// Past `limit` it is asked to stop (SIGTERM, as a pod's deletion does), killed 15 s
/// later, and the test fails naming the command and showing the stderr read so far
/// (a process it left behind may hold the pipe open: the end of file is not waited).
pub fn run_within(cmd: &mut Command, limit: Duration) -> (i32, String, String, Duration) {
    let t = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run toporun");
    let out = Captured::of(child.stdout.take());
    let err = Captured::of(child.stderr.take());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > limit {
            stop(&mut child);
            std::thread::sleep(Duration::from_millis(200));
            let err = err.so_far();
            panic!("{cmd:?} still running after {limit:?} (stopped)\n--- its stderr ---\n{err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t.elapsed();
    (status.code().unwrap_or(-1), out.whole(), err.whole(), took)
}

/// One output of a child, read on its own thread as it comes.
struct Captured {
    text: Arc<Mutex<Vec<u8>>>,
    reader: std::thread::JoinHandle<()>,
}

impl Captured {
    fn of(r: Option<impl Read + Send + 'static>) -> Captured {
        let text: Arc<Mutex<Vec<u8>>> = Arc::default();
        let keep = text.clone();
        let reader = std::thread::spawn(move || {
            let Some(mut r) = r else { return };
            let mut buf = [0u8; 8192];
            while let Ok(n @ 1..) = r.read(&mut buf) {
                keep.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Captured { text, reader }
    }

    fn so_far(&self) -> String {
        String::from_utf8_lossy(&self.text.lock().unwrap()).into_owned()
    }

    /// Everything, to the end of the file.
    fn whole(self) -> String {
        self.reader.join().unwrap();
        let text = self.text.lock().unwrap();
        String::from_utf8_lossy(&text).into_owned()
    }
}

/// SIGTERM, then SIGKILL if it is still there 15 s later.
fn stop(child: &mut Child) {
    // Not yet waited for, the child's pid is still its own even if it just ended.
    sigterm(child);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The python of the cached virtualenv with real PyTorch (scripts/dev/setup_venv.sh).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("TOPORUN_PYTHON") {
        return PathBuf::from(p);
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let venv =
        std::env::var("TOPORUN_VENV").unwrap_or_else(|_| format!("{home}/.cache/toporun-venv"));
    let py = PathBuf::from(venv).join("bin/python");
    assert!(
        py.exists(),
        "{} missing: run scripts/dev/setup_venv.sh first (the README's test command does)",
        py.display()
    );
    py
}

pub fn torchrun() -> PathBuf {
    python().with_file_name("torchrun")
}

pub fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts")
}

/// Runs one of the test scripts (`name` under [`scripts`]) with the tests' Python.
pub fn run_script(name: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(python())
        .arg(scripts().join(name))
        .args(args)
        .output()
        .unwrap()
}

/// Sends SIGTERM to a child (toporun under test).
pub fn sigterm(child: &std::process::Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("signal toporun");
}

/// A captured NCCL log under tests/fixtures/nccl-logs.
pub fn nccl_log(name: &str) -> String {
    fixtures()
        .join("nccl-logs")
        .join(name)
        .display()
        .to_string()
}

/// Whether this test may create a UTS namespace (root); says so when it may not.
pub fn can_unshare_uts(test: &str) -> bool {
    let ok = Command::new("unshare")
        .args(["--uts", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(test, "unshare --uts needs root");
    }
    ok
}

/// Tests that may skip on CI, each with why (none today: CI runs as root with a
/// network, so every privilege and address the e2e tests need is there).
pub const EXPECTED_SKIPS: &[(&str, &str)] = &[];

/// Whether a skip must fail the test: on CI (`CI` true, as CI services set it) or
/// where TOPORUN_REQUIRE_PRIVILEGES is set, unless the test is an expected skip.
pub fn skip_refused(test: &str, ci: Option<&str>, require: bool) -> Option<String> {
    let on_ci = ci.and_then(toporun_shared::flags::torch_bool) == Some(true);
    if !(on_ci || require) || EXPECTED_SKIPS.iter().any(|(t, _)| *t == test) {
        return None;
    }
    let why = if on_ci {
        "CI=true"
    } else {
        "TOPORUN_REQUIRE_PRIVILEGES is set"
    };
    Some(format!(
        "{why} and {test} is not in support::EXPECTED_SKIPS: give the machine what it lacks, or list the test there with its reason"
    ))
}

/// A test that cannot run on this machine (a privilege or an address missing) says
/// so rather than pass unsaid: the skip goes to `<target>/tmp/skipped-tests.txt`,
/// which scripts/dev/test.sh prints at the end; on CI it fails instead
/// ([`skip_refused`]).
pub fn skip(test: &str, why: &str) {
    let ci = std::env::var("CI").ok();
    let require = std::env::var_os("TOPORUN_REQUIRE_PRIVILEGES").is_some();
    if let Some(refused) = skip_refused(test, ci.as_deref(), require) {
        panic!("{test} cannot run here: {why}; {refused}");
    }
    eprintln!("skipping {test}: {why}");
    let list = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(list)
    {
        use std::io::Write;
        let _ = writeln!(f, "{test}: {why}");
    }
}

/// A TCP port free on every interface right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A process's resident memory in MB (0 once it is gone).
pub fn rss_mb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Starts the command with this open-file limit (a container's default, say).
pub fn with_nofile(cmd: &mut Command, soft: u64, hard: u64) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, soft, hard)
                .map_err(std::io::Error::from)
        })
    }
}

/// Waits (at most 20 s) until something listens on 127.0.0.1:`port`.
pub fn listening(port: u16) {
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "nothing listens on port {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// An HTTP client (reqwest is built with rustls and no crypto provider of its own:
/// the process installs ring's, as toporun does).
pub fn http() -> reqwest::blocking::ClientBuilder {
    toporun_agent::tls::install_provider();
    reqwest::blocking::Client::builder()
}

/// Every file under `dir`, at any depth (none where it cannot be read).
pub fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Every sample of an OpenMetrics text, as `name{labels}` -> value, parsed by
/// prometheus_client.
pub fn prometheus_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    use std::io::Write;
    let mut py = std::process::Command::new(python())
        .args([
            "-c",
            "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as parse\nfor f in parse(sys.stdin.read()):\n    for s in f.samples:\n        labels = ','.join(f'{k}={v}' for k, v in sorted(s.labels.items()))\n        print(f'{s.name}{{{labels}}} {s.value}')",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    py.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The pids ranks wrote to `out`/pid<rank>, once all `n` have (within `timeout`).
pub fn rank_pids(out: &Path, n: usize, timeout: std::time::Duration) -> Vec<i32> {
    let start = std::time::Instant::now();
    loop {
        let got: Vec<i32> = (0..n)
            .filter_map(|r| {
                std::fs::read_to_string(out.join(format!("pid{r}")))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .collect();
        if got.len() == n {
            return got;
        }
        assert!(
            start.elapsed() < timeout,
            "ranks did not start within {timeout:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A source file's code before its first test module (`#[cfg(test)]` then a `mod`):
/// the one place the structural tests find where test code starts. A `#[cfg(test)]`
/// item that is no module (a test-only import or function) is code and counts.
pub fn code_before_tests(text: &str) -> &str {
    let mut at = 0;
    while let Some(i) = text[at..].find("#[cfg(test)]") {
        let start = at + i;
        let next = text[start + "#[cfg(test)]".len()..].trim_start();
        let item = next
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        if item.starts_with("mod ") {
            return &text[..start];
        }
        at = start + 1;
    }
    text
}

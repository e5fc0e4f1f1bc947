//! Elastic jobs with real PyTorch (gloo) workers on loopback, over c10d and over a
//! real 3-member etcd cluster: a lost node named and the survivors going on, a node
//! killed and replaced, the store's node killed, an etcd member killed, spares and
//! scale-up, etcd unreachable, garbage under the run's keys. Each test prints its
//! measured times (`--nocapture`), which README's failure table quotes.

use crate::support;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use support::etcd::EtcdCluster;
use support::*;

/// Keep-alives every second, lost after two misses: a lost node is seen in 2-3 s.
const CONF: &str =
    "keep_alive_interval=1,keep_alive_max_attempt=2,last_call_timeout=1,join_timeout=60";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    C10d,
    Etcd,
}

struct Node {
    child: Option<Child>,
    err: PathBuf,
    started: Instant,
}

impl Node {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn kill(&mut self) -> Instant {
        let mut c = self.child.take().expect("running");
        c.kill().unwrap();
        let at = Instant::now();
        c.wait().unwrap();
        at
    }

    /// Exit code and how long the node ran.
    fn wait(&mut self, limit: Duration) -> (i32, Duration) {
        let c = self.child.as_mut().expect("running");
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                self.child = None;
                return (s.code().unwrap_or(-1), self.started.elapsed());
            }
            if self.started.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                panic!("node did not end within {limit:?}:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Job {
    dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    started: usize,
}

impl Job {
    fn new(backend: Backend, endpoint: &str, nnodes: &str, extra: &[&str]) -> Job {
        Job::with_conf(backend, endpoint, nnodes, CONF, extra)
    }

    fn with_conf(
        backend: Backend,
        endpoint: &str,
        nnodes: &str,
        conf: &str,
        extra: &[&str],
    ) -> Job {
        let mut args: Vec<String> = vec![
            format!("--nnodes={nnodes}"),
            "--nproc-per-node=1".into(),
            format!(
                "--rdzv-backend={}",
                if backend == Backend::Etcd {
                    "etcd"
                } else {
                    "c10d"
                }
            ),
            format!("--rdzv-endpoint={endpoint}"),
            format!("--rdzv-id=elastic{}", free_port()),
            format!("--rdzv-conf={conf}"),
            "--monitor-interval=0.2".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push("elastic_steps.py".into());
        Job {
            dir: tempfile::tempdir().unwrap(),
            args,
            env: Vec::new(),
            started: 0,
        }
    }

    fn env(mut self, k: &str, v: &str) -> Job {
        self.env.push((k.into(), v.into()));
        self
    }

    fn node(&mut self) -> Node {
        let err = self.dir.path().join(format!("node{}.err", self.started));
        self.started += 1;
        let mut c = toporun();
        c.args(&self.args)
            .env("PROBE_OUT", self.dir.path())
            .env("PYTHON_EXEC", python())
            .current_dir(scripts())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        Node {
            child: Some(c.spawn().unwrap()),
            err,
            started: Instant::now(),
        }
    }

    /// (time, world, rank, step, restart count, pid) of every step so far.
    fn steps(&self) -> Vec<(f64, u32, u32, u32, String, u32)> {
        std::fs::read_to_string(self.dir.path().join("steps"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((
                    f.first()?.parse().ok()?,
                    f.get(1)?.parse().ok()?,
                    f.get(2)?.parse().ok()?,
                    f.get(3)?.parse().ok()?,
                    f.get(4)?.to_string(),
                    f.get(5)?.parse().ok()?,
                ))
            })
            .collect()
    }

    /// Waits until a step of a `world`-rank round ran.
    fn wait_steps(&self, world: u32, limit: Duration) {
        let t = Instant::now();
        while !self.steps().iter().any(|s| s.1 == world) {
            assert!(
                t.elapsed() < limit,
                "no step with world size {world} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Seconds from `at` (a kill) to the first step of a `world`-rank round started
    /// after it (by a rank process that had not stepped before).
    fn first_step_after(&self, at: std::time::SystemTime, world: u32) -> Option<f64> {
        let at = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
        let steps = self.steps();
        let old: std::collections::BTreeSet<u32> =
            steps.iter().filter(|s| s.0 <= at).map(|s| s.5).collect();
        steps
            .iter()
            .filter(|s| s.0 > at && s.1 == world && !old.contains(&s.5))
            .map(|s| s.0 - at)
            .reduce(f64::min)
    }

    fn finished(&self, world: u32) -> Vec<String> {
        (0..world)
            .filter_map(|r| {
                std::fs::read_to_string(self.dir.path().join(format!("finished-{r}-{world}"))).ok()
            })
            .collect()
    }
}

fn c10d_endpoint() -> String {
    format!("127.0.0.1:{}", free_port())
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_two_node_gloo_job() {
    let etcd = EtcdCluster::start(3);
    let mut job = Job::new(Backend::Etcd, &etcd.endpoints(), "2", &[]).env("STEPS", "4");
    let mut nodes = [job.node(), job.node()];
    for n in &mut nodes {
        let (code, took) = n.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{}", n.stderr());
        eprintln!("etcd 2-node job: {took:.1?}");
    }
    assert_eq!(job.finished(2).len(), 2);
    let all: String = nodes.iter().map(Node::stderr).collect();
    assert!(
        all.contains("joining through etcd at http://127.0.0.1"),
        "{all}"
    );
    assert_eq!(all.matches("node rank 0 of 2").count(), 1, "{all}");
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn an_etcd_member_killed_mid_job_changes_nothing() {
    let mut etcd = EtcdCluster::start(3);
    let mut job = Job::new(Backend::Etcd, &etcd.endpoints(), "2", &[])
        .env("STEPS", "20")
        .env("STEP_SECS", "0.25");
    let mut nodes = [job.node(), job.node()];
    job.wait_steps(2, Duration::from_secs(60));
    // The first endpoint: the member every node talks to first.
    etcd.kill(0);
    for n in &mut nodes {
        let (code, _) = n.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{}", n.stderr());
    }
    // Both ranks finished in the first attempt: no restart, no new round.
    assert_eq!(job.finished(2), vec!["0", "0"]);
    assert!(!nodes.iter().any(|n| n.stderr().contains("round 1")));
}

/// Whether a stderr is the node hosting the workers' store.
fn hosts_the_store(backend: Backend, err: &str) -> bool {
    match backend {
        Backend::Etcd => err.contains("this node is node rank 0 of 3"),
        Backend::C10d => err.contains("hosting the store"),
    }
}

/// Kills a node of a 3-node round (the one hosting the workers' store, or another)
/// while the ranks all-reduce in a loop, with the default --max-restarts=0: the
/// survivors' exits and stderr, and the seconds from the kill to the 2-rank round's
/// first step.
fn kill_mid_collective(
    backend: Backend,
    endpoint: &str,
    store_host: bool,
) -> (Job, Vec<(i32, String)>, f64) {
    let mut job = Job::new(backend, endpoint, "2:3", &[])
        .env("STEPS", "24")
        .env("STEP_SECS", "0.25");
    let mut nodes: Vec<Node> = (0..3).map(|_| job.node()).collect();
    job.wait_steps(3, Duration::from_secs(60));
    let victim = nodes
        .iter()
        .position(|n| hosts_the_store(backend, &n.stderr()) == store_host)
        .expect("a node to kill");
    let at = std::time::SystemTime::now();
    nodes[victim].kill();
    let mut out = Vec::new();
    for (i, n) in nodes.iter_mut().enumerate().filter(|(i, _)| *i != victim) {
        let (code, _) = n.wait(Duration::from_secs(90));
        eprintln!("node {i}: exit {code}");
        out.push((code, n.stderr()));
    }
    let next = job.first_step_after(at, 2).unwrap_or(f64::NAN);
    (job, out, next)
}

/// The survivors went on as a 2-rank job, the loss named as the cause, not counted.
fn survived(job: &Job, survivors: &[(i32, String)], next: f64, what: &str) {
    eprintln!("{what}: first step of the 2-node round {next:.1} s after the kill");
    for (code, err) in survivors {
        assert_eq!(*code, 0, "{err}");
        assert!(err.contains("root cause (peer)"), "{err}");
        assert!(err.contains("not counted against --max-restarts"), "{err}");
    }
    // A survivor whose rank failed before the keep-alives spoke held the peer's
    // address, as the rank's output gives it, against the verdict; one whose rank
    // was still exiting (torch's teardown can outlast 1 s keep-alives on a loaded
    // machine) was stopped by the membership change itself.
    for (_, err) in survivors {
        let held = err.find("a rank lost a peer at 127.0.0.1:");
        let stopped = err.find("stopping the ranks: membership:");
        assert!(
            held.is_some() || stopped.is_some(),
            "neither held nor stopped by the membership change: {err}"
        );
        if let (Some(h), Some(s)) = (held, stopped) {
            assert!(h < s, "held the verdict after the membership stop: {err}");
        }
    }
    assert_eq!(job.finished(2).len(), 2, "survivors finish as a 2-rank job");
    // Keep-alives of 1 s x 2 misses, the hold's margin, a new round and torch's start:
    // 6-12 s alone on 2 cores, 19.0 s once while a build shared them. A verdict that
    // waited for a lease or read timeout instead takes 30 s or more.
    assert!(next < 25.0, "{next}");
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_survives_the_loss_of_the_node_hosting_the_store() {
    let etcd = EtcdCluster::start(3);
    let (job, survivors, next) = kill_mid_collective(Backend::Etcd, &etcd.endpoints(), true);
    survived(
        &job,
        &survivors,
        next,
        "etcd, store node killed mid-collective",
    );
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_survives_the_loss_of_a_node_mid_collective() {
    let etcd = EtcdCluster::start(3);
    let (job, survivors, next) = kill_mid_collective(Backend::Etcd, &etcd.endpoints(), false);
    survived(&job, &survivors, next, "etcd, a node killed mid-collective");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_survives_the_loss_of_a_node_mid_collective() {
    let (job, survivors, next) = kill_mid_collective(Backend::C10d, &c10d_endpoint(), false);
    survived(&job, &survivors, next, "c10d, a node killed mid-collective");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_loses_the_job_with_the_store_host_and_says_so() {
    let (_job, survivors, _) = kill_mid_collective(Backend::C10d, &c10d_endpoint(), true);
    for (code, err) in &survivors {
        assert_eq!(*code, 1, "{err}");
        assert!(
            err.contains("lost the rendezvous state") || err.contains("rendezvous store"),
            "{err}"
        );
    }
}

/// A node that comes while a round below --nnodes max runs is admitted at once: the
/// running nodes restart (not counted against --max-restarts) and the job finishes
/// with both.
fn scale_up(backend: Backend, endpoint: &str) {
    let mut job = Job::new(backend, endpoint, "1:2", &[])
        .env("STEPS", "16")
        .env("STEP_SECS", "0.25");
    let mut first = job.node();
    job.wait_steps(1, Duration::from_secs(60));
    let at = std::time::SystemTime::now();
    let mut second = job.node();
    for n in [&mut first, &mut second] {
        let (code, _) = n.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{}", n.stderr());
    }
    let admitted = job.first_step_after(at, 2).expect("a 2-node round ran");
    eprintln!("scale-up: the new node's first step {admitted:.1} s after it started");
    assert_eq!(job.finished(2), vec!["0", "0"], "not counted as a restart");
    assert!(
        first.stderr().contains("waiting to join") && first.stderr().contains("not counted"),
        "{}",
        first.stderr()
    );
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_admits_a_node_that_comes_while_the_job_runs() {
    scale_up(Backend::C10d, &c10d_endpoint());
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_admits_a_node_that_comes_while_the_job_runs() {
    let etcd = EtcdCluster::start(3);
    scale_up(Backend::Etcd, &etcd.endpoints());
}

/// Kills one of two running nodes, not the one hosting the c10d store (etcd: either,
/// `a`); true when it was `a`.
fn kill_a_non_host(backend: Backend, a: &mut Node, b: &mut Node) -> bool {
    let kill_a = backend == Backend::Etcd || !a.stderr().contains("hosting the store");
    if kill_a {
        a.kill();
    } else {
        b.kill();
    }
    kill_a
}

/// A 2-node job of STEPS quiet steps (no collective notices a lost node) running, and
/// a third node that has said it waits as a spare.
fn two_nodes_and_a_spare(backend: Backend, endpoint: &str, steps: u32) -> (Job, Node, Node, Node) {
    let mut job = Job::new(backend, endpoint, "2", &[])
        .env("STEPS", &steps.to_string())
        .env("STEP_SECS", "0.25")
        .env("QUIET", "1");
    let a = job.node();
    let b = job.node();
    job.wait_steps(2, Duration::from_secs(60));
    let spare = job.node();
    let t = Instant::now();
    while !spare.stderr().contains("waits for the next round") {
        assert!(t.elapsed() < Duration::from_secs(20), "{}", spare.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    (job, a, b, spare)
}

/// Three nodes for a 2-node job: the third waits as a spare; a running node is lost
/// in a quiet phase (no collective notices), its loss is named by keep-alives, and the
/// spare takes its place.
fn spare_replaces_a_lost_node(backend: Backend, endpoint: &str) {
    let (job, mut a, mut b, mut spare) = two_nodes_and_a_spare(backend, endpoint, 40);
    let at = std::time::SystemTime::now();
    let survivor = if kill_a_non_host(backend, &mut a, &mut b) {
        &mut b
    } else {
        &mut a
    };
    for n in [survivor, &mut spare] {
        let (code, _) = n.wait(Duration::from_secs(120));
        assert_eq!(code, 0, "{}", n.stderr());
    }
    let next = job.first_step_after(at, 2).expect("a new round ran");
    eprintln!("spare replaces a lost node: first step of the next round {next:.1} s after the kill (keep-alive timeout 2 s)");
    let all = format!("{}{}", a.stderr(), b.stderr());
    assert!(
        all.contains("stopped sending keep-alives") && all.contains("last seen"),
        "the lost node is named: {all}"
    );
    // Alone this takes 4.8-6.0 s; with the other elastic tests and their etcd clusters
    // running beside it on CI's 2 cores, once 10.3 s. The bound catches a round that
    // waits for a join timeout (60 s), not scheduling noise.
    assert!(next < 2.0 + 5.0 + 8.0, "{next}");
    assert_eq!(job.finished(2).len(), 2);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_spare_replaces_a_lost_node() {
    spare_replaces_a_lost_node(Backend::C10d, &c10d_endpoint());
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_spare_replaces_a_lost_node() {
    let etcd = EtcdCluster::start(3);
    spare_replaces_a_lost_node(Backend::Etcd, &etcd.endpoints());
}

/// A spare that dies while it waits drops out of the waiting count (etcd: its lease
/// expires; a TCPStore: its beat stops moving), so when a running node is then lost
/// the survivor knows no one will come and says so at once, instead of forming a round
/// for the dead spare and waiting the join timeout (60 s) for it.
fn forgets_a_spare_that_died_while_waiting(backend: Backend, endpoint: &str) {
    let (_job, mut a, mut b, mut spare) = two_nodes_and_a_spare(backend, endpoint, 120);
    // The running nodes see the spare (their note), then it dies.
    std::thread::sleep(Duration::from_secs(2));
    spare.kill();
    // Its keep-alive (interval 1 s x 2 misses) runs out.
    std::thread::sleep(Duration::from_secs(4));
    let killed = Instant::now();
    let survivor = if kill_a_non_host(backend, &mut a, &mut b) {
        &mut b
    } else {
        &mut a
    };
    let (code, _) = survivor.wait(Duration::from_secs(90));
    let took = killed.elapsed();
    let err = survivor.stderr();
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1 node(s) remain and 0 wait, fewer than the minimum of 2"),
        "{err}"
    );
    eprintln!(
        "a dead spare forgotten ({backend:?}): the survivor exited {took:.1?} after the loss"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_forgets_a_spare_that_died_while_waiting() {
    forgets_a_spare_that_died_while_waiting(Backend::C10d, &c10d_endpoint());
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_forgets_a_spare_that_died_while_waiting() {
    let etcd = EtcdCluster::start(3);
    forgets_a_spare_that_died_while_waiting(Backend::Etcd, &etcd.endpoints());
}

/// A node killed (toporun and its ranks) and started again 8 s later, as Kubernetes
/// restarts a pod: the job goes on and every node exits 0. Default keep-alives (5 s,
/// 3 misses): the replacement is there before the loss is declared (with fewer than
/// --nnodes min nodes left and none waiting, a lost node ends the job).
fn killed_and_replaced(backend: Backend, endpoint: &str) {
    let conf = "last_call_timeout=1,join_timeout=60";
    let mut job = Job::with_conf(backend, endpoint, "2", conf, &["--max-restarts=3"])
        .env("STEPS", "60")
        .env("STEP_SECS", "0.2");
    let mut a = job.node();
    let mut b = job.node();
    job.wait_steps(2, Duration::from_secs(60));
    let at = std::time::SystemTime::now();
    let mut keep = if kill_a_non_host(backend, &mut a, &mut b) {
        b
    } else {
        a
    };
    std::thread::sleep(Duration::from_secs(8));
    let mut replacement = job.node();
    for n in [&mut keep, &mut replacement] {
        let (code, _) = n.wait(Duration::from_secs(120));
        assert_eq!(code, 0, "{}", n.stderr());
    }
    let next = job.first_step_after(at, 2).expect("the job went on");
    eprintln!(
        "node killed, replaced 8 s later: first step of the next round {next:.1} s after the kill"
    );
    assert_eq!(job.finished(2).len(), 2);
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn c10d_node_killed_and_replaced_8s_later() {
    killed_and_replaced(Backend::C10d, &c10d_endpoint());
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_node_killed_and_replaced_8s_later() {
    let etcd = EtcdCluster::start(3);
    killed_and_replaced(Backend::Etcd, &etcd.endpoints());
}

/// One node of a 2-node `true` job on etcd (`backend`: etcd or etcd-v2), for the
/// cases that end before a round forms: exit code, stdout, stderr.
fn one_etcd_node(backend: &str, endpoints: &str, extra: &[&str]) -> (i32, String, String) {
    run(toporun()
        .args(["--nnodes=2", "--nproc-per-node=1"])
        .arg(format!("--rdzv-backend={backend}"))
        .arg(format!("--rdzv-endpoint={endpoints}"))
        .args(extra)
        .args(["--no-python", "true"])
        .current_dir(scripts()))
}

#[test]
fn etcd_unreachable_at_start_names_the_endpoints_and_gives_up_at_the_join_timeout() {
    let (p1, p2) = (free_port(), free_port());
    let (code, _, err) = one_etcd_node(
        "etcd-v2",
        &format!("127.0.0.1:{p1},http://127.0.0.1:{p2}"),
        &["--rdzv-conf=join_timeout=3"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{p1}")) && err.contains(&format!("127.0.0.1:{p2}")),
        "{err}"
    );
    assert!(err.contains("could not reach etcd within 3s"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn garbage_under_the_runs_keys_is_named_not_a_panic() {
    // etcd: another program wrote the run's round counter.
    let etcd = EtcdCluster::start(1);
    etcd.put("toporun/garbled/round", "banana");
    let (code, _, err) = one_etcd_node("etcd", &etcd.endpoints(), &["--rdzv-id=garbled"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("round counter") && err.contains("banana") && !err.contains("panicked"),
        "{err}"
    );
    // c10d: a client of the host's store writes the same key before a node joins.
    let endpoint = c10d_endpoint();
    let mut job = Job::new(Backend::C10d, &endpoint, "2", &[]);
    let mut host = job.node();
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    listening(port);
    let run_id = job.args[4].trim_start_matches("--rdzv-id=").to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c =
            toporun_agent::store::StoreClient::connect("127.0.0.1", port, Duration::from_secs(5))
                .await
                .unwrap();
        // After the host read the counter (it reads it once, at its join): written
        // before, the host itself stops on it and the other node hosts an empty store.
        let round = format!("toporun/{run_id}/round");
        c.wait(&[&round], Duration::from_secs(20)).await.unwrap();
        c.set(&round, b"\x1b[31mred").await.unwrap();
    });
    let mut other = job.node();
    let (code, _) = other.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "{}", other.stderr());
    assert!(
        other.stderr().contains("round counter") && !other.stderr().contains('\x1b'),
        "{}",
        other.stderr()
    );
    host.kill();
}

/// etcd over TLS with client certificates, as torchrun's --rdzv-conf names them.
#[test]
#[ignore = "needs etcd and PyTorch: run scripts/dev/test.sh"]
fn etcd_over_tls_with_client_certificates() {
    let etcd = EtcdCluster::start_tls();
    let tls = etcd.tls_dir();
    let conf = format!(
        "protocol=https,cacert={},cert={},key={},last_call_timeout=1,join_timeout=10",
        tls.join("ca.pem").display(),
        tls.join("client.pem").display(),
        tls.join("client-key.pem").display()
    );
    let mut job =
        Job::with_conf(Backend::Etcd, &etcd.endpoints(), "2", &conf, &[]).env("STEPS", "2");
    let mut nodes = [job.node(), job.node()];
    for n in &mut nodes {
        let (code, _) = n.wait(Duration::from_secs(90));
        assert_eq!(code, 0, "{}", n.stderr());
    }
    assert!(nodes[0].stderr().contains("https://127.0.0.1"));
    // Without the client certificate etcd refuses the handshake: said, and given up.
    let no_cert = format!(
        "protocol=https,cacert={},join_timeout=3",
        tls.join("ca.pem").display()
    );
    let (code, _, err) = one_etcd_node(
        "etcd",
        &etcd.endpoints(),
        &[&format!("--rdzv-conf={no_cert}")],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("could not reach etcd"), "{err}");
    // A certificate file that is not there: exit 2, named.
    let (code, _, err) = one_etcd_node(
        "etcd",
        &etcd.endpoints(),
        &["--rdzv-conf=protocol=https,cacert=/nonexistent/ca.pem"],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cacert /nonexistent/ca.pem"), "{err}");
}

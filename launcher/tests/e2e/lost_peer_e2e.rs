//! Peers lost with addresses of their own: nodes joined by a veth pair, one in a
//! network namespace the test makes (pyroute2 through launcher/tests/scripts/netns.py; needs root).
//! - The link is cut while the gloo ranks all-reduce: no connection is reset, the ranks
//!   just wait, and the keep-alives name the node that went away. Under
//!   `--exit-codes classified` both sides exit with the peer class.
//! - A node is killed: a node that did not coordinate the round names it from the
//!   address in its rank's error, through the table the coordinator published.

use crate::support;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// A network namespace joined to this one by a veth pair; removed on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn up(name: &str, here: &str, there: &str) -> Netns {
        let _ = netns(&["down", name]);
        let out = netns(&["up", name, here, there]);
        assert!(
            out.status.success(),
            "netns: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Netns { name: name.into() }
    }

    fn cut(&self) {
        assert!(netns(&["cut", &self.name]).status.success());
    }

    /// This side's end of the pair.
    fn host_if(&self) -> String {
        format!("v{}", self.name).chars().take(15).collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = netns(&["down", &self.name]);
    }
}

fn netns(args: &[&str]) -> std::process::Output {
    run_script("netns.py", args)
}

/// The job every node of a test runs.
struct Spec<'a> {
    nnodes: u32,
    keep_alive: &'a str,
    master: &'a str,
    port: u16,
    /// Where the ranks write their steps.
    out: &'a Path,
}

/// Node `rank` of the job, its ranks on interface `ifname`, in namespace `netns`.
fn node(spec: &Spec, rank: u32, ifname: &str, netns: Option<&str>) -> Child {
    let inner = toporun();
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/var/run/netns/{ns}"))
                .arg("--")
                .arg(inner.get_program());
            c
        }
        None => Command::new(inner.get_program()),
    };
    c.args([
        &format!("--nnodes={}", spec.nnodes),
        &format!("--node-rank={rank}"),
        &format!("--master-addr={}", spec.master),
        &format!("--master-port={}", spec.port),
        "--nproc-per-node=1",
        "--nccl-report=off",
        &format!("--rdzv-conf={}", spec.keep_alive),
        "--exit-codes=classified",
        "elastic_steps.py",
    ])
    .env("PROBE_OUT", spec.out)
    .env("STEPS", "600")
    .env("STEP_SECS", "0.1")
    .env("GLOO_SOCKET_IFNAME", ifname)
    .env("PYTHON_EXEC", python())
    .current_dir(scripts())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Waits until the ranks have taken 10 steps.
fn until_stepping(out: &Path) {
    let start = Instant::now();
    let stepping =
        || std::fs::read_to_string(out.join("steps")).is_ok_and(|s| s.lines().count() >= 10);
    while !stepping() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the job never stepped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_cut_link_is_named_as_the_node_that_went_away() {
    let d = tempfile::tempdir().unwrap();
    let name = format!("trc{}", std::process::id() % 100_000);
    let net = Netns::up(&name, "10.77.31.1", "10.77.31.2");
    let spec = Spec {
        nnodes: 2,
        keep_alive: "keep_alive_interval=1,keep_alive_max_attempt=2",
        master: "10.77.31.1",
        port: free_port(),
        out: d.path(),
    };
    let n0 = node(&spec, 0, &net.host_if(), None);
    let n1 = node(&spec, 1, "eth0", Some(&name));
    until_stepping(d.path());
    net.cut();
    let cut = Instant::now();
    let o0 = n0.wait_with_output().unwrap();
    let took = cut.elapsed();
    let o1 = n1.wait_with_output().unwrap();
    let took1 = cut.elapsed();
    let (e0, e1) = (
        String::from_utf8_lossy(&o0.stderr),
        String::from_utf8_lossy(&o1.stderr),
    );
    eprintln!("link cut: the survivor exited {took:.1?} later, the cut-off node {took1:.1?} later (its keep-alives unanswered for 10 s)");
    assert!(
        e0.contains("node 1") && e0.contains("stopped sending keep-alives"),
        "{e0}"
    );
    assert_eq!(o0.status.code(), Some(82), "{e0}");
    // The other side lost the store with the link: a peer lost too, said as soon as
    // its keep-alives went unanswered for as long as the host waits (at least 10 s),
    // not after the store's 60 s read timeout.
    assert_eq!(o1.status.code(), Some(82), "{e1}");
    assert!(e1.contains("did not answer within 10s"), "{e1}");
    assert!(e1.contains("or this node is cut off from it"), "{e1}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(took1 < Duration::from_secs(10 + 20), "{took1:?}");
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn a_killed_node_is_named_by_a_node_that_did_not_coordinate() {
    let d = tempfile::tempdir().unwrap();
    let name = format!("trk{}", std::process::id() % 100_000);
    let net = Netns::up(&name, "10.77.32.1", "10.77.32.2");
    // Keep-alives slow enough (6 s) that the ranks' own errors come first.
    let spec = Spec {
        nnodes: 3,
        keep_alive: "keep_alive_interval=2,keep_alive_max_attempt=3",
        master: "10.77.32.1",
        port: free_port(),
        out: d.path(),
    };
    let here = net.host_if();
    let n0 = node(&spec, 0, &here, None);
    let n1 = node(&spec, 1, &here, None);
    let mut n2 = node(&spec, 2, "eth0", Some(&name));
    until_stepping(d.path());
    n2.kill().unwrap();
    let _ = n2.wait();
    let (o0, o1) = (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    );
    let e1 = String::from_utf8_lossy(&o1.stderr);
    // Node 1's rank lost node 2 (10.77.32.2), or node 0 or 1 as that one went down
    // (10.77.32.1, both nodes there): named either way from the published table.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let who = |n: u32| format!("node {n} ({0}, {0})", host.trim());
    let named = e1
        .lines()
        .find(|l| l.contains("a rank lost a peer at 10.77.32."))
        .unwrap_or_else(|| panic!("no peer address in node 1's rank errors: {e1}"));
    let table = match named.contains("at 10.77.32.2:") {
        true => who(2),
        false => format!("one of {}, {}", who(0), who(1)),
    };
    assert!(named.contains(&format!(": {table}: ")), "{named}");
    for o in [&o0, &o1] {
        let e = String::from_utf8_lossy(&o.stderr);
        let lost = format!("{} stopped sending keep-alives", who(2));
        assert!(e.contains(&lost), "{e}");
        assert_eq!(o.status.code(), Some(82), "{e}");
    }
}

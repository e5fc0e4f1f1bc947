//! Multi-node faults and poisoned rendezvous data end in seconds, correctly, named,
//! with no rank left behind: a slow node, a frozen host, a black-holed store, forged
//! layouts and node descriptions, escape codes in a host name, duplicate node ranks,
//! nodes that disagree on --nnodes, and a host with net.ipv6.bindv6only=1. Loopback
//! only; ranks are shell commands.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;
use toporun_agent::store::StoreClient;

/// One static node of `nnodes` running `sh -c script` as its single rank.
fn node(nnodes: u32, rank: u32, port: u16, conf: &str, script: &str) -> Command {
    let mut c = toporun();
    c.args([
        &format!("--nnodes={nnodes}"),
        &format!("--node-rank={rank}"),
        "--master-addr=127.0.0.1",
        &format!("--master-port={port}"),
        "--nproc-per-node=1",
        "--rdzv-id=faults",
        &format!("--rdzv-conf={conf}"),
        "--nccl-report=off",
        "--no-python",
        "sh",
        "-c",
        script,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn wait(child: Child, limit: Duration) -> (i32, String, Duration) {
    let t = Instant::now();
    let mut child = child;
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Store operations from the test, as an attacker on the network would make them.
fn store<T>(port: u16, f: impl AsyncFnOnce(&mut StoreClient) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = StoreClient::connect("127.0.0.1", port, Duration::from_secs(10))
            .await
            .unwrap();
        f(&mut c).await
    })
}

/// A rank that records its pid, then runs `then` (`$$$$`: torchrun's substitution
/// turns `$$` into `$`).
fn pid_then(dir: &Path, name: &str, then: &str) -> String {
    format!("echo $$$$ > {}/{name}.pid; {then}", dir.display())
}

fn pid_of(dir: &Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

const FAST: &str = "keep_alive_interval=1,keep_alive_max_attempt=3,read_timeout=5,join_timeout=20";

#[test]
fn a_slow_node_finishes_its_work_and_both_nodes_exit_0() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let host = node(2, 0, port, FAST, "true").spawn().unwrap();
    let slow = node(
        2,
        1,
        port,
        FAST,
        &format!("sleep 8; touch {}/slow-done", d.path().display()),
    )
    .spawn()
    .unwrap();
    let (c0, e0, _) = wait(host, Duration::from_secs(60));
    let (c1, e1, _) = wait(slow, Duration::from_secs(60));
    assert_eq!((c0, c1), (0, 0), "host:\n{e0}\nslow node:\n{e1}");
    assert!(d.path().join("slow-done").exists());
}

#[test]
fn a_frozen_host_is_detected_within_the_read_timeout() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let host = node(
        2,
        0,
        port,
        FAST,
        &pid_then(d.path(), "host-rank", "sleep 120"),
    )
    .spawn()
    .unwrap();
    let other = node(
        2,
        1,
        port,
        FAST,
        &pid_then(d.path(), "rank1", "sleep 3; exit 1"),
    )
    .spawn()
    .unwrap();
    let t = Instant::now();
    while pid_of(d.path(), "rank1").is_none() || pid_of(d.path(), "host-rank").is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            let (_, e0, _) = wait(host, Duration::from_millis(1));
            let (_, e1, _) = wait(other, Duration::from_millis(1));
            panic!("ranks never started\nhost:\n{e0}\nnode 1:\n{e1}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let host_pid = nix::unistd::Pid::from_raw(host.id() as i32);
    nix::sys::signal::kill(host_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The rank fails 3 s in; read_timeout is 5 s: out within 3 + 5 + 5 s.
    let (code, err, took) = wait(other, Duration::from_secs(40));
    nix::sys::signal::kill(host_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let mut host = host;
    let _ = host.kill();
    let _ = host.wait();
    assert_eq!(code, 1, "{err}");
    assert!(
        took < Duration::from_secs(13),
        "the node took {took:?}:\n{err}"
    );
    eprintln!("frozen host: the other node exited {took:?} after the freeze (its rank failed 3 s in, read_timeout 5 s)");
    std::thread::sleep(Duration::from_millis(500));
    for name in ["host-rank", "rank1"] {
        let pid = pid_of(d.path(), name).unwrap();
        assert!(!alive(pid), "{name} (pid {pid}) was left running");
    }
}

#[test]
fn a_black_holed_store_is_given_up_at_the_join_timeout() {
    // Accepts connections (the kernel does) but never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let n = node(2, 1, port, "join_timeout=4", "true").spawn().unwrap();
    let (code, err, took) = wait(n, Duration::from_secs(30));
    assert_ne!(code, 0);
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    drop(hole);
}

#[test]
fn a_forged_layout_is_refused_by_name_and_leaves_no_rank() {
    // Three static nodes, the third never comes: node 1 has joined and waits for the
    // round to close when an attacker closes it with a forged layout.
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let host = node(
        3,
        0,
        port,
        FAST,
        &pid_then(d.path(), "host-rank", "sleep 120"),
    )
    .spawn()
    .unwrap();
    listening(port);
    let victim = node(
        3,
        1,
        port,
        FAST,
        &format!("touch {}/victim-ran", d.path().display()),
    )
    .spawn()
    .unwrap();
    store(port, async |c| {
        c.wait(&["toporun/faults/r0/node/1"], Duration::from_secs(20))
            .await
            .unwrap();
        // Well-formed values (toporun's own encoding), a place that cannot be.
        c.set(
            "toporun/faults/r0/layout/1",
            br#"{"node_rank":1,"offset":0,"world":2,"nnodes":4000000000}"#,
        )
        .await
        .unwrap();
        c.set("toporun/faults/r0/env/1", b"{}").await.unwrap();
        c.set("toporun/faults/r0/closed", br#"{"nodes":3}"#)
            .await
            .unwrap();
    });
    let (code, err, _) = wait(victim, Duration::from_secs(30));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("toporun/faults/r0/layout/1 holds"), "{err}");
    assert!(!d.path().join("victim-ran").exists());
    // The host never gets its round (its rank never starts) and gives up.
    let (code, err, _) = wait(host, Duration::from_secs(40));
    assert_eq!(code, 1, "{err}");
    std::thread::sleep(Duration::from_millis(500));
    if let Some(pid) = pid_of(d.path(), "host-rank") {
        assert!(!alive(pid), "the host's rank was left running");
    }
}

#[test]
fn a_forged_node_description_stops_the_round_for_everyone() {
    let port = free_port();
    let host = node(2, 0, port, FAST, "sleep 120").spawn().unwrap();
    listening(port);
    store(port, async |c| {
        let forged = br#"{"node_rank":1,"hostname":"x","addr":"x","nproc":4294967295,"gpus":0,"boot_id":null,"ipc_ns":null,"net_ns":null}"#;
        c.set("toporun/faults/r0/node/1", forged).await.unwrap();
        c.add("toporun/faults/r0/join", 1).await.unwrap();
    });
    let (code, err, took) = wait(host, Duration::from_secs(30));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("says it runs 4294967295 ranks"), "{err}");
    assert!(took < Duration::from_secs(15), "{took:?}");
}

#[test]
fn escape_codes_in_a_host_name_never_reach_the_terminal() {
    let d = tempfile::tempdir().unwrap();
    let mut facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(host("h200x4")).unwrap()).unwrap();
    facts["container"]["hostname"] = "\u{1b}[2J\u{1b}[31mEVIL".into();
    let forged = d.path().join("facts.json");
    std::fs::write(&forged, facts.to_string()).unwrap();
    let port = free_port();
    let host = node(2, 0, port, FAST, "true").spawn().unwrap();
    // Node 1 replays the forged facts (a global option, before the launch's own).
    let args: Vec<String> = node(2, 1, port, FAST, "true")
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let evil = toporun()
        .arg("--facts")
        .arg(&forged)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (c0, e0, _) = wait(host, Duration::from_secs(30));
    let (c1, e1, _) = wait(evil, Duration::from_secs(30));
    assert_eq!((c0, c1), (1, 1), "host:\n{e0}\nnode 1:\n{e1}");
    assert!(!e0.contains('\u{1b}') && !e1.contains('\u{1b}'));
    assert!(e0.contains("unusable host name"), "{e0}");
    assert!(e1.contains("refused the round"), "{e1}");
}

#[test]
fn duplicate_node_ranks_are_named_and_the_job_runs() {
    let port = free_port();
    let host = node(2, 0, port, FAST, "sleep 2").spawn().unwrap();
    listening(port);
    let a = node(2, 1, port, FAST, "sleep 2").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let b = node(2, 1, port, FAST, "sleep 2").spawn().unwrap();
    let (ch, eh, _) = wait(host, Duration::from_secs(40));
    let (ca, ea, _) = wait(a, Duration::from_secs(40));
    let (cb, eb, _) = wait(b, Duration::from_secs(40));
    assert_eq!(ch, 0, "{eh}");
    let mut codes = [ca, cb];
    codes.sort();
    assert_eq!(codes, [0, 1], "node a:\n{ea}\nnode b:\n{eb}");
    let loser = if ca == 1 { ea } else { eb };
    assert!(loser.contains("node rank 1 is already taken by"), "{loser}");
}

#[test]
fn nodes_that_disagree_on_nnodes_are_named() {
    let port = free_port();
    let host = node(2, 0, port, FAST, "true").spawn().unwrap();
    listening(port);
    let other = node(3, 1, port, FAST, "true").spawn().unwrap();
    let (ch, eh, _) = wait(host, Duration::from_secs(30));
    let (co, eo, _) = wait(other, Duration::from_secs(30));
    assert_eq!((ch, co), (1, 1), "host:\n{eh}\nother:\n{eo}");
    assert!(
        eh.contains("--nnodes=3 but the host runs with --nnodes=2"),
        "{eh}"
    );
    assert!(eo.contains("refused the round"), "{eo}");
}

#[test]
fn bindv6only_hosts_run_two_node_jobs() {
    if !can_unshare_uts("bindv6only_hosts_run_two_node_jobs") {
        return;
    }
    let port = free_port();
    let bin = env!("CARGO_BIN_EXE_toporun");
    let one = |rank: u32| {
        format!("{bin} --nnodes=2 --node-rank={rank} --master-addr=127.0.0.1 --master-port={port} --nproc-per-node=1 --nccl-report=off --no-python true")
    };
    let script = format!(
        "ip link set lo up && echo 1 > /proc/sys/net/ipv6/bindv6only && {{ {} & {} ; b=$?; wait $!; a=$?; exit $((a + b)); }}",
        one(0),
        one(1)
    );
    let out = Command::new("unshare")
        .args(["-n", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn with_a_token_a_forged_layout_cannot_reach_the_nodes() {
    let d = tempfile::tempdir().unwrap();
    let port = free_port();
    let conf = format!("{FAST},token=s3cret");
    let host = node(2, 0, port, &conf, "true").spawn().unwrap();
    listening(port);
    // Written where a node without the token would look: ignored by these nodes.
    store(port, async |c| {
        c.set("toporun/faults/r0/closed", b"2").await.unwrap();
        c.set("toporun/faults/r0/layout/1", b"1,0,2,4000000000")
            .await
            .unwrap();
        c.set("toporun/faults/r0/env/1", b"{}").await.unwrap();
    });
    let n1 = node(
        2,
        1,
        port,
        &conf,
        &format!("touch {}/ran", d.path().display()),
    )
    .spawn()
    .unwrap();
    let (c0, e0, _) = wait(host, Duration::from_secs(40));
    let (c1, e1, _) = wait(n1, Duration::from_secs(40));
    assert_eq!((c0, c1), (0, 0), "host:\n{e0}\nnode 1:\n{e1}");
    assert!(d.path().join("ran").exists());
    assert!(
        !e0.contains("s3cret") && !e1.contains("s3cret"),
        "the token was printed"
    );
}

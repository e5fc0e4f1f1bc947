//! Two toporun nodes on this machine, node 1 in its own UTS namespace (another
//! hostname) and, over a veth pair, its own network namespace: like two pods of one job
//! on one host sharing /dev/shm. With `--colocated join` both nodes' ranks get one
//! NCCL_HOSTID (and NCCL_CUMEM_ENABLE=0 across network namespaces); with `warn` only
//! the finding. Needs root for the namespaces; says so and skips otherwise.

use crate::support;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::*;

const SHOW: &str = "echo HOSTID=${NCCL_HOSTID:-none} CUMEM=${NCCL_CUMEM_ENABLE:-none}";

/// A network namespace with a veth pair to this one: 10.77.<n>.1 here, .2 there.
struct Netns {
    name: String,
    here: String,
}

impl Netns {
    fn create(tag: u8) -> Option<Netns> {
        let name = format!("trn{}-{tag}", std::process::id());
        let here = format!("10.77.{tag}.1");
        let host_if = format!("tra{tag}{}", std::process::id() % 10000);
        let cmds = [
            format!("ip netns add {name}"),
            format!("ip link add {host_if} type veth peer name eth0 netns {name}"),
            format!("ip addr add {here}/24 dev {host_if}"),
            format!("ip link set {host_if} up"),
            format!("ip -n {name} addr add 10.77.{tag}.2/24 dev eth0"),
            format!("ip -n {name} link set eth0 up"),
            format!("ip -n {name} link set lo up"),
        ];
        for c in &cmds {
            let ok = Command::new("sh")
                .args(["-c", c])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                skip(
                    "network namespaces",
                    &format!("`{c}` failed (needs root and iproute2)"),
                );
                let _ = Command::new("ip").args(["netns", "del", &name]).status();
                return None;
            }
        }
        Some(Netns { name, here })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs node 0 here and node 1 through `wrap` (namespaces); returns both outputs.
fn two_nodes(master: &str, wrap: &[&str], mode: &str) -> [(i32, String); 2] {
    let port = free_port();
    let args = |rank: u32| -> Vec<String> {
        vec![
            "--nnodes=2".into(),
            format!("--node-rank={rank}"),
            format!("--master-addr={master}"),
            format!("--master-port={port}"),
            "--nproc-per-node=1".into(),
            format!("--colocated={mode}"),
            "--rdzv-conf=join_timeout=20".into(),
            "--no-python".into(),
            "sh".into(),
            "-c".into(),
            SHOW.into(),
        ]
    };
    let bin = env!("CARGO_BIN_EXE_toporun");
    let n0 = toporun()
        .args(args(0))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c1 = Command::new(wrap[0]);
    c1.args(&wrap[1..]).arg(bin).args(args(1));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("PET_"))
    {
        c1.env_remove(k);
    }
    let n1 = c1
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let done = |c: std::process::Child| {
        let start = std::time::Instant::now();
        let mut c = c;
        while c.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(40) {
                let _ = c.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = c.wait_with_output().unwrap();
        (
            o.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    [done(n0), done(n1)]
}

fn rank_line(out: &str) -> &str {
    out.lines()
        .find(|l| l.contains("HOSTID="))
        .unwrap_or_else(|| panic!("no rank output:\n{out}"))
}

#[test]
fn pods_in_their_own_network_and_uts_namespaces_are_joined() {
    let Some(ns) = Netns::create(1) else { return };
    let wrap = [
        "ip",
        "netns",
        "exec",
        &ns.name,
        "unshare",
        "--uts",
        "sh",
        "-c",
        "hostname otherpod-1 && exec \"$0\" \"$@\"",
    ];
    let [(c0, o0), (c1, o1)] = two_nodes(&ns.here, &wrap, "join");
    assert_eq!((c0, c1), (0, 0), "{o0}\n---\n{o1}");
    for o in [&o0, &o1] {
        let l = rank_line(o);
        assert!(
            l.contains("HOSTID=toporun-") && l.contains("CUMEM=0"),
            "{l}\n{o}"
        );
        assert!(
            o.contains("toporun: co-location: NCCL_CUMEM_ENABLE=0 NCCL_HOSTID=toporun-"),
            "{o}"
        );
    }
    assert_eq!(
        rank_line(&o0).split_whitespace().last(),
        rank_line(&o1).split_whitespace().last()
    );
    assert!(
        o0.contains("info: rdzv.colocated") && o0.contains("P2P/IPC"),
        "{o0}"
    );

    let [(c0, o0), (c1, o1)] = two_nodes(&ns.here, &wrap, "warn");
    assert_eq!((c0, c1), (0, 0), "{o0}\n---\n{o1}");
    for o in [&o0, &o1] {
        assert!(rank_line(o).contains("HOSTID=none CUMEM=none"), "{o}");
    }
    assert!(
        o0.contains("warning: rdzv.colocated") && o0.contains("separate hosts"),
        "{o0}"
    );
    assert!(o0.contains("--colocated join"), "{o0}");
}

#[test]
fn another_hostname_alone_is_joined_by_host_id_only() {
    // Measured: own hostname + the same NCCL_HOSTID in one network namespace runs
    // P2P/CUMEM at full speed: cuMem stays on.
    let wrap = [
        "unshare",
        "--uts",
        "sh",
        "-c",
        "hostname otherpod-2 && exec \"$0\" \"$@\"",
    ];
    if !can_unshare_uts("another_hostname_alone_is_joined_by_host_id_only") {
        return;
    }
    let [(c0, o0), (c1, o1)] = two_nodes("127.0.0.1", &wrap, "join");
    assert_eq!((c0, c1), (0, 0), "{o0}\n---\n{o1}");
    for o in [&o0, &o1] {
        let l = rank_line(o);
        assert!(
            l.contains("HOSTID=toporun-") && l.contains("CUMEM=none"),
            "{l}"
        );
    }
    assert!(o0.contains("P2P/CUMEM"), "{o0}");
}

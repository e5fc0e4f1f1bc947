//! The network check's torch probe (agent/src/network_check/torch_probe.py) under
//! real gloo, two processes on loopback (real PyTorch from the cached virtualenv,
//! scripts/dev/setup_venv.sh), both sides the probe's own: a sender whose process
//! pauses 100 ms before the first chunk (a busy host's scheduling) must not end the path on that chunk at a tenth of
//! the link's rate.

use std::net::TcpListener;
use std::process::{Command, Output};

mod common;
use common::python;

/// Rank 1 receives with the probe's own `receive`, rank 0 sends with its own `send`,
/// its process sleeping PAUSE before the first chunk (any send larger than the flag).
const PAIR: &str = r#"
import importlib.util, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
path, rank, port, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
spec = importlib.util.spec_from_file_location("torch_probe", path)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, timeout=timedelta(seconds=30))
dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
link = probe.Link(torch, dist, torch.device("cpu"))
if rank == 1:
    probe.receive(link, 0, {"from": 0, "to": 1})
else:
    send = link.send
    def paused_once(t, peer):
        global pause
        if t.numel() > 1:
            time.sleep(pause)
            pause = 0.0
        send(t, peer)
    link.send = paused_once
    probe.send(link, 1)
dist.destroy_process_group()
"#;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The receiver's figure (Gbit/s) with the sender pausing `pause_s` once.
fn figure(pause_s: f64) -> f64 {
    let probe = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/network_check/torch_probe.py"
    );
    let port = free_port().to_string();
    let rank = |r: &str| {
        Command::new(python())
            .args(["-c", PAIR, probe, r, &port, &pause_s.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the venv python (scripts/dev/setup_venv.sh)")
    };
    let (sender, receiver) = (rank("0"), rank("1"));
    let done = |c: std::process::Child| -> Output { c.wait_with_output().unwrap() };
    let (s, r) = (done(sender), done(receiver));
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(
        s.status.success() && r.status.success(),
        "sender: {}\nreceiver: {text}{}",
        String::from_utf8_lossy(&s.stderr),
        String::from_utf8_lossy(&r.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("\"kind\": \"path\""))
        .unwrap_or_else(|| panic!("no figure: {text}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["gbit"].as_f64().unwrap()
}

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn one_pause_of_the_sender_does_not_make_the_path_slow() {
    // 256 KiB over 100 ms is 0.02 Gbit/s; gloo on loopback moves Gbit/s.
    let paused = figure(0.1);
    assert!(paused > 0.2, "{paused} Gbit/s");
    let steady = figure(0.0);
    assert!(steady > 0.2, "{steady} Gbit/s");
}

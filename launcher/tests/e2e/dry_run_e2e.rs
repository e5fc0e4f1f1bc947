//! `launch --dry-run` on every fixture host and capture: golden plans (reviewed by
//! hand; UPDATE_GOLDEN=1 rewrites them), formats, and speed.

use crate::support;
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

const HOSTS: &[&str] = &[
    "h200x4",
    "p4d.24xlarge",
    "p5.48xlarge",
    "g6e.12xlarge",
    "broken-shm-64mib",
    "broken-efa-no-ipc-lock",
    "broken-fabric-not-started",
    "broken-1-of-8-gpus",
    "broken-p2p-not-supported",
    "broken-k8s-nccl-env",
];
const CAPTURES: &[&str] = &[
    "h200x4",
    "p4d.24xlarge",
    "p5.48xlarge",
    "g6e.12xlarge",
    "dgx1-v100",
    "dgx-a100",
    "dgx2-16gpu",
    "pcie-mlx4-8gpu",
];

fn dry(args: &[&str]) -> (i32, String, String) {
    dry_with(args, &[])
}

/// A dry run with variables of the launching environment.
fn dry_with(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    run(toporun()
        .args(["launch", "--dry-run"])
        .args(args)
        .arg("train.py")
        .envs(env.iter().copied())
        .current_dir(scripts()))
}

fn golden(name: &str, got: &str) {
    let path = fixtures().join("golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "{} missing: run with UPDATE_GOLDEN=1 and review it",
            path.display()
        )
    });
    assert_eq!(got, want, "{name} differs from its golden file");
}

#[test]
fn plans_for_every_fixture_host() {
    for h in HOSTS {
        let (code, out, err) = dry(&[
            "--facts",
            &host(h),
            "--format",
            "shell",
            "--nproc-per-node=gpu",
        ]);
        assert_eq!(code, 0, "{h}: {err}");
        golden(&format!("plan-{h}.sh"), &out);
    }
}

#[test]
fn plans_for_every_topology_capture() {
    for c in CAPTURES {
        let cap = fixtures().join("topo").join(format!("{c}.txt"));
        let (code, out, err) = dry(&[
            "--facts",
            &host("h200x4"),
            "--nvidia-smi-topo",
            cap.to_str().unwrap(),
            "--format",
            "shell",
            "--nproc-per-node=gpu",
        ]);
        assert_eq!(code, 0, "{c}: {err}");
        golden(&format!("plan-topo-{c}.sh"), &out);
    }
}

#[test]
fn shell_output_is_sourceable() {
    for h in HOSTS {
        let (_, out, _) = dry(&["--facts", &host(h), "--format", "shell"]);
        let st = std::process::Command::new("bash")
            .args(["-n", "-c", &out])
            .status()
            .unwrap();
        assert!(st.success(), "{h}: bash -n failed on\n{out}");
    }
}

#[test]
fn env_format_lists_every_nccl_variable_ranks_get() {
    let (_, out, _) = dry(&["--facts", &host("broken-k8s-nccl-env"), "--format", "env"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"NCCL_P2P_LEVEL=NVL"), "{out}");
    assert!(
        lines.contains(&"NCCL_P2P_DIRECT_WRITE=1"),
        "user values are kept: {out}"
    );
    assert!(lines.contains(&"NCCL_SOCKET_IFNAME==eth0"), "{out}");
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with("NCCL_") || l.starts_with("FI_")),
        "{out}"
    );
}

/// One node is node 0 of 1 whatever `--node-rank` says, as the launch runs it (the
/// dry run used the option and panicked on an index past the one node).
#[test]
fn node_rank_on_one_node_is_node_0_as_the_launch_runs_it() {
    let facts = host("h200x4");
    for extra in [
        &[][..],
        &["--rdzv-backend=c10d", "--rdzv-endpoint=localhost:29400"],
    ] {
        let args = [
            &["--facts", &facts, "--nproc-per-node=2", "--node-rank=1"][..],
            extra,
        ]
        .concat();
        let (code, out, err) = dry(&args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(out.contains("local rank 1 (rank 1)"), "{out}");
        assert!(
            out.contains("  GROUP_RANK=0\n") && out.contains("  WORLD_SIZE=2\n"),
            "{out}"
        );
    }
}

#[test]
fn text_shows_findings_plan_and_every_rank() {
    let (code, out, _) = dry(&[
        "--facts",
        &host("broken-k8s-nccl-env"),
        "--nproc-per-node=4",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
    ]);
    assert_eq!(code, 0);
    assert!(
        out.contains("NCCL_P2P_DIRECT_WRITE is not an NCCL variable"),
        "{out}"
    );
    assert!(
        out.contains("NCCL_P2P_LEVEL=NVL") && out.contains("[user]"),
        "{out}"
    );
    for r in 0..4 {
        assert!(
            out.contains(&format!("local rank {r} (rank {})", 4 + r)),
            "{out}"
        );
    }
    assert!(
        out.contains("WORLD_SIZE=8")
            && out.contains("GROUP_RANK=1")
            && out.contains("MASTER_ADDR=10.0.0.1"),
        "{out}"
    );
    // The interpreter is resolved to an absolute path, as torchrun's sys.executable.
    assert!(
        out.lines().any(|l| l.trim_start().starts_with("command: /")
            && l.ends_with("python3 -u train.py")),
        "{out}"
    );
    let (_, out, _) = dry(&[
        "--facts",
        &host("h200x4"),
        "--nproc-per-node=2",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=head:29400",
    ]);
    assert!(out.contains("rank assigned at rendezvous"), "{out}");
}

/// The dry run says what will carry the network check's probes: the ranks' NCCL
/// where they use GPUs, TCP between the agents where asked or without GPUs.
#[test]
fn the_network_check_line_says_what_carries_the_probes() {
    let line = |extra: &[&str], env: &[(&str, &str)]| {
        let gpus = host("h200x4");
        let mut args = vec!["--facts", &gpus, "--nproc-per-node=2", "--nnodes=2"];
        args.extend(["--node-rank=0", "--master-addr=10.0.0.1"]);
        args.extend(extra);
        let (code, out, err) = dry_with(&args, env);
        assert_eq!(code, 0, "{err}");
        let l = out.lines().find(|l| l.starts_with("network check: "));
        l.unwrap_or_else(|| panic!("{out}")).to_string()
    };
    let nccl = line(&[], &[]);
    assert!(
        nccl.contains("through the ranks' torch (nccl, one process per node"),
        "{nccl}"
    );
    let tcp = line(&["--network-check-path=tcp"], &[]);
    assert!(
        tcp.contains("over TCP between the agents") && tcp.contains("--network-check-path tcp"),
        "{tcp}"
    );
    // No GPU visible: gloo ranks, measured over TCP unless torch is asked for.
    let cpu = line(&["--network-check=gate"], &[("CUDA_VISIBLE_DEVICES", "")]);
    assert!(cpu.starts_with("network check: gate"), "{cpu}");
    assert!(cpu.contains("its ranks do not use GPUs"), "{cpu}");
    let gloo = line(
        &["--network-check-path=torch"],
        &[("CUDA_VISIBLE_DEVICES", "")],
    );
    assert!(gloo.contains("through the ranks' torch (gloo"), "{gloo}");
}

#[test]
fn user_warnings_fire_for_the_harmful_settings_measured() {
    let (_, out, _) = run(toporun()
        .args([
            "launch",
            "--dry-run",
            "--facts",
            &host("h200x4"),
            "--format",
            "json",
            "t.py",
        ])
        .env("NCCL_P2P_DISABLE", "1")
        .env("NCCL_PROTO", "Simple"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = v["findings"].to_string();
    assert!(
        text.contains("27.5 GB/s") && text.contains("6.6x slower"),
        "{text}"
    );
    let level = v["plan"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "NCCL_P2P_LEVEL")
        .unwrap();
    assert_eq!(level["source"], "user");
    let proto = v["plan"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "NCCL_PROTO")
        .unwrap();
    assert_eq!(proto["value"], "Simple");
}

#[test]
fn nccl_env_off_plans_nothing() {
    let (_, out, _) = dry(&[
        "--facts",
        &host("h200x4"),
        "--nccl-env=off",
        "--format",
        "env",
    ]);
    assert!(
        !out.contains("NCCL_P2P_LEVEL") && !out.contains("SOCKET_IFNAME"),
        "{out}"
    );
}

/// Every rank gets the flight recorder's variables and, where toporun serves it, the
/// file timer's path: the dry run said "the complete environment" without them.
#[test]
fn the_flight_recorder_and_the_file_timer_are_in_every_ranks_environment() {
    let (code, out, _) = dry(&["--facts", &host("h200x4"), "--nproc-per-node=2"]);
    assert_eq!(code, 0);
    for var in [
        "TORCH_FR_DUMP_TEMP_FILE=<run dir>/attempt_0/fr/rank_",
        "TORCH_FR_BUFFER_SIZE=",
        "TORCH_NCCL_DUMP_ON_TIMEOUT=",
    ] {
        assert_eq!(out.matches(var).count(), 2, "{var}: {out}");
    }
    assert!(!out.contains("TORCHELASTIC_TIMER_FILE"), "{out}");
    let host = host("h200x4");
    let args = ["--facts", &host, "--nproc-per-node=2"];
    let (_, out, _) = dry_with(&args, &[("TORCHELASTIC_ENABLE_FILE_TIMER", "1")]);
    assert_eq!(
        out.matches("TORCHELASTIC_TIMER_FILE=<$TMPDIR/watchdog_timer_")
            .count(),
        2,
        "{out}"
    );
    // A prefix of the user's own is theirs: toporun adds none of its settings.
    let (_, out, _) = dry_with(&args, &[("TORCH_FR_DUMP_TEMP_FILE", "/data/fr/rank_")]);
    assert!(!out.contains("<run dir>/attempt_0/fr/rank_"), "{out}");
}

/// `--nccl-profiler`: on by default, every GPU rank loads the plugin built beside the
/// binary and counts into its own file; nothing of the dump pipe then (no
/// TORCH_NCCL_TRACE_BUFFER_SIZE: torch 2.11 warns of it on every rank); the user's
/// own plugin is kept and said; a job without GPUs gets nothing.
/// `host`'s facts with its /dev/shm all but full (1 MiB free), in a file of their own.
fn host_with_full_shm(host: &str) -> tempfile::NamedTempFile {
    host_edited(host, |facts| {
        facts["container"]["shm"]["free_bytes"] = serde_json::json!(1u64 << 20)
    })
}

/// `host`'s facts as `edit` leaves them, in a file of their own.
fn host_edited(host: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::NamedTempFile {
    let mut facts: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(host).unwrap()).unwrap();
    edit(&mut facts);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), facts.to_string()).unwrap();
    f
}

#[test]
fn the_nccl_profiler_is_loaded_by_every_gpu_rank_unless_the_user_has_one() {
    let (_dir, bin) = installed_with_plugin();
    let dry = |args: &[&str], env: &[(&str, &str)]| {
        run(toporun_at(&bin)
            .args(["launch", "--dry-run"])
            .args(args)
            .arg("train.py")
            .envs(env.iter().copied())
            .current_dir(scripts()))
    };
    let host = host("h200x4");
    let on = ["--facts", &host, "--nproc-per-node=2"];
    let (code, out, _) = dry(&on, &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("NCCL counters: in memory (tmpfs), one file a rank: /dev/shm/toporun-<run dir>/attempt_0/rank_<rank>"),
        "{out}"
    );
    // A /dev/shm that is full: the counters are off, with the fix.
    let small = host_with_full_shm(&host);
    let (code, full, _) = dry(
        &[
            "--facts",
            small.path().to_str().unwrap(),
            "--nproc-per-node=2",
        ],
        &[],
    );
    assert_eq!(code, 0);
    assert!(full.contains("NCCL counters: /dev/shm has "), "{full}");
    assert!(full.contains("--shm-size"), "{full}");
    assert!(!full.contains("TOPORUN_NCCL_COUNTERS="), "{full}");
    let plugin = bin.with_file_name(PLUGIN).canonicalize().unwrap();
    let var = format!("  NCCL_PROFILER_PLUGIN={}\n", plugin.display());
    assert_eq!(out.matches(&var).count(), 2, "{out}");
    // The counters on the memory file system (the fixture's /dev/shm is tmpfs), never
    // the run directory.
    for rank in 0..2 {
        let counters =
            format!("  TOPORUN_NCCL_COUNTERS=/dev/shm/toporun-<run dir>/attempt_0/rank_{rank}\n");
        assert!(out.contains(&counters), "{out}");
    }
    assert!(
        out.contains("NCCL's own counters: the ranks load toporun's profiler plugin"),
        "{out}"
    );
    assert!(
        out.contains("GPU timing: off (NCCL's own counters time the collectives"),
        "{out}"
    );
    assert!(!out.contains("TORCH_NCCL_TRACE_BUFFER_SIZE"), "{out}");
    assert!(!out.contains("TORCH_NCCL_ENABLE_TIMING"), "{out}");
    assert!(
        out.contains("NCCL times bursts of 8 operations on the GPU, about one every 500 ms"),
        "{out}"
    );
    let (_, out, _) = dry(&on, &[("TOPORUN_NCCL_KERNEL_SAMPLING", "all")]);
    assert!(
        out.contains("NCCL times every operation on the GPU"),
        "{out}"
    );
    let (code, _, err) = dry(&on, &[("TOPORUN_NCCL_KERNEL_SAMPLING", "1/2/3")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("TOPORUN_NCCL_KERNEL_SAMPLING=1/2/3: say all, off, or BURST/PERIOD_MS"),
        "{err}"
    );
    let (_, out, _) = dry(
        &on,
        &[("NCCL_PROFILER_PLUGIN", "/opt/comma/libnccl-profiler.so")],
    );
    assert!(
        out.contains("your NCCL_PROFILER_PLUGIN=/opt/comma/libnccl-profiler.so is kept"),
        "{out}"
    );
    assert!(!out.contains("TOPORUN_NCCL_COUNTERS"), "{out}");
    assert!(
        out.contains("GPU timing: on, a dump every 5s"),
        "the dumps time the GPUs: {out}"
    );
    let cpu = ["--facts", &support::host("h200x4"), "--nproc-per-node=2"];
    let (_, out, _) = dry(&cpu, &[("CUDA_VISIBLE_DEVICES", "")]);
    assert!(!out.contains("NCCL_PROFILER_PLUGIN"), "{out}");
    // The binary alone (a `cargo install` of the launcher): the dry run says where
    // it looked.
    let alone = tempfile::tempdir().unwrap();
    std::fs::copy(&bin, alone.path().join("toporun")).unwrap();
    let (_, out, _) = run(toporun_at(&alone.path().join("toporun"))
        .args(["launch", "--dry-run"])
        .args(on)
        .arg("train.py")
        .current_dir(scripts()));
    assert!(
        out.contains("libtoporun_nccl_profiler.so is not installed beside toporun (looked in"),
        "{out}"
    );
    assert!(
        out.contains("GPU timing: on, a dump every 5s"),
        "the dumps time the GPUs then: {out}"
    );
}

const PLUGIN: &str = "libtoporun_nccl_profiler.so";

/// Facts of `host` changed by `edit`, written to a file in `dir`.
fn facts_edited(
    dir: &std::path::Path,
    host: &str,
    edit: impl Fn(&mut serde_json::Value),
) -> String {
    let text = std::fs::read_to_string(support::host(host)).unwrap();
    let mut facts: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut facts);
    let path = dir.join("facts.json");
    std::fs::write(&path, facts.to_string()).unwrap();
    path.display().to_string()
}

/// An NCCL too old to load a profiler plugin gets none, and the dump timing stands;
/// a plugin and a P2P level set in /etc/nccl.conf are the user's (NCCL applies them
/// unless the environment sets the names): kept, and said where they are set.
#[test]
fn an_old_nccl_and_nccl_conf_settings_are_respected() {
    let (dir, bin) = installed_with_plugin();
    let dry = |facts: &str| {
        run(toporun_at(&bin)
            .args([
                "launch",
                "--dry-run",
                "--facts",
                facts,
                "--nproc-per-node=2",
            ])
            .arg("train.py")
            .current_dir(scripts()))
    };
    let old = facts_edited(dir.path(), "h200x4", |f| {
        f["platform"]["nccl_version"] = "2.21.5".into();
    });
    let (code, out, err) = dry(&old);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("NCCL's own counters: off, the ranks' NCCL 2.21.5 has no profiler plugin API v5 (2.28.3 or later"),
        "{out}"
    );
    assert!(!out.contains("NCCL_PROFILER_PLUGIN="), "{out}");
    assert!(out.contains("GPU timing: on, a dump every 5s"), "{out}");
    let conf = facts_edited(dir.path(), "h200x4", |f| {
        f["platform"]["nccl_conf"] = serde_json::json!({
            "NCCL_PROFILER_PLUGIN": "/opt/az/libnccl-profiler.so",
            "NCCL_P2P_LEVEL": "SYS",
            "NCCL_ALGO": "Ring\r",
            "NCCL_DEBUG": "WARN",
        });
        f["platform"]["nccl_conf_files"] = serde_json::json!(["/etc/nccl.conf"]);
    });
    let (code, out, err) = dry(&conf);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("your NCCL_PROFILER_PLUGIN=/opt/az/libnccl-profiler.so is kept"),
        "{out}"
    );
    assert!(!out.contains("TOPORUN_NCCL_COUNTERS"), "{out}");
    assert!(
        out.contains("set in /etc/nccl.conf, kept (toporun would have set NVL"),
        "{out}"
    );
    assert!(!out.contains("  NCCL_P2P_LEVEL=NVL\n"), "{out}");
    // NCCL_DEBUG in the file is the user's: the report follows no file of toporun's.
    assert!(
        out.contains("NCCL report: off (NCCL_DEBUG=WARN set by you without NCCL_DEBUG_FILE"),
        "{out}"
    );
    assert!(!out.contains("  NCCL_DEBUG=INFO\n"), "{out}");
    // A CRLF file's value: shown escaped, and said.
    assert!(out.contains("  NCCL_ALGO=Ring\\r "), "{out}");
    assert!(
        out.contains("NCCL_ALGO's value in /etc/nccl.conf ends in a carriage return"),
        "{out}"
    );
    // Sourced, the plan leaves the file's values to NCCL: an export would pin them.
    let (code, out, err) = run(toporun_at(&bin)
        .args(["launch", "--dry-run", "--format", "shell", "--facts", &conf])
        .args(["--nproc-per-node=2", "train.py"])
        .current_dir(scripts()));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("\n# NCCL_P2P_LEVEL=SYS  # user: set in /etc/nccl.conf"),
        "{out}"
    );
    assert!(!out.contains("export NCCL_P2P_LEVEL"), "{out}");
    let (code, out, err) = run(toporun_at(&bin)
        .args(["launch", "--dry-run", "--format", "env", "--facts", &conf])
        .args(["--nproc-per-node=2", "train.py"])
        .current_dir(scripts()));
    assert_eq!(code, 0, "an env file leaves the CRLF value to NCCL: {err}");
    assert!(out.contains("NCCL_SOCKET_IFNAME="), "{out}");
    assert!(
        !out.contains("NCCL_P2P_LEVEL") && !out.contains("NCCL_ALGO"),
        "{out}"
    );
}

/// A copy of the binary under test with the NCCL profiler plugin beside it, as an
/// install puts them (`cargo test` leaves the plugin in target/<profile>/deps).
fn installed_with_plugin() -> (tempfile::TempDir, std::path::PathBuf) {
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let so = [deps.join(PLUGIN), deps.join("..").join(PLUGIN)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{PLUGIN} is not built in {}: run the workspace's tests (cargo test at the root builds the nccl-profiler crate)",
                deps.display()
            )
        });
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("toporun");
    std::fs::copy(toporun().get_program(), &bin).unwrap();
    std::fs::copy(so, dir.path().join(PLUGIN)).unwrap();
    (dir, bin)
}

/// `--gpu-timing`, where the NCCL profiler is off: on by default (no steady step-time
/// cost at a 61 ms step, 2x H200): every rank gets the timing and both pipe names,
/// never the deprecated buffer name (an unknown torch is taken for a current one),
/// and the user's own values are kept and said; off, none of them.
#[test]
fn gpu_timing_is_on_by_default_and_keeps_the_users_values() {
    let host = host("h200x4");
    let off = ["--facts", &host, "--nproc-per-node=2", "--gpu-timing=off"];
    let (code, out, _) = dry(&off);
    assert_eq!(code, 0);
    assert!(out.contains("GPU timing: off (--gpu-timing off)"), "{out}");
    assert!(!out.contains("TORCH_NCCL_ENABLE_TIMING"), "{out}");
    let on = [
        "--facts",
        &host,
        "--nproc-per-node=2",
        "--nccl-profiler=off",
    ];
    let (_, out, _) = dry(&on);
    assert!(out.contains("GPU timing: on, a dump every 5s"), "{out}");
    for var in [
        "TORCH_NCCL_ENABLE_TIMING=1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<run dir>/attempt_0/fr-pipe/rank_",
        "TORCH_FR_DEBUG_INFO_PIPE_FILE=<run dir>/attempt_0/fr-pipe/rank_",
        "TORCH_FR_BUFFER_SIZE=2000",
    ] {
        assert_eq!(
            out.matches(&format!("  {var}\n")).count(),
            2,
            "{var}: {out}"
        );
    }
    let mine = [
        ("TORCH_NCCL_ENABLE_TIMING", "0"),
        ("TORCH_FR_BUFFER_SIZE", "4000"),
    ];
    assert!(!out.contains("  TORCH_NCCL_TRACE_BUFFER_SIZE="), "{out}");
    assert!(out.contains("(the ranks' torch was not found and is taken for 2.11 or later; on an older one set TORCH_NCCL_TRACE_BUFFER_SIZE=2000"), "{out}");
    let (_, out, _) = dry_with(&on, &mine);
    assert!(!out.contains("TORCH_NCCL_ENABLE_TIMING=1"), "{out}");
    assert!(!out.contains("  TORCH_NCCL_TRACE_BUFFER_SIZE="), "{out}");
    assert!(
        out.contains("yours kept: TORCH_NCCL_ENABLE_TIMING=0"),
        "{out}"
    );
    let off = ["--facts", &host, "--stragglers=off"];
    let (_, out, _) = dry(&off);
    assert!(out.contains("GPU timing: off (--stragglers off)"), "{out}");
}

/// torch 2.8-2.10 open the dump pipe only with TORCH_NCCL_TRACE_BUFFER_SIZE set,
/// and warn on every rank whenever it is: toporun leaves the GPU timing off there and
/// says why, unless the user set the old name themselves.
#[test]
fn gpu_timing_is_off_on_a_torch_whose_pipe_costs_a_warning() {
    let f = host_edited(&host("h200x4"), |facts| {
        facts["platform"]["torch_version"] = serde_json::json!("2.9.1+cu128")
    });
    let path = f.path().display().to_string();
    let on = [
        "--facts",
        &path,
        "--nproc-per-node=2",
        "--nccl-profiler=off",
    ];
    let (code, out, _) = dry(&on);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("GPU timing: off (torch 2.9.1: its dump pipe opens only with TORCH_NCCL_TRACE_BUFFER_SIZE set"), "{out}");
    assert!(!out.contains("  TORCH_NCCL_TRACE_BUFFER_SIZE="), "{out}");
    assert!(!out.contains("TORCH_NCCL_ENABLE_TIMING=1"), "{out}");
    let (_, out, _) = dry_with(&on, &[("TORCH_NCCL_TRACE_BUFFER_SIZE", "500")]);
    assert!(out.contains("GPU timing: on, a dump every 5s"), "{out}");
    assert!(
        out.contains("yours kept: TORCH_NCCL_TRACE_BUFFER_SIZE=500"),
        "{out}"
    );
}

#[test]
fn dry_run_takes_milliseconds() {
    let h = host("p5.48xlarge");
    let mut times: Vec<Duration> = (0..7)
        .map(|_| {
            let t = Instant::now();
            let (code, _, _) = dry(&["--facts", &h, "--nproc-per-node=gpu"]);
            assert_eq!(code, 0);
            t.elapsed()
        })
        .collect();
    times.sort();
    let median = times[3];
    eprintln!("launch --dry-run median over 7: {median:?}");
    // Debug build: measured 27 ms median on the 2-core VM with a test suite running
    // beside it (the release figure is in docs/measurements.md). A 200 ms bound failed
    // when CI shared the cores; 1 s still catches a probe that waits (NVML, metadata).
    assert!(median < Duration::from_secs(1), "{median:?}");
}

#[test]
fn nproc_gpu_counts_what_cuda_visible_devices_leaves() {
    // Seen on the 4x H200 host: two nodes of 2 GPUs each must start 2 ranks, not 4.
    let (code, out, _) = run(toporun()
        .args([
            "launch",
            "--dry-run",
            "--facts",
            &host("h200x4"),
            "--nproc-per-node=gpu",
            "t.py",
        ])
        .env("CUDA_VISIBLE_DEVICES", "2,3"));
    assert_eq!(code, 0);
    assert!(out.contains("ranks: 2 per node"), "{out}");
    assert!(
        out.contains("local rank 0 (rank 0), GPU2") && out.contains("local rank 1 (rank 1), GPU3"),
        "{out}"
    );
    let (code, _, err) = run(toporun()
        .args([
            "launch",
            "--dry-run",
            "--facts",
            &host("h200x4"),
            "--nproc-per-node=gpu",
            "t.py",
        ])
        .env("CUDA_VISIBLE_DEVICES", ""));
    // torchrun raises ValueError("Cuda is not available."): exit 1, not a usage error.
    assert_eq!(code, 1);
    assert!(err.contains("no GPU is visible"), "{err}");
}

/// A dry run for a script that is not there says so (a warning: the image may hold
/// it), naming the path and the working directory; a real launch refuses to start.
#[test]
fn a_missing_script_is_a_warning_in_a_dry_run_and_an_error_at_launch() {
    let d = tempfile::tempdir().unwrap();
    let (code, out, _) = run(toporun()
        .args(["launch", "--dry-run", "--nproc-per-node=4", "nonexist.py"])
        .current_dir(d.path()));
    assert_eq!(code, 0, "{out}");
    let cwd = std::fs::canonicalize(d.path()).unwrap();
    assert!(
        out.contains(&format!(
            "warning launch.entrypoint the training script nonexist.py does not exist in {}",
            cwd.display()
        )),
        "{out}"
    );
    let (code, out, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=2", "nonexist.py"])
        .current_dir(d.path()));
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains("error: the training script nonexist.py does not exist in")
            && err.contains("no rank was started"),
        "{err}"
    );
    // No rank ran: Python's own "can't open file" never appears.
    assert!(!err.contains("can't open file"), "{err}");
}

/// The "NCCL expected" line agrees with what will run: gloo without GPUs, NCCL's
/// refusal when ranks share a GPU, NVLink P2P on the 4x H200 host.
#[test]
fn nccl_expected_says_what_will_run() {
    let expected = |cvd: Option<&str>, nproc: &str| {
        let mut c = toporun();
        c.args(["launch", "--dry-run", "--facts", &host("h200x4")])
            .arg(format!("--nproc-per-node={nproc}"))
            .arg("train.py")
            .current_dir(scripts());
        if let Some(v) = cvd {
            c.env("CUDA_VISIBLE_DEVICES", v);
        }
        let (code, out, err) = run(&mut c);
        assert_eq!(code, 0, "{err}");
        out.lines()
            .find_map(|l| l.strip_prefix("NCCL expected: "))
            .unwrap_or_else(|| panic!("no NCCL expected line:\n{out}"))
            .to_string()
    };
    assert_eq!(
        expected(Some(""), "4"),
        "no NCCL: the ranks will use gloo on CPU (no GPU visible)"
    );
    assert!(expected(Some("0"), "4").starts_with("4 local ranks on 1 GPU(s) (GPU0): NCCL refuses"));
    assert!(expected(None, "4").starts_with("P2P over NVLink"));
    assert!(expected(Some("2"), "1").starts_with("one rank in the job (GPU2)"));
}

/// An interpreter that cannot import torch, for a script that imports it, is named
/// once with the fix, before any rank starts (not left to every rank's traceback).
#[test]
fn an_interpreter_without_torch_is_named_once_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    // python3 without its site-packages: the standard library, no torch.
    let py = d.path().join("python-no-site");
    std::fs::write(&py, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        d.path().join("t.py"),
        "import os\nimport torch\nprint('ran')\n",
    )
    .unwrap();
    let (code, out, err) = run(toporun()
        .args(["--standalone", "--nproc-per-node=2", "t.py"])
        .env("PYTHON_EXEC", &py)
        .current_dir(d.path()));
    assert_eq!(code, 1, "{out}\n{err}");
    let line = format!(
        "error: {} cannot import torch, which t.py imports at line 2",
        py.display()
    );
    assert_eq!(err.matches(&line).count(), 1, "{err}");
    assert!(err.contains("set PYTHON_EXEC"), "{err}");
    assert!(
        !err.contains("ModuleNotFoundError: No module named"),
        "{err}"
    );
    assert!(!out.contains("ran"), "{out}");
}

/// Local rank 0's variables as `launch --dry-run` lists them, where it is global rank
/// `rank` (values with a `<placeholder>` stand for what only the start knows).
fn dry_rank(out: &str, rank: u32) -> std::collections::BTreeMap<String, String> {
    let section = out
        .split(&format!("local rank 0 (rank {rank})"))
        .nth(1)
        .and_then(|s| s.split("\nlocal rank ").next())
        .unwrap_or_else(|| panic!("no rank {rank} in the dry run:\n{out}"));
    section
        .lines()
        .filter_map(|l| l.strip_prefix("  ")?.split_once('='))
        .filter(|(k, _)| {
            k.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A real rank's variables (`real`) are the dry run's (`listed`): the same names, not
/// counting those the test gave (`given`), the same values where the dry run knows.
fn same_variables(
    what: &str,
    real: &std::collections::BTreeMap<String, String>,
    listed: &std::collections::BTreeMap<String, String>,
    given: &[&str],
) -> usize {
    let set_by_launcher: Vec<&String> = real
        .keys()
        .filter(|k| !given.contains(&k.as_str()))
        .collect();
    let listed_names: Vec<&String> = listed
        .keys()
        .filter(|k| !given.contains(&k.as_str()))
        .collect();
    assert_eq!(
        set_by_launcher, listed_names,
        "{what}: real rank, then dry run"
    );
    for (k, v) in listed.iter().filter(|(_, v)| !v.contains('<')) {
        assert_eq!(real.get(k), Some(v), "{what}: {k}");
    }
    set_by_launcher.len()
}

/// A rank script writing its whole environment to `$ENV_OUT/<RANK>.json`.
const ENV_SCRIPT: &str = "import json, os\njson.dump(dict(os.environ), open(os.path.join(os.environ['ENV_OUT'], os.environ['RANK'] + '.json'), 'w'))\n";

/// A rank script writing its whole environment under `dir`/env, and the only
/// variables its launcher gets: (the script, where the ranks write, the variables).
fn env_job(
    dir: &Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    Vec<(&'static str, String)>,
) {
    let script = dir.join("env.py");
    std::fs::write(&script, ENV_SCRIPT).unwrap();
    let out = dir.join("env");
    std::fs::create_dir(&out).unwrap();
    let base = vec![
        ("PATH", std::env::var("PATH").unwrap_or_default()),
        ("HOME", dir.display().to_string()),
        ("PYTHON_EXEC", python().display().to_string()),
        ("ENV_OUT", out.display().to_string()),
        // Else Python sets LC_CTYPE itself (PEP 538's locale coercion).
        ("LC_ALL", "C.UTF-8".to_string()),
    ];
    (script, out, base)
}

fn real_env(dir: &Path, rank: u32) -> std::collections::BTreeMap<String, String> {
    let f = dir.join(format!("{rank}.json"));
    serde_json::from_str(
        &std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
    )
    .unwrap()
}

/// The dry run promises every rank's whole environment: for each setting, a real
/// rank's variables (those not in the launcher's own environment) and the dry run's
/// are the same names, with the same values where the dry run can know them. One node
/// is node 0 whatever `--node-rank` says, for the launch and the dry run alike.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_dry_run_lists_what_a_real_rank_gets() {
    let dir = tempfile::tempdir().unwrap();
    let (script, out, base) = env_job(dir.path());
    // (what, flags, variables of the launcher's environment)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case; 6] = [
        ("defaults", &[], &[]),
        ("recorder off", &["--flight-recorder=off"], &[]),
        ("faulthandler off", &["--faulthandler=off"], &[]),
        (
            "the user's recorder size",
            &[],
            &[("TORCH_FR_BUFFER_SIZE", "500")],
        ),
        (
            "file timer",
            &["--stop-grace=5"],
            &[("TORCHELASTIC_ENABLE_FILE_TIMER", "1")],
        ),
        ("--node-rank=1 on one node", &["--node-rank=1"], &[]),
    ];
    for (what, flags, vars) in cases {
        let launch = |dry: bool| {
            let mut c = toporun();
            c.env_clear()
                .envs(base.iter().map(|(k, v)| (*k, v.as_str())));
            c.envs(vars.iter().copied());
            if dry {
                c.args(["launch", "--dry-run"]);
            }
            c.args(["--standalone", "--nproc-per-node=2"])
                .args(flags)
                .arg(&script);
            run(&mut c)
        };
        let (code, dry, err) = launch(true);
        assert_eq!(code, 0, "{what}: {dry}{err}");
        let listed = dry_rank(&dry, 0);
        let _ = std::fs::remove_file(out.join("0.json"));
        let (code, so, se) = launch(false);
        assert_eq!(code, 0, "{what}: {so}{se}");
        let given: Vec<&str> = base
            .iter()
            .map(|(k, _)| *k)
            .chain(vars.iter().map(|(k, _)| *k))
            .collect();
        let n = same_variables(what, &real_env(&out, 0), &listed, &given);
        eprintln!("{what}: {n} variables agree");
    }
}

/// Node 1 of two (static rendezvous, both on this machine): its first rank, global
/// rank 2, gets what the dry run of node 1 lists.
#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn the_dry_run_of_node_1_of_two_lists_what_its_rank_gets() {
    let dir = tempfile::tempdir().unwrap();
    let (script, out, base) = env_job(dir.path());
    let port = free_port().to_string();
    let node = |rank: &str, dry: bool| {
        let mut c = toporun();
        c.env_clear()
            .envs(base.iter().map(|(k, v)| (*k, v.as_str())));
        if dry {
            c.args(["launch", "--dry-run"]);
        }
        c.args([
            "--nnodes=2",
            &format!("--node-rank={rank}"),
            "--master-addr=127.0.0.1",
        ])
        .args([
            &format!("--master-port={port}"),
            "--nproc-per-node=2",
            "--nccl-report=off",
        ])
        .arg(&script);
        c
    };
    let (code, dry, err) = run(&mut node("1", true));
    assert_eq!(code, 0, "{dry}{err}");
    let listed = dry_rank(&dry, 2);
    assert_eq!(
        listed.get("GROUP_RANK").map(String::as_str),
        Some("1"),
        "{dry}"
    );
    let node0 = node("0", false)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (code, so, se) = run(&mut node("1", false));
    let first = node0.wait_with_output().unwrap();
    assert_eq!(
        code,
        0,
        "{so}{se}\nnode 0: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let given: Vec<&str> = base.iter().map(|(k, _)| *k).collect();
    let n = same_variables("node 1 of 2", &real_env(&out, 2), &listed, &given);
    eprintln!("node 1 of 2: {n} variables agree");
}

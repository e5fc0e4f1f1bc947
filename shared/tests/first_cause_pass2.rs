//! What 4x H200 (torch 2.11, NCCL 2.28.9) gave for issue 50, kept under
//! tests/fixtures/device/first-cause-pass2-h200x4 (`scripts/device/gpu_first_cause_pass2.sh`),
//! and the decisions taken on it: NCCL's own reason for an invalid usage, the slow-links
//! rule on a healthy job with a 35 s single-rank pause, and where a 3x-GPU-work rank's
//! Python thread stands.

use std::path::PathBuf;
use toporun_shared::flight_recorder::{link_speeds, parse, LinkModel};
use toporun_shared::root_cause::nccl_error::NcclResult;
use toporun_shared::root_cause::python_error::last_exception;
use toporun_shared::stacks::activity::{classify, Activity, Backward};
use toporun_shared::stacks::standing::{standing, Standing};
use toporun_shared::stacks::RankStack;

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device/first-cause-pass2-h200x4")
        .join(path)
}

/// A stderr as scripts/device/timed_run.py kept it, without its `[  7.57] ` stamps.
fn unstamped(path: &str) -> String {
    std::fs::read_to_string(fixture(path))
        .unwrap()
        .lines()
        .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn two_ranks_on_one_gpu_get_ncclss_reason() {
    let text = unstamped("dupgpu/stderr");
    let rank0: String = text
        .lines()
        .filter(|l| l.starts_with("[rank0]:"))
        .collect::<Vec<_>>()
        .join("\n");
    let e = last_exception(&rank0).expect("rank 0's traceback");
    let n = e.nccl.expect("an NCCL error");
    assert_eq!(n.result, NcclResult::InvalidUsage);
    assert_eq!(
        n.last_error.as_deref(),
        Some("Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60")
    );
    assert!(
        n.fix().starts_with("ranks 0 and 1 run on one GPU"),
        "{}",
        n.fix()
    );
    // And toporun said so on the machine.
    assert!(text.contains("toporun: root cause (code): rank 0 raised torch.distributed.DistBackendError (gpu_dup_gpu_rank.py:10): NCCL invalid usage"), "{text}");
}

/// 16 MiB all_reduces on NV18 with rank 1 busy 35 s on its CPU mid-run: the dumps
/// sampled while it trained run near NV18's model, and no warning was said.
#[test]
fn a_healthy_link_with_a_long_single_rank_pause_is_not_slow() {
    let dumps: Vec<_> = (0..2)
        .map(|r| {
            parse(
                r,
                &std::fs::read(fixture(&format!("pause/fr-sampled/rank_{r}"))).unwrap(),
            )
            .unwrap()
        })
        .collect();
    let nv18 = LinkModel {
        class: "NV18 (Hopper) between GPU 0 and GPU 1".into(),
        gbps: 370.8,
    };
    let s = link_speeds(&dumps, &nv18);
    let ar = s
        .iter()
        .find(|s| s.kind == "all_reduce")
        .expect("all_reduce");
    assert!(ar.count >= 20, "{ar:?}");
    assert!(!ar.slow(), "{ar:?}");
    let stderr = unstamped("pause/stderr");
    assert!(!stderr.contains("slow links"), "{stderr}");
}

/// Rank 1 of the DDP job (3x the batch) as `toporun stacks` sampled it while it
/// trained: mostly at `train_step().item()`, waiting for its GPU, once idle in
/// autograd's backward; never "blocked outside PyTorch".
#[test]
fn a_gpu_stragglers_python_thread_waits_for_its_gpu_or_is_in_backward() {
    let source = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/device/gpu_backward_rank.py"),
    )
    .unwrap();
    let line_of = |file: &str, n: i32| {
        file.ends_with("gpu_backward_rank.py")
            .then(|| source.lines().nth(n as usize - 1))
            .flatten()
    };
    let mut seen = std::collections::BTreeMap::new();
    for i in 1..=20 {
        let Ok(text) = std::fs::read_to_string(fixture(&format!("backward2/stacks-{i}.json")))
        else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let ranks: Vec<RankStack> = serde_json::from_value(v["ranks"].clone()).unwrap();
        let Some(main) = ranks
            .iter()
            .find(|r| r.rank == 1)
            .and_then(|r| r.main_thread())
        else {
            continue;
        };
        let f = &main.frames[0];
        // As the tracker decides under NCCL: a line that syncs with the GPU waits for it.
        let a = match standing(main, line_of(&f.file, f.line)) {
            Standing::GpuWait { .. } => Activity::GpuWait,
            _ => classify(main, Backward::OnDevice),
        };
        *seen.entry(a).or_insert(0) += 1;
    }
    let most = seen.iter().max_by_key(|(_, n)| **n).map(|(a, _)| *a);
    assert_eq!(most, Some(Activity::GpuWait), "{seen:?}");
    assert!(seen.contains_key(&Activity::Backward), "{seen:?}");
    assert!(!seen.contains_key(&Activity::Blocked), "{seen:?}");
}

//! What 2x H200 gave for issue 61's slow-links false alarm
//! (tests/fixtures/device/nccl-slow-links-ddp-h200x2): a nanoGPT-style DDP trainer on a
//! healthy NVLink was warned of slow links before the fastest-operation gate, and is
//! not since; the rule itself is tested in `nccl_counters::window`.

use std::path::PathBuf;

fn fixture(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/device/nccl-slow-links-ddp-h200x2")
        .join(path);
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn a_healthy_ddp_trainer_is_no_longer_warned_of_slow_links() {
    let (before, after) = (fixture("before-stderr"), fixture("after-stderr"));
    for err in [&before, &after] {
        assert!(
            err.contains("1 rank pair via P2P/CUMEM (P2P): best available"),
            "{err}"
        );
    }
    assert!(before.contains("toporun: warning: slow links"), "{before}");
    assert!(!after.contains("toporun: warning"), "{after}");
    for out in [fixture("before-stdout"), fixture("after-stdout")] {
        assert_eq!(
            out.matches("iter: median").count(),
            2,
            "both ranks trained: {out}"
        );
    }
}

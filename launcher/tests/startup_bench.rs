//! The start-up benchmark (scripts/bench/bench_startup.py) against the real torchrun, run as
//! a test so a regression fails CI: at least 25x faster, a debug build under 30 MB peak RSS.

mod support;
use support::*;

#[test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
fn far_faster_than_torchrun_and_small() {
    let out = std::process::Command::new("python3")
        .arg(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../scripts/bench/bench_startup.py"),
        )
        .args([
            "-n",
            "5",
            "--json",
            "--toporun",
            env!("CARGO_BIN_EXE_toporun"),
            "--torchrun",
            torchrun().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("startup benchmark: {v}");
    // Measured 47.3x with a release build running beside it on the 2-core VM (a 50x
    // bound failed there), more alone; a start-up twice as slow still fails 25x.
    assert!(v["speedup"].as_f64().unwrap() >= 25.0, "{v}");
    // This is the debug build, whose peak grows with the code it maps: 24.2-24.3 MB
    // once the GPU straggler's modules came, 26.2 MB once slow links and the option
    // suggestions came (the release build: 12.7 MB, the product's figure;
    // scripts/bench/bench_startup.py, docs/measurements.md). A fresh clone's debug build
    // maps more than an incremental one: 28.4-28.5 MB against 26.0 MB at the same code
    // once the mismatch rule and humantime came, the release build still 12.9 MB. The
    // bound catches a start-up that reads or allocates more, not a few more functions.
    assert!(v["toporun_peak_rss_mb"].as_f64().unwrap() < 30.0, "{v}");
}

//! What a new user reads first: `toporun launch --help` fits the terminal (100 columns
//! when it is none), and every option says its variable and default in one format;
//! the top-level help points to it.

use crate::support::*;
use toporun_shared::toporun_vars::ToporunVar;
use toporun_shared::torchrun::OPTIONS;

#[test]
fn launch_help_fits_and_names_every_variable_in_one_format() {
    let (code, out, err) = run(toporun().args(["launch", "--help"]).env_remove("COLUMNS"));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("Start one rank per GPU as torchrun would"),
        "{out}"
    );
    let wide: Vec<&str> = out.lines().filter(|l| l.chars().count() > 100).collect();
    assert!(wide.is_empty(), "lines over 100 columns: {wide:#?}");
    // Wrapping may split `[env: NAME]` across lines: read the text as one line.
    let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
    for o in OPTIONS {
        assert!(
            flat.contains(&format!("[env: {}]", o.opt.pet())),
            "--{}",
            o.longs[0]
        );
        if let Some(d) = o.default {
            let shown = format!("[env: {}] [default: {d}]", o.opt.pet());
            assert!(flat.contains(&shown), "--{}: {shown}", o.longs[0]);
        }
    }
    let launch_vars = [
        ToporunVar::HangTimeout,
        ToporunVar::OnHang,
        ToporunVar::StragglerWindow,
        ToporunVar::GpuTiming,
        ToporunVar::ExitCodes,
        ToporunVar::PreflightMeasure,
        ToporunVar::StopGrace,
    ];
    for v in launch_vars {
        assert!(
            flat.contains(&format!("[env: {}]", v.name())),
            "{}",
            v.name()
        );
    }
    // No other spelling of a variable or a default.
    for old in ["[env TOPORUN", "(default ", "; env "] {
        assert!(!flat.contains(old), "{old}");
    }
    let (_, top, _) = run(toporun().arg("--help"));
    assert!(top.contains("toporun launch --help"), "{top}");
}

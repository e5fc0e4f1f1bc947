//! Real gloo flight-recorder dumps (torch 2.15, `_dump_fr_trace_file`; the job is
//! beside them): ranks 0-2 entered a 4th all_reduce that rank 3 never did.

use toporun_shared::flight_recorder::{analyze, parse, render_text, Issue};

fn dumps() -> Vec<toporun_shared::flight_recorder::Dump> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/flight-recorder/gloo-rank3-missing");
    (0..4)
        .map(|r| parse(r, &std::fs::read(dir.join(format!("rank_{r}"))).unwrap()).unwrap())
        .collect()
}

#[test]
fn the_rank_that_never_entered_is_named_with_its_last_completed() {
    let d = dumps();
    assert_eq!(d[0].version, "2.10");
    assert_eq!(d[0].entries.len(), 4);
    assert_eq!(d[3].entries.len(), 3);
    let report = analyze(&d);
    let [Issue::NotEntered {
        group,
        seq,
        op,
        entered,
        missing,
    }] = report.issues.as_slice()
    else {
        panic!("{report:?}")
    };
    assert_eq!(
        (group.as_str(), *seq, op.as_str()),
        ("0", 4, "gloo:all_reduce")
    );
    assert_eq!(
        entered.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(missing.len(), 1);
    assert_eq!(missing[0].rank, 3);
    assert_eq!(
        missing[0].last_completed,
        Some((3, "gloo:all_reduce".into()))
    );
    assert_eq!(missing[0].last_entered, Some((3, "gloo:all_reduce".into())));
    let text = render_text(&report);
    assert!(text.contains("collective #4 gloo:all_reduce entered by rank(s) 0,1,2 (scheduled, not completed); never entered by:\n    rank 3: last entered #3 gloo:all_reduce, last completed #3 gloo:all_reduce"), "{text}");
}

#[test]
fn ranks_that_agree_give_no_issue_and_a_dtype_mismatch_names_the_rank() {
    let mut d = dumps();
    d.truncate(3);
    for x in &mut d {
        x.entries.truncate(3);
    }
    assert!(analyze(&d).issues.is_empty());
    d[1].entries[1].input_dtypes = "['Half']".into();
    let report = analyze(&d);
    assert!(
        matches!(
            &report.issues[..],
            [Issue::Mismatch {
                seq: 2,
                culprit: 1,
                field: "input dtypes",
                ..
            }]
        ),
        "{report:?}"
    );
}

/// A real stock ProcessGroupNCCL dump (torch 2.11, 1x H100), written when toporun set
/// `exception_dump` at a hang stop (scripts/device/gpu_fr_dumps.sh); its pickle reuses
/// memoized strings as dict keys.
#[test]
fn a_stock_nccl_dump_reads() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/flight-recorder/nccl-legacy-h100/rank_0");
    let d = parse(0, &std::fs::read(path).unwrap()).unwrap();
    assert_eq!(d.version, "2.10");
    assert_eq!(d.entries.len(), 3);
    assert!(d
        .entries
        .iter()
        .all(|e| e.op == "nccl:all_reduce" && e.completed()));
    assert_eq!(d.entries[2].collective_seq_id, 3);
    assert_eq!(d.entries[0].group, "0");
    assert_eq!(analyze(&[d]).issues, vec![]);
}

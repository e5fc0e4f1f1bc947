//! `toporun nccl-log FILE...`: NCCL logs pasted into tickets, read and judged.

use crate::exit::CannotRun;
use crate::exit::ExitStatus;
use crate::facts_source;
use crate::subcommands::{Globals, ReportFormat};
use anyhow::Result;
use std::io::Read;
use toporun_shared::finding::Finding;
use toporun_shared::nccl_log::{self, Analyzer, LogReport, Topology};

/// A log larger than this is read only up to here (NCCL init logs are KBs to MBs).
const MAX_LOG_BYTES: u64 = 256 << 20;

fn read_capped(path: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let r = if path == "-" {
        std::io::stdin().take(MAX_LOG_BYTES).read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_LOG_BYTES).read_to_end(&mut buf))
    };
    r.map_err(|e| CannotRun(format!("cannot read {path}: {e}")))?;
    Ok(buf)
}

pub fn run(g: &Globals, files: &[String], format: ReportFormat) -> Result<ExitStatus> {
    let facts = facts_source::load_given(g.facts.as_ref(), g.nvidia_smi_topo.as_ref())?;
    let mut a = Analyzer::new();
    for f in files {
        a.feed_text(&String::from_utf8_lossy(&read_capped(f)?));
    }
    let mut report = a.report();
    if report.nccl_lines == 0 {
        return Err(CannotRun(format!(
            "no NCCL log line in {}: expected lines like `host:pid:tid [dev] NCCL INFO ...` (run the job with NCCL_DEBUG=INFO)",
            files.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ))
        .into());
    }
    nccl_log::judge(
        &mut report,
        facts.as_ref().map(|f| Topology { facts: f }).as_ref(),
    );
    let findings = nccl_log::findings(&report);
    match format {
        ReportFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&crate::documents::NcclLog::of(&report, &findings))?
        ),
        ReportFormat::Text => print!("{}", text(&report, &findings, facts.is_some())),
    }
    Ok(ExitStatus::failed_if(!findings.is_empty()))
}

fn text(r: &LogReport, findings: &[Finding], judged: bool) -> String {
    let mut out = format!(
        "NCCL {}, {} NCCL lines, network plugin {}\n",
        r.version.as_deref().unwrap_or("(version not logged)"),
        r.nccl_lines,
        if r.net_plugins.is_empty() {
            "not logged".to_string()
        } else {
            r.net_plugins.join(", ")
        }
    );
    for c in &r.comms {
        out.push_str(&format!(
            "\ncommunicator {}: {}{}\n",
            c.id,
            nccl_log::comm_line(c),
            if c.complete() {
                ""
            } else {
                " (init not complete in this log)"
            }
        ));
        out.push_str(&nccl_log::render_matrix(c));
    }
    if !judged {
        out.push_str("\n(no topology given: pass --facts or --nvidia-smi-topo to judge links within a host against its GPUs)\n");
    }
    for f in findings {
        out.push_str(&format!("\n{}: {} [{}]\n", f.severity, f.summary, f.id));
        for (k, v) in &f.facts {
            out.push_str(&format!("  {k}: {v}\n"));
        }
        if let Some(r) = &f.remedy {
            out.push_str(&format!("  fix: {r}\n"));
        }
    }
    out
}

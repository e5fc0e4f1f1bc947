//! `toporun fr-trace FILE...|DIR`: PyTorch flight-recorder dumps matched across ranks,
//! offline (as `nccl-log` reads NCCL's logs). Exit 0 when the ranks agree, 1 when a
//! rank is named, 2 when nothing is readable; garbage never panics.

use crate::exit::CannotRun;
use crate::exit::ExitStatus;
use crate::subcommands::ReportFormat;
use anyhow::Result;
use toporun_agent::flight_recorder::read;
use toporun_shared::flight_recorder::{analyze, render_text};

pub fn run(paths: &[String], format: ReportFormat) -> Result<ExitStatus> {
    let (dumps, unreadable) = read(paths);
    for u in &unreadable {
        crate::console::say!("toporun: fr-trace: cannot read {u}");
    }
    if dumps.is_empty() {
        return Err(CannotRun(format!(
            "no flight-recorder dump could be read in {}: expected PyTorch's pickled dumps named <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE)",
            paths.join(", ")
        ))
        .into());
    }
    let report = analyze(&dumps);
    match format {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        ReportFormat::Text => print!("{}", render_text(&report)),
    }
    Ok(if report.issues.is_empty() {
        ExitStatus::Success
    } else {
        ExitStatus::Failed
    })
}

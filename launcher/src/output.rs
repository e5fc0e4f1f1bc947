//! Rendering for people (text, coloured only on a terminal) and machines (JSON, JUnit).

use std::io::IsTerminal;
use toporun_shared::facts::{HostFacts, LinkKind};
use toporun_shared::finding::{Finding, Severity};
use toporun_shared::units::format_size;

pub struct Style {
    color: bool,
}

impl Style {
    pub fn stdout() -> Style {
        Style {
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    pub fn severity(&self, s: Severity) -> String {
        let (label, code) = match s {
            Severity::Ok => ("ok", "32"),
            Severity::Info => ("info", "36"),
            Severity::Warning => ("warning", "33"),
            Severity::Error => ("error", "31;1"),
        };
        if self.color {
            format!("\x1b[{code}m{label:>7}\x1b[0m")
        } else {
            format!("{label:>7}")
        }
    }
}

/// Findings, one line each; warnings and errors also with their facts and fix.
pub fn findings_text(findings: &[Finding], style: &Style) -> String {
    let mut out = String::new();
    for f in findings {
        out.push_str(&format!(
            "{} {:<15} {}\n",
            style.severity(f.severity),
            f.id,
            f.summary
        ));
        if f.severity >= Severity::Warning {
            if !f.facts.is_empty() {
                let facts: Vec<String> = f.facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("        {:<15} facts: {}\n", "", facts.join(", ")));
            }
            if let Some(r) = &f.remedy {
                out.push_str(&format!(
                    "        {:<15} fix: {}\n",
                    "",
                    r.replace('\n', &format!("\n        {:<15}      ", ""))
                ));
            }
        }
    }
    out
}

/// JUnit XML (quick-junit): one testcase per finding, a <failure> for each error.
pub fn junit(findings: &[Finding]) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("toporun preflight");
    for f in findings {
        let facts: Vec<String> = f.facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let body = format!(
            "{}\nfacts: {}\nfix: {}",
            f.summary,
            facts.join(", "),
            f.remedy.as_deref().unwrap_or("-")
        );
        let error = f.severity == Severity::Error;
        let status = if error {
            let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
            s.set_message(f.summary.as_str())
                .set_type("error")
                .set_description(body.as_str());
            s
        } else {
            TestCaseStatus::success()
        };
        let mut case = TestCase::new(f.id.as_str(), status);
        case.set_classname("preflight");
        if !error {
            case.set_system_out(format!("{}: {body}", f.severity));
        }
        suite.add_test_case(case);
    }
    let mut report = Report::new("toporun preflight");
    report.add_test_suite(suite);
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- JUnit rendering failed: {e} -->\n"))
}

pub fn host_summary(f: &HostFacts) -> String {
    let c = &f.container;
    let gpus = &f.gpus;
    let names: Vec<&str> = gpus
        .devices
        .iter()
        .map(|d| d.name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    let link = gpus
        .pairs()
        .map(|(_, _, l)| l)
        .next()
        .map_or("-".to_string(), |l| l.to_string());
    let nccl = format!(
        "NCCL: {}; get_mempolicy {} (seccomp {})\n",
        f.platform
            .nccl_version
            .as_ref()
            .map_or("version unknown".to_string(), |v| format!(
                "{v} ({}){}",
                f.platform.nccl_version_from.as_deref().unwrap_or("on disk"),
                f.platform
                    .nccl_on_disk
                    .as_ref()
                    .map(|d| format!("; libnccl.so.{d} on disk, not the one the ranks load"))
                    .unwrap_or_default()
            )),
        match c.get_mempolicy {
            Some(true) => "allowed",
            Some(false) => "refused",
            None => "not probed",
        },
        c.seccomp.map_or("unknown".to_string(), |m| m.to_string())
    );
    format!(
        "host: {} ({}), {} CPUs, /dev/shm {}\n{}GPUs: {} {} (first pair: {link}, source: {}){}\nNICs: {}\nRDMA: {}\n{nccl}",
        c.hostname,
        f.platform.product_name.as_deref().unwrap_or("unknown platform"),
        c.cpu_count,
        c.shm.as_ref().map_or("absent".into(), |s| format_size(s.total_bytes)),
        f.cloud.as_ref().map_or(String::new(), |i| format!("instance: {} ({}, {} ms)\n", i.instance_type, i.source, i.millis)),
        gpus.count(),
        names.first().copied().unwrap_or(""),
        gpus.source,
        gpus.nvml_error.as_ref().map(|e| format!("\n      {e}")).unwrap_or_default(),
        f.nics.iter().map(|n| format!("{}{}", n.name, if n.virtual_iface { "(virtual)" } else { "" })).collect::<Vec<_>>().join(" "),
        if f.rdma.is_empty() { "none".to_string() } else { f.rdma.iter().map(|d| d.name.clone()).collect::<Vec<_>>().join(" ") },
    )
}

/// The link matrix as nvidia-smi prints it.
pub fn matrix_text(f: &HostFacts) -> String {
    let n = f.gpus.count();
    let mut out = String::from("      ");
    for j in 0..n {
        out.push_str(&format!("{:<6}", format!("GPU{j}")));
    }
    out.push_str("CPU Affinity\n");
    for i in 0..n {
        out.push_str(&format!("{:<6}", format!("GPU{i}")));
        for j in 0..n {
            out.push_str(&format!(
                "{:<6}",
                f.gpus.link(i, j).unwrap_or(LinkKind::Sys).to_string()
            ));
        }
        let aff = f
            .gpus
            .devices
            .get(i)
            .map(|d| toporun_shared::cpulist::format(&d.cpu_affinity))
            .unwrap_or_default();
        out.push_str(&format!("{aff}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::finding::FindingId;

    #[test]
    fn junit_has_a_failure_per_error() {
        // Control characters (an escape code in a finding) must not break the XML.
        let f = vec![
            Finding::new(FindingId::ShmSize, Severity::Error, "small <shm>"),
            Finding::new(FindingId::GpuVisible, Severity::Ok, "4 \u{1b}[31m"),
        ];
        let x = junit(&f);
        assert_eq!(x.matches("<failure").count(), 1);
        assert!(x.contains("small &lt;shm&gt;"));
        assert!(
            x.contains("tests=\"2\"") && x.contains("failures=\"1\""),
            "{x}"
        );
        assert!(!x.contains('\u{1b}'), "{x}");
    }
}

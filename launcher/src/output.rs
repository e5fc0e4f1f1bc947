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

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// JUnit XML: one testcase per finding, a <failure> for each error.
pub fn junit(findings: &[Finding]) -> String {
    let failures = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    let mut out = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"toporun preflight\" tests=\"{}\" failures=\"{failures}\">\n  <testsuite name=\"toporun preflight\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" skipped=\"0\">\n", findings.len(), findings.len());
    for f in findings {
        out.push_str(&format!(
            "    <testcase classname=\"preflight\" name=\"{}\">\n",
            xml_escape(&f.id)
        ));
        let facts: Vec<String> = f.facts.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let body = format!(
            "{}\nfacts: {}\nfix: {}",
            f.summary,
            facts.join(", "),
            f.remedy.as_deref().unwrap_or("-")
        );
        if f.severity == Severity::Error {
            out.push_str(&format!(
                "      <failure message=\"{}\" type=\"error\">{}</failure>\n",
                xml_escape(&f.summary),
                xml_escape(&body)
            ));
        } else {
            out.push_str(&format!(
                "      <system-out>{}: {}</system-out>\n",
                f.severity,
                xml_escape(&body)
            ));
        }
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
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
                "{v} ({})",
                f.platform.nccl_version_from.as_deref().unwrap_or("on disk")
            )),
        match c.get_mempolicy {
            Some(true) => "allowed",
            Some(false) => "refused",
            None => "not probed",
        },
        c.seccomp.map_or("unknown".to_string(), |m| m.to_string())
    );
    format!(
        "host: {} ({}), {} CPUs, /dev/shm {}\nGPUs: {} {} (first pair: {link}, source: {}){}\nNICs: {}\nRDMA: {}\n{nccl}",
        c.hostname,
        f.platform.product_name.as_deref().unwrap_or("unknown platform"),
        c.cpu_count,
        c.shm.as_ref().map_or("absent".into(), |s| format_size(s.total_bytes)),
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

    #[test]
    fn junit_has_a_failure_per_error() {
        let f = vec![
            Finding::new("shm.size", Severity::Error, "small <shm>"),
            Finding::new("gpu.visible", Severity::Ok, "4"),
        ];
        let x = junit(&f);
        assert_eq!(x.matches("<failure").count(), 1);
        assert!(x.contains("small &lt;shm&gt;"));
        assert!(x.contains("tests=\"2\" failures=\"1\""));
    }
}

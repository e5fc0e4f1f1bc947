//! Findings: what toporun says about the host, each with the evidence and the fix.

pub use crate::finding_id::FindingId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Ok,
    Info,
    Warning,
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Ok => "ok",
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable id (`shm.size`), for filters and dashboards.
    pub id: FindingId,
    pub severity: Severity,
    /// One line for a human.
    pub summary: String,
    /// The measured facts the verdict rests on.
    pub facts: BTreeMap<String, String>,
    /// What to change, with the pod-spec snippet where one applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl Finding {
    pub fn new(id: FindingId, severity: Severity, summary: impl Into<String>) -> Self {
        Finding {
            id,
            severity,
            summary: summary.into(),
            facts: BTreeMap::new(),
            remedy: None,
        }
    }

    pub fn fact(mut self, name: &str, value: impl fmt::Display) -> Self {
        self.facts.insert(name.to_string(), value.to_string());
        self
    }

    pub fn remedy(mut self, remedy: impl Into<String>) -> Self {
        self.remedy = Some(remedy.into());
        self
    }
}

/// The worst severity present, `Ok` for none.
pub fn worst(findings: &[Finding]) -> Severity {
    findings
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(Severity::Ok)
}

//! A GPU that degraded during the job: its health read again at a failure and
//! compared with the start (new uncorrected ECC errors, a row remap or page
//! retirement now pending or failed).

use super::cause::{Cause, CauseKind};
use super::xid::FIX;
use crate::facts::{Gpu, GpuFacts};

fn changes(before: &Gpu, now: &Gpu) -> Vec<String> {
    let (b, n) = (&before.health, &now.health);
    let mut out = Vec::new();
    if let (Some(x), Some(y)) = (b.ecc_uncorrected_volatile, n.ecc_uncorrected_volatile) {
        if y > x {
            out.push(format!("{} new uncorrected ECC error(s)", y - x));
        }
    }
    if let (Some(x), Some(y)) = (b.remapped_rows, n.remapped_rows) {
        if y.uncorrectable > x.uncorrectable {
            out.push(format!(
                "{} row(s) remapped for uncorrectable errors",
                y.uncorrectable - x.uncorrectable
            ));
        }
        if y.pending && !x.pending {
            out.push("a row remap now waits for a GPU reset".into());
        }
        if y.failed && !x.failed {
            out.push("a row remap failed (no spare rows left)".into());
        }
    }
    if n.retirement_pending == Some(true) && b.retirement_pending != Some(true) {
        out.push("a page retirement now waits for a GPU reset".into());
    }
    out
}

/// The GPUs (matched by UUID) whose health got worse between `before` and `now`.
pub fn degraded(before: &GpuFacts, now: &GpuFacts) -> Vec<Cause> {
    now.devices
        .iter()
        .filter_map(|g| {
            let was = before.devices.iter().find(|b| b.uuid == g.uuid)?;
            let what = changes(was, g);
            (!what.is_empty()).then(|| {
                Cause::new(
                    CauseKind::Hardware,
                    None,
                    format!(
                        "GPU {} ({}, PCI {}) degraded during the job: {}",
                        g.index,
                        g.uuid,
                        g.pci_bus_id,
                        what.join(", ")
                    ),
                )
                .fix(FIX)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::RemappedRows;

    fn gpus(ecc: u64, pending: bool) -> GpuFacts {
        let mut g = Gpu {
            uuid: "GPU-a".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            ..Default::default()
        };
        g.health.ecc_uncorrected_volatile = Some(ecc);
        g.health.remapped_rows = Some(RemappedRows {
            pending,
            ..Default::default()
        });
        GpuFacts {
            devices: vec![g],
            ..Default::default()
        }
    }

    #[test]
    fn new_uncorrected_errors_and_a_pending_remap_are_hardware() {
        let c = degraded(&gpus(0, false), &gpus(2, true));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].kind, CauseKind::Hardware);
        assert!(
            c[0].summary
                .contains("2 new uncorrected ECC error(s), a row remap now waits for a GPU reset"),
            "{}",
            c[0].summary
        );
        assert!(degraded(&gpus(2, true), &gpus(2, true)).is_empty());
    }
}

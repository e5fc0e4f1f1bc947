//! A write that failed for the volume, not the code: ENOSPC, EDQUOT, EROFS in a
//! rank's output, or PyTorch's stream writer failing mid-checkpoint
//! (`inline_container.cc ... unexpected pos`, `file write failed`), which names no
//! errno at all. The volume's own numbers then say which it was.

use crate::units::format_size;

/// The messages of a write the volume refused.
const SIGNATURES: [&str; 6] = [
    "No space left on device",
    "Disk quota exceeded",
    "Read-only file system",
    "unexpected pos",
    "file write failed",
    "PytorchStreamWriter failed writing file",
];

/// The line of `text` saying a write failed (the last one).
pub fn write_failed(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .find(|l| SIGNATURES.iter().any(|s| l.contains(s)))
        .map(|l| l.trim().to_string())
}

/// Absolute paths a line or traceback names (`'/ckpt/step3.pt'`, `"/ckpt/x"`), in
/// order, without duplicates: where the rank was writing.
pub fn paths_named(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for quote in ['\'', '"'] {
        for (i, part) in text.split(quote).enumerate() {
            let p = part.trim();
            if i % 2 == 1
                && p.starts_with('/')
                && !p.contains(char::is_whitespace)
                && !p.ends_with(".py")
                && !out.iter().any(|o| o == p)
            {
                out.push(p.to_string());
            }
        }
    }
    out
}

/// A volume as statvfs saw it after the failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// The path the rank wrote (or its nearest existing parent).
    pub path: String,
    pub total: u64,
    pub free: u64,
    pub read_only: bool,
}

impl Volume {
    /// `its volume is full (1 MiB, 0 B free)`.
    pub fn text(&self) -> String {
        let state = if self.read_only {
            "read-only"
        } else if self.free < (1 << 20).min(self.total / 100 + 1) {
            "full"
        } else {
            "not full now"
        };
        format!(
            "its volume is {state} ({}, {} free)",
            format_size(self.total),
            format_size(self.free)
        )
    }
}

pub const FIX: &str = "free or grow the volume (a PersistentVolumeClaim's size, an emptyDir's sizeLimit), keep fewer checkpoints, or write them elsewhere; a read-only volume: mount it read-write (readOnly: false)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_volume_behind_pytorchs_words() {
        let out = "Traceback (most recent call last):\n  File \"/app/train.py\", line 9, in save\n    torch.save(state, '/ckpt/step3.pt')\nRuntimeError: [enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598\n";
        assert!(write_failed(out).unwrap().contains("unexpected pos 704"));
        assert_eq!(paths_named(out), ["/ckpt/step3.pt"]);
        assert!(write_failed("OSError: [Errno 28] No space left on device: '/ckpt/x'").is_some());
        assert_eq!(write_failed("all fine\n"), None);
    }

    #[test]
    fn the_volume_says_full_read_only_or_not() {
        let v = Volume {
            path: "/ckpt".into(),
            total: 1 << 20,
            free: 0,
            read_only: false,
        };
        assert_eq!(v.text(), "its volume is full (1 MiB, 0 B free)");
        let ro = Volume {
            read_only: true,
            ..v.clone()
        };
        assert!(ro.text().contains("is read-only"));
        let roomy = Volume {
            free: 512 << 20,
            total: 1 << 30,
            ..v
        };
        assert!(roomy.text().contains("not full now"));
    }
}

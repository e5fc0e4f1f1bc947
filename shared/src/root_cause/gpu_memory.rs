//! CUDA out of memory, as PyTorch says it: what was asked, what was free of the
//! GPU's capacity, and how much PyTorch reserved without using (fragmentation, which
//! expandable segments address).

/// The numbers of PyTorch's message; None where the message is not CUDA's OOM.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOom {
    pub asked: Option<String>,
    pub free: Option<String>,
    pub capacity: Option<String>,
    /// "reserved by PyTorch but unallocated".
    pub reserved_unused: Option<String>,
    /// In GiB, to judge whether fragmentation matters.
    pub reserved_unused_gib: Option<f64>,
}

/// The text between `before` and `after` in `s`.
fn between<'a>(s: &'a str, before: &str, after: &str) -> Option<&'a str> {
    let rest = &s[s.find(before)? + before.len()..];
    Some(rest[..rest.find(after)?].trim())
}

fn gib(size: &str) -> Option<f64> {
    let (n, unit) = size.split_once(' ')?;
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "GiB" => n,
        "MiB" => n / 1024.0,
        "KiB" => n / (1024.0 * 1024.0),
        _ => return None,
    })
}

/// PyTorch's `CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total
/// capacity of 79.18 GiB of which 6.66 GiB is free. ... 1.90 GiB is reserved by
/// PyTorch but unallocated.`
pub fn cuda_oom(text: &str) -> Option<CudaOom> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("CUDA out of memory"))?;
    // "8.00 GiB." holds a decimal point: the number and its unit, not up to a '.'.
    let asked = line.split("Tried to allocate ").nth(1).map(|r| {
        let words: Vec<&str> = r.split_whitespace().take(2).collect();
        words.join(" ").trim_end_matches('.').to_string()
    });
    let reserved = between(
        line,
        "allocated by PyTorch, and ",
        " is reserved by PyTorch but unallocated",
    );
    Some(CudaOom {
        asked,
        free: between(line, "of which ", " is free").map(str::to_string),
        capacity: between(line, "total capacity of ", " of which").map(str::to_string),
        reserved_unused: reserved.map(str::to_string),
        reserved_unused_gib: reserved.and_then(gib),
    })
}

impl CudaOom {
    /// `asked 8.00 GiB with 6.66 GiB free of 79.18 GiB`.
    pub fn numbers(&self) -> String {
        match (&self.asked, &self.free, &self.capacity) {
            (Some(a), Some(f), Some(c)) => format!("asked {a} with {f} free of {c}"),
            (Some(a), _, _) => format!("asked {a}"),
            _ => "PyTorch gave no numbers".to_string(),
        }
    }

    /// The usual fixes, expandable segments first where PyTorch held much memory
    /// reserved but unused.
    pub fn fix(&self) -> String {
        let common = "a smaller micro-batch (with gradient accumulation to keep the global batch), activation checkpointing, or sharding the model further (FSDP)";
        match self.reserved_unused_gib {
            Some(g) if g >= 1.0 => format!("{} is reserved by PyTorch but unallocated (fragmentation): set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; else {common}", self.reserved_unused.as_deref().unwrap_or("much")),
            _ => common.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MSG: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 6.66 GiB is free. Including non-PyTorch memory, this process has 72.51 GiB memory in use. Of the allocated memory 70.10 GiB is allocated by PyTorch, and 1.90 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.";

    #[test]
    fn pytorchs_numbers_and_the_fix() {
        let o = cuda_oom(MSG).unwrap();
        assert_eq!(
            o.numbers(),
            "asked 8.00 GiB with 6.66 GiB free of 79.18 GiB"
        );
        assert!(o
            .fix()
            .starts_with("1.90 GiB is reserved by PyTorch but unallocated"));
        assert_eq!(cuda_oom("RuntimeError: boom"), None);
    }
}

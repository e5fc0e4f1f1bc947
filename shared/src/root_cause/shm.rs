//! /dev/shm exhausted: PyTorch's messages when shared memory runs out (a DataLoader
//! with workers passes batches through /dev/shm, 64 MiB in a default container).

/// What PyTorch prints: a tensor that cannot be put in shared memory, and a worker
/// killed by SIGBUS when pages fail at first touch.
const SIGNATURES: [&str; 2] = [
    "unable to allocate shared memory(shm)",
    "insufficient shared memory (shm)",
];

/// The line of `text` that says /dev/shm ran out, the last one if several.
pub fn shm_exhausted(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .find(|l| SIGNATURES.iter().any(|s| l.contains(s)))
        .map(|l| l.trim().to_string())
}

/// The fix, for a pod.
pub const FIX: &str = "give the pod a larger /dev/shm: an emptyDir volume with `medium: Memory` and a `sizeLimit` (for example 16Gi) mounted at /dev/shm (docker: --shm-size or --ipc=host), or fewer DataLoader workers";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_messages_are_found() {
        let full = "x\n[rank0]: RuntimeError: unable to allocate shared memory(shm) for file </torch_123_456_0>: No space left on device (28)\n";
        assert!(shm_exhausted(full)
            .unwrap()
            .contains("No space left on device"));
        let bus = "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).\n";
        assert!(shm_exhausted(bus).is_some());
        assert_eq!(shm_exhausted("No space left on device\n"), None);
    }
}

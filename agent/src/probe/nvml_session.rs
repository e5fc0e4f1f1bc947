//! NVML, initialised once for the process and never shut down. On a 2x H100 host
//! nvmlShutdown took 4-16 ms and the next nvmlInit 3.5-10 ms
//! (`tests/fixtures/device/startup-h100x2/`), and the host probe, the Xid watch, the
//! GPU release check and the straggler's clocks each opened NVML anew, the first two
//! before the ranks start. The driver releases it when the process exits.

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::sync::OnceLock;

/// The process's NVML; an error (tried again on the next call) where the library or
/// the driver is missing.
pub fn nvml() -> Result<&'static Nvml, NvmlError> {
    static NVML: OnceLock<Nvml> = OnceLock::new();
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let n = Nvml::init()?;
    // Two first callers at once: the loser's handle is dropped, which only lowers
    // NVML's own reference count.
    Ok(NVML.get_or_init(|| n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_caller_gets_the_same_handle_or_the_same_answer() {
        match (nvml(), nvml()) {
            (Ok(a), Ok(b)) => assert!(std::ptr::eq(a, b)),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("NVML answered {:?} then {:?}", a.is_ok(), b.is_ok()),
        }
    }
}

//! Where facts come from: a facts file, a live probe, and optionally GPU links from a
//! `nvidia-smi topo -m` capture.

use crate::exit::CannotRun;
use anyhow::Result;
use std::path::Path;
use toporun_agent::paths::Root;
use toporun_agent::probe::{probe_host, NvmlProbe};
use toporun_shared::facts::{Gpu, HostFacts};
use toporun_shared::smi_topo;

/// Reads a user-given file up to `MAX_FACTS_BYTES` (`/dev/zero` or a log passed by
/// mistake must not exhaust memory).
fn read_capped(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let limit = toporun_shared::facts::MAX_FACTS_BYTES;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB: not a facts file or capture",
            limit >> 20
        )));
    }
    Ok(text)
}

pub fn load(facts_file: Option<&String>, smi_topo_file: Option<&String>) -> Result<HostFacts> {
    let mut facts = match facts_file {
        Some(path) => {
            let text = read_capped(Path::new(path))
                .map_err(|e| CannotRun(format!("cannot read facts file {path}: {e}")))?;
            HostFacts::from_json(&text).map_err(|e| CannotRun(format!("{path}: {e}")))?
        }
        None => probe_host(&Root::live(), &NvmlProbe, crate::text_env::variables()),
    };
    if let Some(path) = smi_topo_file {
        apply_smi_topo(&mut facts, Path::new(path))?;
    }
    Ok(facts)
}

/// Facts only where the user gave some (a file or a capture); never probes.
pub fn load_given(
    facts_file: Option<&String>,
    smi_topo_file: Option<&String>,
) -> Result<Option<HostFacts>> {
    if facts_file.is_none() && smi_topo_file.is_none() {
        return Ok(None);
    }
    let mut facts = match facts_file {
        Some(_) => load(facts_file, None)?,
        None => HostFacts::default(),
    };
    if let Some(path) = smi_topo_file {
        apply_smi_topo(&mut facts, Path::new(path))?;
    }
    Ok(Some(facts))
}

/// Replaces the GPU links with a capture's; `<name>-p2p-read.txt`/`-p2p-write.txt`
/// beside it (nvidia-smi topo -p2p r|w) supply P2P status when present.
fn apply_smi_topo(facts: &mut HostFacts, path: &Path) -> Result<()> {
    let text = read_capped(path).map_err(|e| {
        CannotRun(format!(
            "cannot read nvidia-smi capture {}: {e}",
            path.display()
        ))
    })?;
    let topo =
        smi_topo::parse_matrix(&text).map_err(|e| CannotRun(format!("{}: {e}", path.display())))?;
    let sibling = |kind: &str| {
        let stem = path.file_stem()?.to_string_lossy().into_owned();
        let p = path.with_file_name(format!("{stem}-p2p-{kind}.txt"));
        smi_topo::parse_p2p(&read_capped(&p).ok()?).ok()
    };
    let (read, write) = (sibling("read"), sibling("write"));
    let mut gpus = topo.into_gpu_facts(read.as_deref(), write.as_deref());
    // Keep what the facts knew of each device (names, UUIDs) where counts agree.
    if facts.gpus.devices.len() == gpus.devices.len() {
        for (new, old) in gpus.devices.iter_mut().zip(&facts.gpus.devices) {
            let affinity = std::mem::take(&mut new.cpu_affinity);
            *new = Gpu {
                cpu_affinity: if affinity.is_empty() {
                    old.cpu_affinity.clone()
                } else {
                    affinity
                },
                ..old.clone()
            };
        }
        gpus.device_nodes = facts.gpus.device_nodes.clone();
    }
    facts.gpus = gpus;
    Ok(())
}

//! CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES as CUDA and the container toolkit
//! read them.

use crate::facts::GpuFacts;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Unset or "all".
    All,
    /// Empty, "none" or "void".
    None,
    /// Indices, UUIDs (GPU-...) or MIG ids, in order; CUDA stops at the first invalid one.
    List(Vec<String>),
}

impl VisibleDevices {
    pub fn parse(text: &str) -> Self {
        match text.trim() {
            "all" => VisibleDevices::All,
            "" | "none" | "void" | "NoDevFiles" => VisibleDevices::None,
            list => VisibleDevices::List(list.split(',').map(|s| s.trim().to_string()).collect()),
        }
    }
}

/// The GPUs (indices into `gpus.devices`) CUDA will use, in CUDA's order, given
/// CUDA_VISIBLE_DEVICES: indices or UUID prefixes; CUDA stops at the first invalid
/// entry; unset means all of them.
pub fn cuda_devices(cvd: Option<&str>, gpus: &GpuFacts) -> Vec<usize> {
    let n = gpus.count();
    let list = match cvd.map(VisibleDevices::parse) {
        None | Some(VisibleDevices::All) => return (0..n).collect(),
        Some(VisibleDevices::None) => return Vec::new(),
        Some(VisibleDevices::List(list)) => list,
    };
    let mut out = Vec::new();
    for entry in &list {
        let found = match entry.parse::<usize>() {
            Ok(i) if i < n => Some(i),
            Ok(_) => None,
            Err(_) => gpus
                .devices
                .iter()
                .position(|d| !d.uuid.is_empty() && d.uuid.starts_with(entry.as_str())),
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// What is wrong with a CUDA_VISIBLE_DEVICES list given the GPUs this container has.
pub fn mismatch(cvd: VisibleDevices, visible: usize, gpus: &GpuFacts) -> Option<String> {
    let VisibleDevices::List(list) = cvd else {
        return match cvd {
            VisibleDevices::None => Some("it hides every GPU".into()),
            _ => None,
        };
    };
    for entry in &list {
        if let Ok(i) = entry.parse::<usize>() {
            if i >= visible {
                return Some(format!("it names device {i} but only {visible} GPU(s) exist here (0..{}); CUDA ignores it and everything after it", visible.saturating_sub(1)));
            }
        } else if entry.starts_with("GPU-")
            && !gpus.devices.is_empty()
            && !gpus
                .devices
                .iter()
                .any(|d| d.uuid.starts_with(entry.as_str()))
        {
            return Some(format!(
                "it names {entry}, which is not one of this container's GPUs"
            ));
        }
    }
    None
}

/// The GPU (an index into the facts' GPUs) local rank `local_rank` uses: the
/// local_rank-th of `cuda_gpus`, ranks beyond them sharing them in turn.
pub fn rank_gpu(cuda_gpus: &[usize], local_rank: u32) -> Option<usize> {
    cuda_gpus
        .get(local_rank as usize % cuda_gpus.len().max(1))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        assert_eq!(VisibleDevices::parse("all"), VisibleDevices::All);
        assert_eq!(VisibleDevices::parse("void"), VisibleDevices::None);
        assert_eq!(
            VisibleDevices::parse("0, 2"),
            VisibleDevices::List(vec!["0".into(), "2".into()])
        );
    }

    #[test]
    fn cuda_sees_the_listed_devices_up_to_the_first_invalid_one() {
        use crate::facts::Gpu;
        let g = GpuFacts {
            devices: (0..4)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-{i}abc"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        assert_eq!(cuda_devices(None, &g), vec![0, 1, 2, 3]);
        assert_eq!(cuda_devices(Some("2,3"), &g), vec![2, 3]);
        assert_eq!(cuda_devices(Some("1,9,2"), &g), vec![1]);
        assert_eq!(cuda_devices(Some("GPU-3"), &g), vec![3]);
        assert_eq!(cuda_devices(Some(""), &g), Vec::<usize>::new());
    }

    #[test]
    fn index_out_of_range_is_named() {
        let g = GpuFacts::default();
        assert!(mismatch(VisibleDevices::parse("0,1"), 1, &g)
            .unwrap()
            .contains("device 1"));
        assert_eq!(mismatch(VisibleDevices::parse("0"), 1, &g), None);
    }
}

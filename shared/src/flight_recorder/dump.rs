//! One rank's flight-recorder dump (PyTorch's pickle, version "2.x"): the entries
//! toporun matches across ranks. Unknown fields are ignored; garbage is an error.

use serde::{Deserialize, Serialize};
use serde_pickle::{HashableValue, Value};
use std::collections::BTreeMap;

/// One recorded collective or point-to-point operation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The process group's name (`"0"` for the default group).
    pub group: String,
    pub collective_seq_id: u64,
    pub p2p_seq_id: u64,
    pub is_p2p: bool,
    /// `gloo:all_reduce`, `nccl:all_gather`...
    pub op: String,
    /// scheduled, started or completed (gloo leaves every entry `scheduled`).
    pub state: String,
    /// The work finished and left the recorder's active list.
    pub retired: bool,
    pub input_sizes: String,
    pub input_dtypes: String,
    /// When the rank queued it (ns since the epoch, on the rank's clock).
    #[serde(default)]
    pub time_created_ns: u64,
    /// Its time on the GPU (ns), where the rank times its collectives
    /// (TORCH_NCCL_ENABLE_TIMING) and the work has finished.
    #[serde(default)]
    pub duration_ns: Option<u64>,
    /// Bytes of its input and output tensors, where the dtype is known.
    #[serde(default)]
    pub bytes: Option<Bytes>,
}

/// A collective's input and output sizes in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bytes {
    pub input: u64,
    pub output: u64,
}

impl Entry {
    /// Completed: NCCL says so in `state`; gloo only retires the entry.
    pub fn completed(&self) -> bool {
        self.state == "completed" || self.retired
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    pub rank: u32,
    pub version: String,
    pub entries: Vec<Entry>,
    /// Each process group's size, by name (`pg_config`).
    #[serde(default)]
    pub group_sizes: BTreeMap<String, u32>,
}

impl Dump {
    /// The dump with its last `keep` entries only (what a node sends to the others).
    pub fn recent(&self, keep: usize) -> Dump {
        let skip = self.entries.len().saturating_sub(keep);
        Dump {
            entries: self.entries[skip..].to_vec(),
            ..self.clone()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    #[error("not a pickle: {0}")]
    NotPickle(String),
    #[error("a pickle, but no flight-recorder dump: {0}")]
    NotDump(&'static str),
}

fn get<'a>(d: &'a BTreeMap<HashableValue, Value>, key: &str) -> Option<&'a Value> {
    d.get(&HashableValue::String(key.to_string()))
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::I64(i)) => i.to_string(),
        Some(Value::Tuple(t)) | Some(Value::List(t)) => {
            t.first().map(|x| text(Some(x))).unwrap_or_default()
        }
        Some(other) => format!("{other}"),
        None => String::new(),
    }
}

fn number(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::I64(i)) => u64::try_from(*i).unwrap_or(0),
        _ => 0,
    }
}

/// Elements of every tensor a `[[d0, d1], [d0]]` size list names.
fn elements(v: Option<&Value>) -> Option<u64> {
    let Some(Value::List(tensors)) = v else {
        return None;
    };
    let mut total = 0u64;
    for t in tensors {
        let Value::List(dims) = t else { return None };
        let n = dims.iter().try_fold(1u64, |n, d| match d {
            Value::I64(d) => n.checked_mul(u64::try_from(*d).ok()?),
            _ => None,
        })?;
        total = total.checked_add(n)?;
    }
    Some(total)
}

/// Bytes of one element of torch's dtype names (`Float`, `BFloat16`...).
fn dtype_bytes(v: Option<&Value>) -> Option<u64> {
    let Some(Value::List(l)) = v else { return None };
    let Some(Value::String(name)) = l.first() else {
        return None;
    };
    Some(match name.as_str() {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" => 4,
        "Half" | "BFloat16" | "Short" => 2,
        "Byte" | "Char" | "Bool" => 1,
        n if n.starts_with("Float8") => 1,
        _ => return None,
    })
}

fn bytes(d: &BTreeMap<HashableValue, Value>) -> Option<Bytes> {
    let size = dtype_bytes(get(d, "input_dtypes"))?;
    Some(Bytes {
        input: elements(get(d, "input_sizes"))?.checked_mul(size)?,
        output: elements(get(d, "output_sizes"))
            .unwrap_or(0)
            .saturating_mul(size),
    })
}

/// `duration_ms` (a float) in ns.
fn duration_ns(v: Option<&Value>) -> Option<u64> {
    match v {
        Some(Value::F64(ms)) if ms.is_finite() && *ms >= 0.0 => Some((ms * 1e6) as u64),
        _ => None,
    }
}

/// Each group's size from `pg_config` (`{"0": {"ranks": "[0, 1]"}}`; the ranks as a
/// string in 2.x dumps, a list in some).
fn group_sizes(d: &BTreeMap<HashableValue, Value>) -> BTreeMap<String, u32> {
    let Some(Value::Dict(groups)) = get(d, "pg_config") else {
        return BTreeMap::new();
    };
    groups
        .iter()
        .filter_map(|(name, cfg)| {
            let HashableValue::String(name) = name else {
                return None;
            };
            let Value::Dict(cfg) = cfg else { return None };
            let n = match get(cfg, "ranks")? {
                Value::List(l) => l.len(),
                Value::String(s) if s.trim_matches(['[', ']', ' ']).is_empty() => 0,
                Value::String(s) => s.split(',').count(),
                _ => return None,
            };
            Some((name.clone(), u32::try_from(n).ok()?))
        })
        .collect()
}

fn entry(v: &Value) -> Option<Entry> {
    let Value::Dict(d) = v else { return None };
    let shown = |k: &str| get(d, k).map(|x| format!("{x}")).unwrap_or_default();
    Some(Entry {
        group: text(get(d, "process_group")),
        collective_seq_id: number(get(d, "collective_seq_id")),
        p2p_seq_id: number(get(d, "p2p_seq_id")),
        is_p2p: matches!(get(d, "is_p2p"), Some(Value::Bool(true))),
        op: text(get(d, "profiling_name")),
        state: text(get(d, "state")),
        retired: matches!(get(d, "retired"), Some(Value::Bool(true))),
        input_sizes: shown("input_sizes"),
        input_dtypes: shown("input_dtypes"),
        time_created_ns: number(get(d, "time_created_ns")),
        duration_ns: duration_ns(get(d, "duration_ms")),
        bytes: bytes(d),
    })
}

/// Reads rank `rank`'s dump.
pub fn parse(rank: u32, bytes: &[u8]) -> Result<Dump, DumpError> {
    let v = serde_pickle::value_from_slice(
        bytes,
        serde_pickle::DeOptions::new().replace_recursive_structures(),
    )
    .map_err(|e| DumpError::NotPickle(e.to_string()))?;
    let Value::Dict(d) = v else {
        return Err(DumpError::NotDump("the top level is no dict"));
    };
    let Some(Value::List(list)) = get(&d, "entries") else {
        return Err(DumpError::NotDump("no `entries` list"));
    };
    Ok(Dump {
        rank,
        version: text(get(&d, "version")),
        entries: list.iter().filter_map(entry).collect(),
        group_sizes: group_sizes(&d),
    })
}

/// The rank a dump file is named for: `<prefix><rank>` (`rank_3`, `comm_lib_trace_rank_3`).
pub fn rank_of(file_name: &str) -> Option<u32> {
    let digits: String = file_name
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// A test dump: rank `rank`'s all_reduces `seqs` of `bytes` each in group "0" of 2
/// ranks, `at(seq)` giving each one's (time created, GPU duration) in ns.
#[cfg(test)]
pub(crate) fn all_reduces(
    rank: u32,
    seqs: std::ops::Range<u64>,
    bytes: u64,
    at: impl Fn(u64) -> (u64, u64),
) -> Dump {
    let entries = seqs
        .map(|seq| Entry {
            group: "0".into(),
            collective_seq_id: seq,
            op: "nccl:all_reduce".into(),
            state: "completed".into(),
            time_created_ns: at(seq).0,
            duration_ns: Some(at(seq).1),
            bytes: Some(Bytes {
                input: bytes,
                output: bytes,
            }),
            ..Default::default()
        })
        .collect();
    Dump {
        rank,
        version: "2.10".into(),
        entries,
        group_sizes: [("0".to_string(), 2)].into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_empty_and_truncated_are_errors() {
        assert!(matches!(parse(0, b""), Err(DumpError::NotPickle(_))));
        assert!(matches!(
            parse(0, b"not a pickle at all"),
            Err(DumpError::NotPickle(_))
        ));
        // A pickled list (a pickle, but no dump).
        assert!(matches!(
            parse(0, b"\x80\x02]q\x00."),
            Err(DumpError::NotDump(_))
        ));
        assert_eq!(rank_of("rank_12"), Some(12));
        assert_eq!(rank_of("rank_"), None);
    }
}

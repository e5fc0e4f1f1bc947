//! The shared crate: toporun's domain with no I/O. Host facts, findings, the NCCL
//! planner, the torchrun contract, parsers of foreign formats and the TCPStore codec.
#![forbid(unsafe_code)]

pub mod colocation;
pub mod copy_rounds;
pub mod cpu_binding;
pub mod cpulist;
pub mod facts;
pub mod finding;
pub mod finding_id;
pub mod flags;
pub mod flight_recorder;
pub mod host_buffers;
pub mod instance_types;
pub mod link_reference;
pub mod measured;
mod named_enum;
pub mod nccl_counters;
pub mod nccl_env_check;
pub mod nccl_expect;
pub mod nccl_log;
pub mod nccl_vars;
pub mod network_check;
pub mod plan;
pub mod preflight;
pub mod rank_env;
pub mod root_cause;
pub mod smi_topo;
pub mod stacks;
pub mod store;
pub mod toporun_vars;
pub mod torchrun;
pub mod units;
pub mod untrusted;
pub mod user_env;
pub mod version;
pub mod visible_devices;

//! What toporun's NCCL profiler plugin (the `nccl-profiler` crate) tells of each rank:
//! its counters file's layout (`layout`), read into values (`decode`), the hang
//! rule on operations completing (`stall`), GPU time and bandwidth over a window
//! (`window`), and the variables that make the ranks load it (`rank_vars`).

mod counters_place;
pub mod decode;
mod func;
pub mod layout;
pub mod mismatch;
pub mod open_entry;
mod rank_vars;
pub mod sampling;
pub mod stall;
pub mod window;
pub mod words;

pub use counters_place::{CountersPlace, SHM_HEADROOM};
pub use decode::{
    decode, decode_words, CommCounters, CountersError, FuncTotals, PostedOp, RankCounters,
};
pub use func::{datatype_bytes, NcclFunc};
pub use rank_vars::{
    counters_file, profiler_vars, PluginKind, PluginPlaces, Profiler, ProfilerReport, COUNTERS_VAR,
    PLUGIN_FILE, PLUGIN_VAR,
};
pub use sampling::{BadSampling, KernelSampling, SAMPLING_VAR};
pub use stall::{Behind, NcclStall, NcclState, NcclWatch, NodeReading, WaitedOp, WaitsElsewhere};

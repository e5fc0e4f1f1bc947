//! What toporun's NCCL profiler plugin (the `nccl-profiler` crate) tells of each rank:
//! its counters file's layout (`layout`), read into values (`decode`), the hang
//! rule on operations completing (`stall`), and GPU time and bandwidth over a window
//! (`window`).

pub mod decode;
mod func;
pub mod layout;
pub mod stall;
pub mod window;

pub use decode::{decode, CommCounters, CountersError, FuncTotals, OpenOp, RankCounters};
pub use func::{datatype_bytes, NcclFunc};
pub use stall::{Behind, NcclStall, NcclState, NcclWatch, NodeReading};

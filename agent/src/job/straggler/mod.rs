//! Slow, not stopped: which rank the others wait for. At each stack sample every
//! local rank's activity (in a collective, loading data, checkpointing, computing)
//! and what its process and GPU use are kept over a window (`tracker`); in
//! synchronous training the rank that waits least is the one the others wait for.
//! One node decides alone; on several, each publishes its rows in the workers'
//! store and the store's host decides for the job (`exchange`). Under NCCL each
//! rank's GPU time inside collectives comes from NCCL's own counters (toporun's
//! profiler plugin) or its flight recorder, dumped while it trains (`gpu_source`,
//! `gpu_dumps`); the same readings show whether its links carry what they should
//! (`link_watch`).

pub mod exchange;
pub mod gpu_dumps;
pub mod gpu_source;
pub mod link_watch;
pub mod tracker;

pub use tracker::{Decide as StragglerDecide, NodeSeat, Tracker};

//! toporun's in-container runtime: probing the live machine, the TCPStore-compatible
//! store, rendezvous and rank supervision.

mod clock;
pub mod console;
pub mod flight_recorder;
pub mod job;
pub mod nccl_counters;
pub mod nccl_watch;
pub mod network_check;
mod own_thread;
pub mod paths;
pub mod probe;
pub mod rendezvous;
pub mod stacks;
pub mod status;
pub mod store;
pub mod supervise;
pub mod tls;

//! The network check's measuring side (issue 64): after a round closes and before
//! its ranks start, the nodes probe the paths between them over TCP (`probe`) in the
//! schedule's rounds, through the rendezvous state (`exchange`); what is slow is
//! decided in `toporun_shared::network_check`.

mod check_round;
pub mod exchange;
pub mod probe;
pub mod torch_path;
mod torch_round;

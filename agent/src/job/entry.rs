//! What entering a round and watching it give the lifecycle.

use crate::rendezvous::StopReason;
use std::future::Future;
use std::pin::Pin;

use crate::job::spec::NodePlace;

/// Resolves when another node (or the keep-alive check) stops the round.
pub type StopFuture = Pin<Box<dyn Future<Output = StopReason>>>;

/// How a node's entry into a round ended.
pub enum Entered {
    Placed(NodePlace),
    /// A handled signal arrived.
    Signal,
    /// The job finished while this node waited as a spare.
    JobFinished,
}

//! What one node hands the job-wide hang decision (`exchange`) at each sample of its
//! ranks (`watch`).

use std::collections::BTreeMap;
use std::time::Duration;
use toporun_shared::nccl_counters::NodeReading;
use toporun_shared::stacks::hang_report::Context;
use toporun_shared::stacks::teardown::LastSaid;
use toporun_shared::stacks::RankStack;

/// This node's ranks at one sample: how long all have stood still, and where.
#[derive(Debug, Clone, Default)]
pub struct NodeSample {
    pub stalled: Duration,
    pub stacks: Vec<RankStack>,
    /// The ranks that left and each rank's innermost line (read once stalled, or at
    /// every sample with NCCL's counters).
    pub context: Context,
    /// The ranks' NCCL counters, where they load toporun's profiler plugin: the node
    /// hosting the store decides from every node's.
    pub nccl: Option<NodeReading>,
    /// No operation was posted or completed here since the last sample: where the
    /// ranks stand is worth sending (a rank spinning in Python never stands still).
    pub nccl_still: bool,
    /// What each rank last said on stderr (with the context): a teardown's cause.
    pub said: BTreeMap<u32, LastSaid>,
    /// No rank's stack can be read (a C, C++ or JAX program): the counters alone
    /// decide, and `stalled` stays zero so that the stack rule never does.
    pub no_stacks: bool,
}

impl NodeSample {
    /// A sample where no rank's stack reads: the counters, and each rank's place from
    /// its failed read (its rank, local rank and pid) so that a hang can name it.
    pub(super) fn counters_alone(nccl: NodeReading, stacks: &[RankStack]) -> NodeSample {
        NodeSample {
            stacks: stacks.to_vec(),
            nccl: Some(nccl),
            nccl_still: true,
            no_stacks: true,
            ..Default::default()
        }
    }
}

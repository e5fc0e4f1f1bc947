//! Communicator contexts, kept for the life of the process and taken again by later
//! communicators: NCCL may reach a finalised communicator's records (`events` says
//! how), so none is ever freed. Each holds 256 records of 64 channels (about half a
//! MiB): a job that makes and destroys communicators by the hundred reuses the few
//! it has live at once. The context finalised longest ago is taken first, so an
//! event NCCL reports late finds its generation moved on, not a new communicator's
//! records half taken, and only once it has rested (`reuse_grace`). Init and
//! finalize only: a lock is fine.

use crate::counters_file::Slot;
use crate::events::Comm;
use crate::reuse_grace;
use std::collections::VecDeque;
use std::sync::Mutex;

/// Finalised contexts, oldest first, with when.
static FINALISED: Mutex<VecDeque<(&'static Comm, u64)>> = Mutex::new(VecDeque::new());

/// A context for the communicator of `slot`.
pub fn take(slot: Slot) -> &'static Comm {
    let pooled = {
        let mut pool = FINALISED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match pool.front() {
            Some((_, at)) if reuse_grace::rested(*at) => pool.pop_front(),
            _ => None,
        }
    };
    match pooled {
        Some((comm, _)) => {
            comm.take(slot);
            comm
        }
        None => Comm::leak(slot),
    }
}

/// `comm`'s communicator was finalised (its generation already moved on).
pub fn give_back(comm: &'static Comm) {
    FINALISED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push_back((comm, reuse_grace::now_ns()));
}

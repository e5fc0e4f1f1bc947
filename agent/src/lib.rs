//! toporun's in-container runtime: probing the live machine, the TCPStore-compatible
//! store, rendezvous and rank supervision.

/// `eprintln!` that never panics. A launch outlives its console: Rust ignores SIGPIPE,
/// and `eprintln!` panics once stderr's reader has gone (`toporun ... 2>&1 | head`),
/// which lost the failure summary, error file and termination message after it
/// (exit 101). A line written to a console that is gone is dropped.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that never panics (see [`say!`]).
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod clock;
pub mod cloud_metadata;
pub mod flight_recorder;
pub mod gpu_events;
pub mod job;
pub mod link_bandwidth;
pub mod nccl_watch;
mod own_thread;
pub mod paths;
pub mod probe;
pub mod rendezvous;
pub mod stacks;
pub mod status;
pub mod store;
pub mod supervise;
pub mod tls;

//! PyTorch's flight recorder read for the user: each rank's dump parsed (`dump`) and
//! matched across ranks (`matching`), naming the collective some ranks never entered
//! and what those last completed, or the rank whose sizes or dtypes differ; and each
//! rank's GPU time inside collectives while the job trains (`gpu_time`), and how
//! fast the links carried them against what they should (`link_speed`); and the
//! recorder's variables toporun gives the ranks (`rank_vars`).

mod dump;
mod gpu_time;
mod link_speed;
mod matching;
mod rank_vars;

pub use dump::{parse, rank_of, Bytes, Dump, DumpError, Entry};
pub use gpu_time::{gpu_times, CommTime, GpuTime, KindBusbw, MIN_BUSBW_BYTES};
pub use link_speed::{link_speeds, slow_links_line, LinkModel, LinkSpeed, SLOW_LINKS};
pub use matching::{analyze, headline, render_text, Issue, Missing, Report};
pub use rank_vars::{
    dump_dir, monitor_polls, pipe_opens, pipe_prefix, recorder_vars, timing_vars, toporun_dumps,
    user_dump_prefix, RecorderSwitches, UserEnv, DUMP_ON_TIMEOUT_VAR, DUMP_PREFIX_VAR,
    OLD_DUMP_PREFIX_VAR, PIPE_BUFFER_VAR, PIPE_VARS, RECORDER_DEFAULTS, TIMING_VAR,
};

//! PyTorch's flight recorder read for the user: each rank's dump parsed (`dump`) and
//! matched across ranks (`matching`), naming the collective some ranks never entered
//! and what those last completed, or the rank whose sizes or dtypes differ; and each
//! rank's GPU time inside collectives while the job trains (`gpu_time`), and how
//! fast the links carried them against what they should (`link_speed`).

mod dump;
mod gpu_time;
mod link_speed;
mod matching;

pub use dump::{parse, rank_of, Bytes, Dump, DumpError, Entry};
pub use gpu_time::{gpu_times, GpuTime, KindBusbw, MIN_BUSBW_BYTES};
pub use link_speed::{link_speeds, slow_links_line, LinkModel, LinkSpeed, SLOW_LINKS};
pub use matching::{analyze, headline, render_text, Issue, Missing, Report};

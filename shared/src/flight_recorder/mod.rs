//! PyTorch's flight recorder read for the user: each rank's dump parsed (`dump`) and
//! matched across ranks (`matching`), naming the collective some ranks never entered
//! and what those last completed, or the rank whose sizes or dtypes differ.

mod dump;
mod matching;

pub use dump::{parse, rank_of, Dump, DumpError, Entry};
pub use matching::{analyze, headline, render_text, Issue, Missing, Report};

//! The Python stacks of a job's ranks, as data: what a capture gives (`RankStack`),
//! grouped across ranks with the odd ones first (`merge`), and whether ranks still make
//! progress (`progress`).

mod merge;
mod model;
pub mod progress;

pub use merge::{merge, render_text, Group};
pub use model::{Frame, RankStack, ThreadStack};

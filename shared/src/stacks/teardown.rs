//! A rank that tears its process group down (`destroy_process_group`) while the others
//! still wait for it: its loop ended, by an exception or an exit that its framework
//! caught to clean up (Lightning does, on any exception), and the teardown then waits
//! under NCCL. Its stack says only "teardown"; what it raised, or last printed, before
//! is the cause.

use super::hang_report::Hang;
use crate::root_cause::last_words::last_words;
use crate::root_cause::python_error::{ends_in_exception, last_exception};
use std::collections::BTreeMap;

/// The frame that says a rank tears its process group down.
const TEARDOWN: &str = "destroy_process_group";

/// What a rank said last on stderr, read from its output's tail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LastSaid {
    /// Its last complete traceback: `RuntimeError: loss became NaN (train.py:82)`.
    Raised(String),
    /// No traceback: its last lines of its own.
    Words(String),
}

impl LastSaid {
    /// From a rank's stderr tail (escapes removed); None where it said nothing. A
    /// traceback counts only where it ends the tail: an older one, caught and logged
    /// (a retry, `logging.exception`), is not why the rank stopped.
    pub fn of(output: &str) -> Option<LastSaid> {
        match last_exception(output).filter(|_| ends_in_exception(output)) {
            Some(e) => Some(LastSaid::Raised(e.line())),
            None => last_words(output).map(LastSaid::Words),
        }
    }

    /// Cut to `chars`, to travel to the deciding node within the store's bound.
    pub fn cut(self, chars: usize) -> LastSaid {
        let cut = |s: String| s.chars().take(chars).collect();
        match self {
            LastSaid::Raised(s) => LastSaid::Raised(cut(s)),
            LastSaid::Words(s) => LastSaid::Words(cut(s)),
        }
    }
}

/// The clause to add to `hang`'s headline for its first odd rank that stands in its
/// teardown and said something before: None where none does.
pub fn teardown_cause(hang: &Hang, said: &BTreeMap<u32, LastSaid>) -> Option<String> {
    let in_teardown = |rank: u32| {
        hang.groups
            .iter()
            .any(|g| g.ranks.contains(&rank) && g.frames.iter().any(|f| f.function == TEARDOWN))
    };
    let (rank, last) = hang
        .odd
        .iter()
        .filter(|r| in_teardown(**r))
        .find_map(|r| Some((*r, said.get(r)?)))?;
    Some(match last {
        LastSaid::Raised(e) => format!(
            "; before its teardown rank {rank} raised {e}: that is the cause, its teardown only waits for the others"
        ),
        LastSaid::Words(w) => format!(
            "; its last words on stderr before its teardown: \"{w}\" (its teardown only waits for the others)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::{Frame, Group};

    fn hang(odd: Vec<u32>, function: &str) -> Hang {
        let frame = |function: &str| Frame {
            function: function.into(),
            file: "distributed/distributed_c10d.py".into(),
            line: 2319,
        };
        Hang {
            stalled_secs: 15.0,
            timeout_secs: 15.0,
            groups: vec![Group {
                ranks: vec![1],
                frames: vec![frame(function), frame("_destroy_dist_connection")],
                error: None,
            }],
            odd,
            headline: "rank 1 never posted all_reduce".into(),
            trigger: None,
        }
    }

    /// Lightning on 2x H200 (issue 61): rank 1 raised at step 30, Lightning caught it
    /// and tore the process group down, which waits while rank 0 sits in its
    /// all_reduce. The report said only "stuck in destroy_process_group".
    #[test]
    fn a_rank_in_its_teardown_is_said_with_what_it_raised_or_said_before() {
        let tail = "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/w/trainer_common.py\", line 82, in at\n[rank1]:     raise RuntimeError(f\"loss became NaN at step {step} (injected)\")\n[rank1]: RuntimeError: loss became NaN at step 30 (injected)\n";
        let said: BTreeMap<u32, LastSaid> = [(1, LastSaid::of(tail).unwrap())].into();
        let c = teardown_cause(&hang(vec![1], TEARDOWN), &said).unwrap();
        assert_eq!(
            c,
            "; before its teardown rank 1 raised RuntimeError: loss became NaN at step 30 (injected) (trainer_common.py:82): that is the cause, its teardown only waits for the others"
        );
        let exit = "rank 1: giving up at step 30: the shard's checksum does not match\n";
        let said: BTreeMap<u32, LastSaid> = [(1, LastSaid::of(exit).unwrap())].into();
        let c = teardown_cause(&hang(vec![1], TEARDOWN), &said).unwrap();
        assert!(
            c.contains("\"rank 1: giving up at step 30: the shard's checksum does not match\""),
            "{c}"
        );
        // A traceback caught and logged, then more output: its words, not "the cause".
        let logged = format!("{tail}epoch 3: loss 0.12\n");
        let said: BTreeMap<u32, LastSaid> = [(1, LastSaid::of(&logged).unwrap())].into();
        let c = teardown_cause(&hang(vec![1], TEARDOWN), &said).unwrap();
        assert!(c.contains("last words") && !c.contains("raised"), "{c}");
        // Not in its teardown, or not the odd one: its output says nothing of the hang.
        assert_eq!(teardown_cause(&hang(vec![1], "read_shard"), &said), None);
        assert_eq!(teardown_cause(&hang(vec![0], TEARDOWN), &said), None);
        assert_eq!(
            teardown_cause(&hang(vec![1], TEARDOWN), &BTreeMap::new()),
            None
        );
    }
}

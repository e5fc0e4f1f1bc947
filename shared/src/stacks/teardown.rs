//! A rank that tears its process group down (`destroy_process_group`) while the others
//! still wait for it: its loop ended, by an exception or an exit that its framework
//! caught to clean up (Lightning does, on any exception), and the teardown then waits
//! under NCCL. Its stack says only "teardown"; what it raised, or last printed, before
//! is the cause.

use super::hang_report::Hang;
use super::Frame;
use crate::root_cause::last_words::last_words;
use crate::root_cause::python_error::{ends_in_exception, last_exception};
use std::collections::BTreeMap;

/// The frames that say a rank tears down: torch's `destroy_process_group`, and
/// Lightning's teardown, which first moves the optimizers' state to the CPU (waiting
/// for what is still queued on the GPU) and prints what it caught only once done.
const TEARDOWN_CALLS: &[&str] = &["destroy_process_group", "Trainer._teardown"];

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
/// teardown: what it said before, or, in Lightning's teardown after an exception it
/// caught, that the exception is not printed yet. None where no odd rank tears down
/// or nothing says why (a rank whose loop simply ended tears down too).
pub fn teardown_cause(hang: &Hang, said: &BTreeMap<u32, LastSaid>) -> Option<String> {
    let frames = |rank: u32| {
        let g = hang.groups.iter().find(|g| g.ranks.contains(&rank))?;
        let tears = g
            .frames
            .iter()
            .any(|f| TEARDOWN_CALLS.contains(&f.function.as_str()));
        tears.then_some(g.frames.as_slice())
    };
    let (rank, frames) = hang.odd.iter().find_map(|r| Some((*r, frames(*r)?)))?;
    let lightning = caught_by_lightning(frames);
    Some(match said.get(&rank) {
        Some(LastSaid::Raised(e)) => format!(
            "; before its teardown rank {rank} raised {e}: that is the cause, its teardown only waits for the others"
        ),
        // What it said last is from before the exception Lightning holds back.
        _ if lightning => {
            let gpu = frames.iter().any(|f| f.function == "_optimizers_to_device");
            format!(
                "; rank {rank} is in Lightning's teardown after an exception it caught (Trainer._teardown from _call_and_handle_interrupt): Lightning prints the exception only once the teardown returns{}",
                if gpu {
                    ", and the teardown, moving the optimizers' state to the CPU, waits for what is still queued on its GPU"
                } else {
                    ""
                }
            )
        }
        Some(LastSaid::Words(w)) => format!(
            "; its last words on stderr before its teardown: \"{w}\" (its teardown only waits for the others)"
        ),
        None => return None,
    })
}

/// Lightning's `_call_and_handle_interrupt` calls `Trainer._teardown` straight from
/// its `except` branch; at a normal end `Trainer._run` does.
fn caught_by_lightning(frames: &[Frame]) -> bool {
    frames.windows(2).any(|w| {
        w[0].function == "Trainer._teardown" && w[1].function == "_call_and_handle_interrupt"
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::Group;

    const TEARDOWN: &str = "destroy_process_group";

    fn hang(odd: Vec<u32>, function: &str) -> Hang {
        hang_in(odd, &[function, "_destroy_dist_connection"])
    }

    /// Rank 1 standing in `functions`, innermost first.
    fn hang_in(odd: Vec<u32>, functions: &[&str]) -> Hang {
        let frame = |function: &&str| Frame {
            function: function.to_string(),
            file: "distributed/distributed_c10d.py".into(),
            line: 2319,
        };
        Hang {
            stalled_secs: 15.0,
            timeout_secs: 15.0,
            groups: vec![Group {
                ranks: vec![1],
                frames: functions.iter().map(frame).collect(),
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
        // Tearing down with nothing said: a loop that ended says nothing of the hang.
        assert_eq!(
            teardown_cause(&hang(vec![1], TEARDOWN), &BTreeMap::new()),
            None
        );
    }

    /// Lightning tears down from `_call_and_handle_interrupt`'s except branch after an
    /// exception it holds back; at a normal end from `Trainer._run`. Only the first
    /// says why, whatever it printed before (its start's lines).
    #[test]
    fn lightning_s_teardown_after_an_exception_is_told_from_its_normal_end() {
        let caught = [
            "Strategy.teardown",
            "Trainer._teardown",
            "_call_and_handle_interrupt",
        ];
        let ended = ["Strategy.teardown", "Trainer._teardown", "Trainer._run"];
        let banner = LastSaid::of("LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]\n").unwrap();
        let said: BTreeMap<u32, LastSaid> = [(1, banner)].into();
        let c = teardown_cause(&hang_in(vec![1], &caught), &said).unwrap();
        assert!(
            c.contains("Lightning's teardown after an exception it caught"),
            "{c}"
        );
        assert!(!c.contains("optimizers"), "{c}");
        let c = teardown_cause(&hang_in(vec![1], &ended), &said).unwrap();
        assert!(
            c.contains("last words") && c.contains("CUDA_VISIBLE_DEVICES"),
            "{c}"
        );
        assert_eq!(
            teardown_cause(&hang_in(vec![1], &ended), &BTreeMap::new()),
            None
        );
    }
}

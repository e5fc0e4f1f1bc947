//! A rank that tears its process group down (`destroy_process_group`) while the others
//! still wait for it: its loop ended, by an exception or an exit that its framework
//! caught to clean up (Lightning does, on any exception), and the teardown then waits
//! under NCCL. Its stack says only "teardown"; what it raised, or last printed, before
//! is the cause.

use super::hang_report::Hang;
use super::model::Frame;
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

/// The clause to add to `hang`'s headline for the first odd rank that gives one: in
/// `destroy_process_group`, what it said before; in Lightning's teardown after it
/// caught an exception, that what it caught is not reported yet (what it said before
/// is older). None where no odd rank does (a rank whose loop simply ended tears down
/// too).
pub fn teardown_cause(hang: &Hang, said: &BTreeMap<u32, LastSaid>) -> Option<String> {
    hang.odd.iter().find_map(|&rank| {
        let g = hang.groups.iter().find(|g| g.ranks.contains(&rank))?;
        let lightning = caught_by_lightning(&g.frames);
        if !lightning && !g.frames.iter().any(|f| f.function == TEARDOWN) {
            return None;
        }
        Some(match said.get(&rank) {
            // A traceback that ends its output (a callback printed it): the cause.
            Some(LastSaid::Raised(e)) => format!(
                "; before its teardown rank {rank} raised {e}: that is the cause, its teardown only waits for the others"
            ),
            _ if lightning => lightning_clause(rank, &g.frames),
            Some(LastSaid::Words(w)) => format!(
                "; its last words on stderr before its teardown: \"{w}\" (its teardown only waits for the others)"
            ),
            None => return None,
        })
    })
}

fn lightning_clause(rank: u32, frames: &[Frame]) -> String {
    let gpu = frames
        .iter()
        .any(|f| f.function.ends_with("_optimizers_to_device"));
    format!(
        "; rank {rank} is in Lightning's teardown after it caught an exception or an interrupt (Trainer._teardown from _call_and_handle_interrupt): it reports what it caught only once the teardown returns{}",
        if gpu {
            ", and the teardown, moving the optimizers' state to the CPU, waits for what is still queued on its GPU"
        } else {
            ""
        }
    )
}

/// Lightning's `_call_and_handle_interrupt` (in `trainer/call.py`; a `Trainer`
/// method in Lightning 1.x) calls `Trainer._teardown` straight from its `except`
/// branch; at a normal end `Trainer._run` does. Python before 3.11 names a method
/// without its class: the file says whose it is.
fn caught_by_lightning(frames: &[Frame]) -> bool {
    let in_file = |f: &Frame, file: &str| f.file == file || f.file.ends_with(&format!("/{file}"));
    let is = |f: &Frame, name: &str, files: &[&str]| {
        f.function.rsplit('.').next() == Some(name) && files.iter().any(|x| in_file(f, x))
    };
    let trainer = "trainer/trainer.py";
    frames.windows(2).any(|w| {
        is(&w[0], "_teardown", &[trainer])
            && is(
                &w[1],
                "_call_and_handle_interrupt",
                &["trainer/call.py", trainer],
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stacks::Group;

    fn hang(odd: Vec<u32>, function: &str) -> Hang {
        hang_in(odd, &[function, "_destroy_dist_connection"])
    }

    /// Rank 1 standing in `functions`, innermost first, each in the file its
    /// library keeps it in.
    fn hang_in(odd: Vec<u32>, functions: &[&str]) -> Hang {
        let frame = |function: &&str| Frame {
            function: function.to_string(),
            file: match function.rsplit('.').next() {
                Some("_teardown" | "_run") => "trainer/trainer.py",
                Some("_call_and_handle_interrupt") => "trainer/call.py",
                Some("teardown") => "strategies/strategy.py",
                _ => "distributed/distributed_c10d.py",
            }
            .into(),
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
            named: false,
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
    /// exception or an interrupt it holds back; at a normal end from `Trainer._run`.
    /// Only the first says why, whatever it printed before (its start's lines), and
    /// with Python before 3.11's unqualified names too.
    #[test]
    fn lightning_s_teardown_after_an_exception_is_told_from_its_normal_end() {
        let caught = [
            "Strategy.teardown",
            "Trainer._teardown",
            "_call_and_handle_interrupt",
        ];
        let unqualified = ["teardown", "_teardown", "_call_and_handle_interrupt"];
        let ended = ["Strategy.teardown", "Trainer._teardown", "Trainer._run"];
        let banner = LastSaid::of("LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: [0]\n").unwrap();
        let said: BTreeMap<u32, LastSaid> = [(1, banner)].into();
        for frames in [&caught, &unqualified] {
            let c = teardown_cause(&hang_in(vec![1], frames), &said).unwrap();
            assert!(c.contains("Lightning's teardown after it caught"), "{c}");
            assert!(
                !c.contains("optimizers") && !c.contains("CUDA_VISIBLE"),
                "{c}"
            );
        }
        assert_eq!(teardown_cause(&hang_in(vec![1], &ended), &said), None);
        // The same names in a user's own files are not Lightning's.
        let mut own = hang_in(vec![1], &unqualified);
        for f in &mut own.groups[0].frames {
            f.file = format!("/job/my_{}", f.file);
        }
        assert_eq!(teardown_cause(&own, &BTreeMap::new()), None);
    }

    /// The first odd rank that gives a clause, not the first odd rank: rank 0 tears
    /// down too but said nothing, rank 1 raised before its teardown.
    #[test]
    fn the_clause_is_the_first_odd_rank_s_that_gives_one() {
        let mut h = hang(vec![0, 1], TEARDOWN);
        let mut zero = h.groups[0].clone();
        zero.ranks = vec![0];
        h.groups.insert(0, zero);
        let tail = "Traceback (most recent call last):\n  File \"/w/train.py\", line 82, in step\n    raise RuntimeError(\"bad batch\")\nRuntimeError: bad batch\n";
        let said: BTreeMap<u32, LastSaid> = [(1, LastSaid::of(tail).unwrap())].into();
        let c = teardown_cause(&h, &said).unwrap();
        assert!(c.contains("rank 1 raised RuntimeError: bad batch"), "{c}");
    }
}

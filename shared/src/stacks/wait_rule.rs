//! The straggler rule's measure: a rank's wait share far below the others' median
//! (its bounds, to be named and to stay named), and the median of the others taken
//! from values sorted once. The job-wide rule (`straggler`) and the one per
//! communicator (`comm_waits`) share it.

/// The others must wait at least this share of their time.
pub const MIN_MEDIAN: f64 = 0.20;
/// A straggler waits at most this fraction of the others' median...
pub const MAX_RATIO: f64 = 0.5;
/// ...and at least this much less, in share points.
pub const MIN_GAP: f64 = 0.20;
/// A rank already named stays named while it waits at most this fraction of the
/// median...
pub const HOLD_RATIO: f64 = 0.75;
/// ...and at least this much less.
pub const HOLD_GAP: f64 = 0.10;

/// Values sorted once, so that each rank's "median of the others" costs a binary
/// search, not a sort (the store's host judges every rank of the job each sample).
pub struct Sorted(Vec<f64>);

impl Sorted {
    pub fn of(values: impl Iterator<Item = f64>) -> Sorted {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        Sorted(v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The median of the values without one occurrence of `own` (all of them when
    /// `own` is none or not among them).
    pub fn median_without(&self, own: Option<f64>) -> Option<f64> {
        let v = &self.0;
        let skip = own.and_then(|x| {
            let i = v.partition_point(|y| y.total_cmp(&x).is_lt());
            (i < v.len() && v[i] == x).then_some(i)
        });
        let m = v.len() - usize::from(skip.is_some());
        if m == 0 {
            return None;
        }
        let at = |k: usize| match skip {
            Some(i) if k >= i => v[k + 1],
            _ => v[k],
        };
        Some(if m % 2 == 1 {
            at(m / 2)
        } else {
            (at(m / 2 - 1) + at(m / 2)) / 2.0
        })
    }
}

/// Far below the others' median by the rule to be named, or by the looser one to stay
/// named (`held`).
pub fn far_in_waits(wait: f64, median: f64, held: bool) -> bool {
    let (ratio, gap) = if held {
        (HOLD_RATIO, HOLD_GAP)
    } else {
        (MAX_RATIO, MIN_GAP)
    };
    median >= MIN_MEDIAN && wait <= median * ratio && median - wait >= gap
}

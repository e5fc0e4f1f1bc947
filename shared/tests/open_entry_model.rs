//! The counters' open-ring protocol (`nccl_counters::open_entry`) under loom: every
//! interleaving of the host republishing an entry, the proxy thread stamping its
//! kernel start, and the agent reading it, with the memory model's reorderings. A
//! read that returns an entry returns one operation's fields, never a mix.

use loom::sync::atomic::{fence, AtomicU64};
use loom::sync::Arc;
use std::sync::atomic::Ordering;
use toporun_shared::nccl_counters::layout::SLOT_WORDS;
use toporun_shared::nccl_counters::open_entry::{
    publish, read, stamp_kernel_start, AtomicWords, Entry,
};

struct Model(Vec<AtomicU64>);

impl AtomicWords for Model {
    fn load(&self, i: usize, o: Ordering) -> u64 {
        self.0[i].load(o)
    }
    fn store(&self, i: usize, v: u64, o: Ordering) {
        self.0[i].store(v, o)
    }
    fn fence(&self, o: Ordering) {
        fence(o)
    }
}

fn slot() -> Arc<Model> {
    Arc::new(Model((0..SLOT_WORDS).map(|_| AtomicU64::new(0)).collect()))
}

/// What operation `index` was published with in these tests.
fn fields(index: u64) -> (u64, u64) {
    (index + 100, index * 1000)
}

fn check(index: u64, e: Option<Entry>, stamps: &[(u64, u64)]) {
    let Some(e) = e else { return };
    assert_eq!(
        (e.func_word, e.bytes),
        fields(index),
        "a mixed entry for {index}"
    );
    if let Some(t) = e.kernel_start_ns {
        assert!(
            stamps.contains(&(index, t)),
            "operation {index} read with another's kernel start {t}"
        );
    }
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b
}

#[test]
fn a_republished_entry_is_never_read_mixed() {
    builder().check(|| {
        let w = slot();
        let (f, b) = fields(3);
        publish(&*w, 3, f, b);
        let host = {
            let w = w.clone();
            loom::thread::spawn(move || {
                let (f, b) = fields(11);
                publish(&*w, 11, f, b);
            })
        };
        check(3, read(&*w, 3, true), &[]);
        check(11, read(&*w, 11, true), &[]);
        host.join().unwrap();
        assert!(read(&*w, 11, true).is_some(), "published, then read whole");
    });
}

#[test]
fn a_late_stamp_never_lands_on_a_later_operation() {
    builder().check(|| {
        let w = slot();
        let (f, b) = fields(3);
        publish(&*w, 3, f, b);
        let proxy = {
            let w = w.clone();
            loom::thread::spawn(move || stamp_kernel_start(&*w, 3, 7))
        };
        let (f, b) = fields(11);
        publish(&*w, 11, f, b);
        check(11, read(&*w, 11, true), &[]);
        proxy.join().unwrap();
        check(11, read(&*w, 11, true), &[]);
    });
}

#[test]
fn a_reader_sees_a_stamp_whole_or_not_at_all() {
    builder().check(|| {
        let w = slot();
        let (f, b) = fields(3);
        publish(&*w, 3, f, b);
        let proxy = {
            let w = w.clone();
            loom::thread::spawn(move || stamp_kernel_start(&*w, 3, 7))
        };
        check(3, read(&*w, 3, true), &[(3, 7)]);
        proxy.join().unwrap();
        assert_eq!(read(&*w, 3, true).unwrap().kernel_start_ns, Some(7));
    });
}

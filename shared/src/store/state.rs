//! The store's state machine, with the semantics of PyTorch's libuv server: requests
//! in, replies out (addressed to connections). No I/O, so transcripts replay in tests.

use super::codec::{
    blob, Request, CHECK_NOT_READY, CHECK_READY, VALIDATION_MAGIC, WAIT_CANCELED, WAIT_STOP_WAITING,
};
use std::collections::{HashMap, HashSet, VecDeque};

pub type ConnId = u64;

/// The largest reply built for one request, and the largest value APPEND may grow:
/// beyond it the connection is closed (one MULTI_GET naming an 8 MiB key 2048 times
/// would otherwise build 16 GiB). PyTorch's own limit on one value is 8 MiB.
pub const MAX_REPLY_BYTES: usize = 128 << 20;

#[derive(Debug, Default)]
pub struct StoreState {
    data: HashMap<Vec<u8>, Vec<u8>>,
    queues: HashMap<Vec<u8>, VecDeque<Vec<u8>>>,
    /// key -> connections waiting for it, in arrival order.
    waiting: HashMap<Vec<u8>, Vec<ConnId>>,
    /// connection -> keys it still waits for.
    awaited: HashMap<ConnId, usize>,
    /// Connections that passed the validation handshake.
    validated: HashSet<ConnId>,
    /// Operations served, for the bench's rate.
    pub ops: u64,
}

/// What a request produced: replies for connections, or "close this connection"
/// (with why, for the log).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pub replies: Vec<(ConnId, Vec<u8>)>,
    pub close: bool,
    pub error: Option<String>,
}

/// Why an ADD is refused, as PyTorch's handler throws.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddRefused {
    #[error("ADD on a value that is not an integer ({0:?})")]
    NotAnInteger(String),
    #[error("ADD {delta} to {old} overflows")]
    Overflow { old: i64, delta: i64 },
}

impl Effects {
    fn refuse(why: String) -> Effects {
        Effects {
            replies: Vec::new(),
            close: true,
            error: Some(why),
        }
    }
}

impl StoreState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of keys (GETNUMKEYS).
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// A value, for the agent's own reads.
    /// Drops every key (and queue) `keep` refuses; returns how many went.
    pub fn retain_keys(&mut self, keep: impl Fn(&[u8]) -> bool) -> usize {
        let before = self.data.len() + self.queues.len();
        self.data.retain(|k, _| keep(k));
        self.queues.retain(|k, _| keep(k));
        before - self.data.len() - self.queues.len()
    }

    pub fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.data.get(key)
    }

    /// Sets a value from inside the agent, waking waiters.
    pub fn set(&mut self, key: &[u8], value: Vec<u8>) -> Vec<(ConnId, Vec<u8>)> {
        self.data.insert(key.to_vec(), value);
        self.wake_all(key)
    }

    /// Adds from inside the agent (a value that is no integer counts as 0 here).
    pub fn add(&mut self, key: &[u8], delta: i64) -> (i64, Vec<(ConnId, Vec<u8>)>) {
        let old = self.data.get(key).and_then(|v| stoll(v)).unwrap_or(0);
        let new = old.wrapping_add(delta);
        self.data.insert(key.to_vec(), new.to_string().into_bytes());
        (new, self.wake_all(key))
    }

    pub fn apply(&mut self, conn: ConnId, req: Request) -> Effects {
        let mut fx = Effects::default();
        if !self.validated.contains(&conn) {
            // libuv ignores everything before a good VALIDATE and drops bad ones.
            match req {
                Request::Validate(VALIDATION_MAGIC) => {
                    self.validated.insert(conn);
                }
                _ => fx.close = true,
            }
            return fx;
        }
        self.ops += 1;
        if let Some(why) = self.refusal(&req) {
            return Effects::refuse(why);
        }
        self.serve(conn, req, &mut fx);
        fx
    }

    /// Why a request is refused (the connection closed, as PyTorch's server does
    /// when a handler throws), before anything is built or changed.
    fn refusal(&self, req: &Request) -> Option<String> {
        match req {
            Request::Validate(_) => Some("a second VALIDATE on one connection".into()),
            Request::Add { key, delta } => self
                .checked_add(key, *delta)
                .err()
                .map(|why| why.to_string()),
            Request::MultiGet { keys } => {
                let size: usize = keys
                    .iter()
                    .map(|k| 8 + self.data.get(k).map_or(0, Vec::len))
                    .sum();
                (size > MAX_REPLY_BYTES).then(|| {
                    format!(
                        "MULTI_GET of {} keys would build a {size}-byte reply (limit {MAX_REPLY_BYTES})",
                        keys.len()
                    )
                })
            }
            Request::Append { key, value } => {
                let size = self.data.get(key).map_or(0, Vec::len) + value.len();
                (size > MAX_REPLY_BYTES).then(|| {
                    format!("APPEND would grow a value to {size} bytes (limit {MAX_REPLY_BYTES})")
                })
            }
            _ => None,
        }
    }

    /// Carries out an accepted request: its reply and the waiters it wakes.
    fn serve(&mut self, conn: ConnId, req: Request, fx: &mut Effects) {
        let reply = |fx: &mut Effects, bytes: Vec<u8>| fx.replies.push((conn, bytes));
        let count = |n: usize| (n as i64).to_le_bytes().to_vec();
        match req {
            Request::Validate(_) => {} // refused before
            Request::Ping(nonce) => reply(fx, nonce.to_le_bytes().to_vec()),
            Request::Set { key, value } => {
                self.data.insert(key.clone(), value);
                fx.replies.extend(self.wake_all(&key));
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let current = self.compare_set(&key, expected, desired);
                reply(fx, blob(&current));
                fx.replies.extend(self.wake_all(&key));
            }
            Request::Get { key } => reply(fx, blob(self.value(&key))),
            Request::Add { key, delta } => {
                let v = self.checked_add(&key, delta).unwrap_or_default();
                self.data.insert(key.clone(), v.to_string().into_bytes());
                reply(fx, v.to_le_bytes().to_vec());
                fx.replies.extend(self.wake_all(&key));
            }
            Request::Check { keys } => {
                let ready = self.all_present(&keys);
                reply(fx, vec![if ready { CHECK_READY } else { CHECK_NOT_READY }])
            }
            Request::Wait { keys } => self.wait(conn, keys, fx),
            Request::GetNumKeys => reply(fx, count(self.data.len())),
            Request::DeleteKey { key } => {
                let removed = self.data.remove(&key).is_some();
                reply(fx, count(usize::from(removed)))
            }
            Request::Append { key, value } => {
                self.data
                    .entry(key.clone())
                    .or_default()
                    .extend_from_slice(&value);
                fx.replies.extend(self.wake_all(&key));
            }
            Request::MultiGet { keys } => {
                let out = keys.iter().flat_map(|k| blob(self.value(k))).collect();
                reply(fx, out);
            }
            Request::MultiSet { pairs } => {
                for (k, v) in pairs {
                    self.data.insert(k.clone(), v);
                    fx.replies.extend(self.wake_all(&k));
                }
            }
            Request::CancelWait => {
                self.forget_waits(conn);
                reply(fx, vec![WAIT_CANCELED]);
            }
            Request::QueuePush { key, value } => {
                self.queues.entry(key.clone()).or_default().push_back(value);
                fx.replies.extend(self.wake_one(&key));
            }
            Request::QueuePop { key } => {
                let q = self.queues.entry(key).or_default();
                let mut out = count(q.len());
                if let Some(v) = q.pop_front() {
                    out.extend(blob(&v));
                }
                reply(fx, out);
            }
            Request::QueueLen { key } => {
                reply(fx, count(self.queues.get(&key).map_or(0, VecDeque::len)))
            }
        }
    }

    /// A key's value, empty when absent.
    fn value(&self, key: &[u8]) -> &[u8] {
        self.data.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// COMPARE_SET as PyTorch's server does it: the value after the call.
    fn compare_set(&mut self, key: &[u8], expected: Vec<u8>, desired: Vec<u8>) -> Vec<u8> {
        match self.data.get_mut(key) {
            None if expected.is_empty() => {
                self.data.insert(key.to_vec(), desired.clone());
                desired
            }
            None => expected,
            Some(cur) => {
                if *cur == expected {
                    *cur = desired;
                }
                cur.clone()
            }
        }
    }

    /// WAIT: answered now when every key is there, else the connection waits.
    fn wait(&mut self, conn: ConnId, keys: Vec<Vec<u8>>, fx: &mut Effects) {
        if self.all_present(&keys) {
            fx.replies.push((conn, vec![WAIT_STOP_WAITING]));
            return;
        }
        let mut n = 0;
        for k in keys.into_iter().filter(|k| !self.data.contains_key(k)) {
            self.waiting.entry(k).or_default().push(conn);
            n += 1;
        }
        self.awaited.insert(conn, n);
    }

    /// A connection went away: drop its waits.
    pub fn disconnect(&mut self, conn: ConnId) {
        self.forget_waits(conn);
        self.validated.remove(&conn);
    }

    /// ADD's result as PyTorch computes it (`std::stoll(value) + delta`); an error
    /// where its handler throws: a value that is no integer, or an overflow.
    fn checked_add(&self, key: &[u8], delta: i64) -> Result<i64, AddRefused> {
        let old = match self.data.get(key) {
            None => 0,
            Some(v) => stoll(v).ok_or_else(|| {
                AddRefused::NotAnInteger(String::from_utf8_lossy(&v[..v.len().min(32)]).into())
            })?,
        };
        old.checked_add(delta)
            .ok_or(AddRefused::Overflow { old, delta })
    }

    fn all_present(&self, keys: &[Vec<u8>]) -> bool {
        keys.iter()
            .all(|k| self.data.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty()))
    }

    fn wake_all(&mut self, key: &[u8]) -> Vec<(ConnId, Vec<u8>)> {
        let Some(conns) = self.waiting.remove(key) else {
            return Vec::new();
        };
        conns
            .into_iter()
            .filter(|c| self.count_down(*c))
            .map(|c| (c, vec![WAIT_STOP_WAITING]))
            .collect()
    }

    fn wake_one(&mut self, key: &[u8]) -> Vec<(ConnId, Vec<u8>)> {
        let Some(conns) = self.waiting.get(key).cloned() else {
            return Vec::new();
        };
        conns
            .into_iter()
            .find(|c| self.count_down(*c))
            .map(|c| vec![(c, vec![WAIT_STOP_WAITING])])
            .unwrap_or_default()
    }

    /// One awaited key arrived for `conn`; true when it has them all.
    fn count_down(&mut self, conn: ConnId) -> bool {
        match self.awaited.get_mut(&conn) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.awaited.remove(&conn);
                true
            }
            None => false,
        }
    }

    fn forget_waits(&mut self, conn: ConnId) {
        if self.awaited.remove(&conn).is_some() {
            self.waiting.retain(|_, conns| {
                conns.retain(|c| *c != conn);
                !conns.is_empty()
            });
        }
    }
}

/// C++'s `std::stoll`: leading whitespace, a sign, at least one digit, and whatever
/// follows ignored; None where it throws (no digits, out of range).
fn stoll(v: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(v).ok()?.trim_start();
    let sign = usize::from(s.starts_with(['+', '-']));
    let digits = s[sign..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    s[..sign + digits].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_refuses_what_pytorch_refuses() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        let set = |v: &[u8]| Request::Set {
            key: b"k".to_vec(),
            value: v.to_vec(),
        };
        let add = |d| Request::Add {
            key: b"k".to_vec(),
            delta: d,
        };
        s.apply(1, set(b" 12abc"));
        assert_eq!(
            s.apply(1, add(1)).replies,
            vec![(1, 13i64.to_le_bytes().to_vec())]
        );
        s.apply(1, set(b"abc"));
        assert!(s.apply(1, add(1)).close);
        assert_eq!(
            s.get(b"k"),
            Some(&b"abc".to_vec()),
            "a refused ADD changes nothing"
        );
        s.apply(1, set(i64::MAX.to_string().as_bytes()));
        assert!(s.apply(1, add(1)).close);
        assert_eq!(stoll(b"-7"), Some(-7));
        assert_eq!(stoll(b"99999999999999999999"), None);
        assert_eq!(stoll(b"+"), None);
    }

    #[test]
    fn a_second_validate_closes_the_connection() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        assert!(s.apply(1, Request::Validate(VALIDATION_MAGIC)).close);
    }

    #[test]
    fn replies_beyond_the_cap_are_refused_before_they_are_built() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        s.apply(
            1,
            Request::Set {
                key: b"big".to_vec(),
                value: vec![0; 8 << 20],
            },
        );
        let keys = vec![b"big".to_vec(); 2048];
        let fx = s.apply(1, Request::MultiGet { keys });
        assert!(fx.close && fx.replies.is_empty());
        assert!(fx.error.unwrap().contains("MULTI_GET of 2048 keys"));
        let ok = s.apply(
            1,
            Request::MultiGet {
                keys: vec![b"big".to_vec(); 4],
            },
        );
        assert!(!ok.close);
        for _ in 0..15 {
            s.apply(
                1,
                Request::Append {
                    key: b"big".to_vec(),
                    value: vec![0; 8 << 20],
                },
            );
        }
        assert!(
            s.apply(
                1,
                Request::Append {
                    key: b"big".to_vec(),
                    value: vec![0; 8 << 20],
                },
            )
            .close
        );
    }

    fn validated(s: &mut StoreState, conn: ConnId) {
        assert_eq!(
            s.apply(conn, Request::Validate(VALIDATION_MAGIC)),
            Effects::default()
        );
    }

    #[test]
    fn requests_before_validation_close_the_connection() {
        let mut s = StoreState::new();
        assert!(s.apply(1, Request::GetNumKeys).close);
        assert!(s.apply(2, Request::Validate(1)).close);
    }

    #[test]
    fn wait_wakes_when_the_last_key_arrives() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        validated(&mut s, 2);
        assert!(s
            .apply(
                1,
                Request::Wait {
                    keys: vec![b"a".to_vec(), b"b".to_vec()]
                }
            )
            .replies
            .is_empty());
        assert!(s
            .apply(
                2,
                Request::Set {
                    key: b"a".to_vec(),
                    value: vec![]
                }
            )
            .replies
            .is_empty());
        let fx = s.apply(
            2,
            Request::Add {
                key: b"b".to_vec(),
                delta: 1,
            },
        );
        assert!(fx.replies.contains(&(1, vec![WAIT_STOP_WAITING])));
    }

    #[test]
    fn cancel_wait_forgets_and_answers() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        s.apply(
            1,
            Request::Wait {
                keys: vec![b"x".to_vec()],
            },
        );
        assert_eq!(
            s.apply(1, Request::CancelWait).replies,
            vec![(1, vec![WAIT_CANCELED])]
        );
        validated(&mut s, 2);
        assert!(s
            .apply(
                2,
                Request::Set {
                    key: b"x".to_vec(),
                    value: vec![]
                }
            )
            .replies
            .is_empty());
    }

    #[test]
    fn queues_push_pop_len_and_wake_one() {
        let mut s = StoreState::new();
        for c in 1..=3 {
            validated(&mut s, c);
        }
        s.apply(
            1,
            Request::Wait {
                keys: vec![b"q".to_vec()],
            },
        );
        s.apply(
            2,
            Request::Wait {
                keys: vec![b"q".to_vec()],
            },
        );
        let fx = s.apply(
            3,
            Request::QueuePush {
                key: b"q".to_vec(),
                value: b"v1".to_vec(),
            },
        );
        assert_eq!(fx.replies, vec![(1, vec![WAIT_STOP_WAITING])]);
        assert_eq!(
            s.apply(3, Request::QueueLen { key: b"q".to_vec() }).replies[0].1,
            1i64.to_le_bytes()
        );
        let pop = &s.apply(3, Request::QueuePop { key: b"q".to_vec() }).replies[0].1;
        assert_eq!(&pop[..8], &1i64.to_le_bytes());
        assert_eq!(&pop[8..], blob(b"v1").as_slice());
        assert_eq!(
            s.apply(3, Request::QueuePop { key: b"q".to_vec() }).replies[0].1,
            0i64.to_le_bytes()
        );
    }

    #[test]
    fn compare_set_semantics_match_libuv() {
        let mut s = StoreState::new();
        validated(&mut s, 1);
        let cas = |s: &mut StoreState, e: &[u8], d: &[u8]| {
            s.apply(
                1,
                Request::CompareSet {
                    key: b"k".to_vec(),
                    expected: e.to_vec(),
                    desired: d.to_vec(),
                },
            )
            .replies[0]
                .1
                .clone()
        };
        assert_eq!(
            cas(&mut s, b"x", b"y"),
            blob(b"x"),
            "missing key, non-empty expected: echoes expected"
        );
        assert_eq!(cas(&mut s, b"", b"new"), blob(b"new"));
        assert_eq!(cas(&mut s, b"bad", b"z"), blob(b"new"));
        assert_eq!(cas(&mut s, b"new", b"z"), blob(b"z"));
    }
}

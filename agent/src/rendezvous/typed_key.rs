//! A key of the rendezvous or workers' store with the type of the value under it:
//! written and read only as that type (JSON on the wire), so that a key and what it
//! holds are named together, once, in [`keys`](super::keys). Anything else found
//! under it (another program, a stranger on the store, an older toporun) reads as
//! [`Unreadable`], with the key's name, never as an empty or default value.

use super::protocol::Unreadable;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::{Mutex, OnceLock};

/// A key and the type `T` of its value.
pub struct Key<T> {
    name: String,
    /// What the value is, as `Unreadable` says it.
    expected: &'static str,
    value: PhantomData<fn() -> T>,
}

impl<T> Key<T> {
    pub fn new(name: String, expected: &'static str) -> Key<T> {
        Key {
            name,
            expected,
            value: PhantomData,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl<T> Clone for Key<T> {
    fn clone(&self) -> Self {
        Key::new(self.name.clone(), self.expected)
    }
}

impl<T> std::fmt::Debug for Key<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.expected)
    }
}

impl<T: Serialize> Key<T> {
    pub fn encode(&self, value: &T) -> Vec<u8> {
        super::protocol::encode(value)
    }

    /// The key's name and `value` encoded, for a batch of writes.
    pub fn entry(&self, value: &T) -> (String, Vec<u8>) {
        (self.name.clone(), self.encode(value))
    }
}

impl<T: Serialize> Key<Vec<T>> {
    /// A list's value from a slice, as a `Vec<T>` encodes (no copy into one).
    pub fn encode_slice(&self, values: &[T]) -> Vec<u8> {
        super::protocol::encode(&values)
    }
}

impl<T: DeserializeOwned> Key<T> {
    pub fn decode(&self, raw: &[u8]) -> Result<T, Unreadable> {
        super::protocol::decode(&self.name, raw, self.expected)
    }

    /// The value, or none after a warning (once per key) where it is unreadable: for
    /// values read again and again, where one bad writer must not stop the reader.
    pub fn decode_or_warn(&self, raw: &[u8]) -> Option<T> {
        self.decode(raw).map_err(|e| warn_once(&e)).ok()
    }
}

/// Says an unreadable value once per key.
fn warn_once(e: &Unreadable) {
    static SAID: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let said = SAID.get_or_init(Mutex::default);
    let first = said
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(e.key.clone());
    if first {
        crate::console::say_warning!("{e}; left out");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Row {
        rank: u32,
    }

    #[test]
    fn a_value_reads_back_as_its_type_and_anything_else_is_named() {
        let k: Key<Vec<Row>> = Key::new("toporun/j/r0/ranks/1".into(), "rank rows");
        let raw = k.encode(&vec![Row { rank: 3 }]);
        assert_eq!(k.decode(&raw).unwrap(), vec![Row { rank: 3 }]);
        assert_eq!(k.encode_slice(&[Row { rank: 3 }]), raw);
        assert_eq!(k.entry(&vec![]), (k.name().to_string(), b"[]".to_vec()));
        let e = k.decode(b"{\"rank\": 3}").unwrap_err();
        assert_eq!(e.key, "toporun/j/r0/ranks/1");
        assert_eq!(e.expected, "rank rows");
        assert!(e.to_string().contains("not rank rows"), "{e}");
        assert!(k.decode_or_warn(b"garbage").is_none());
        assert_eq!(k.decode_or_warn(&raw), Some(vec![Row { rank: 3 }]));
    }
}

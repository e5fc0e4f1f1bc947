//! The TCPStore wire format: u8 query type, strings and blobs as u64 length + bytes,
//! integers native-endian (little on every platform PyTorch ships for).

/// First message of every connection: VALIDATE + this number.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// PyTorch's libuv server limits.
pub const MAX_KEY_LEN: u64 = 8 * 1024;
pub const MAX_PAYLOAD_LEN: u64 = 8 * 1024 * 1024;
pub const MAX_KEY_COUNT: u64 = 128 * 1024;

pub const CHECK_READY: u8 = 0;
pub const CHECK_NOT_READY: u8 = 1;
pub const WAIT_STOP_WAITING: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum QueryType {
    Validate = 0,
    Set,
    CompareSet,
    Get,
    Add,
    Check,
    Wait,
    GetNumKeys,
    DeleteKey,
    Append,
    MultiGet,
    MultiSet,
    CancelWait,
    Ping,
    QueuePush,
    QueuePop,
    QueueLen,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Validate(u32),
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    GetNumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping(u32),
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("unknown TCPStore query type {0}")]
    UnknownQuery(u8),
    #[error("key of {0} bytes exceeds the {MAX_KEY_LEN}-byte limit")]
    KeyTooLong(u64),
    #[error("value of {0} bytes exceeds the {MAX_PAYLOAD_LEN}-byte limit")]
    ValueTooLong(u64),
    #[error("{0} keys in one request exceed the {MAX_KEY_COUNT} limit")]
    TooManyKeys(u64),
}

/// Reads fields from a buffer that may hold a partial request.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// `Ok(None)` from a reader means "need more bytes".
type Step<T> = Result<Option<T>, CodecError>;

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
    fn bytes(&mut self, limit: u64, err: fn(u64) -> CodecError) -> Step<Vec<u8>> {
        let Some(len) = self.u64() else {
            return Ok(None);
        };
        if len > limit {
            return Err(err(len));
        }
        Ok(self.take(len as usize).map(<[u8]>::to_vec))
    }
    fn key(&mut self) -> Step<Vec<u8>> {
        self.bytes(MAX_KEY_LEN, CodecError::KeyTooLong)
    }
    fn value(&mut self) -> Step<Vec<u8>> {
        self.bytes(MAX_PAYLOAD_LEN, CodecError::ValueTooLong)
    }
    fn count(&mut self) -> Step<u64> {
        match self.u64() {
            Some(n) if n > MAX_KEY_COUNT => Err(CodecError::TooManyKeys(n)),
            n => Ok(n),
        }
    }
    fn keys(&mut self) -> Step<Vec<Vec<u8>>> {
        let Some(n) = self.count()? else {
            return Ok(None);
        };
        let mut keys = Vec::with_capacity(n.min(1024) as usize);
        for _ in 0..n {
            let Some(k) = self.key()? else {
                return Ok(None);
            };
            keys.push(k);
        }
        Ok(Some(keys))
    }
}

macro_rules! need {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return Ok(None),
        }
    };
}

/// Decodes one request from the start of `buf`: the request and the bytes it used,
/// `None` when `buf` holds only part of one.
pub fn decode_request(buf: &[u8]) -> Result<Option<(Request, usize)>, CodecError> {
    let mut r = Reader { buf, pos: 0 };
    let q = need!(r.u8());
    let req = match q {
        0 => Request::Validate(need!(r.u32())),
        1 => Request::Set {
            key: need!(r.key()?),
            value: need!(r.value()?),
        },
        2 => Request::CompareSet {
            key: need!(r.key()?),
            expected: need!(r.value()?),
            desired: need!(r.value()?),
        },
        3 => Request::Get {
            key: need!(r.key()?),
        },
        4 => Request::Add {
            key: need!(r.key()?),
            delta: need!(r.u64()) as i64,
        },
        5 => Request::Check {
            keys: need!(r.keys()?),
        },
        6 => Request::Wait {
            keys: need!(r.keys()?),
        },
        7 => Request::GetNumKeys,
        8 => Request::DeleteKey {
            key: need!(r.key()?),
        },
        9 => Request::Append {
            key: need!(r.key()?),
            value: need!(r.value()?),
        },
        10 => Request::MultiGet {
            keys: need!(r.keys()?),
        },
        11 => {
            let n = need!(r.count()?);
            let mut pairs = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                pairs.push((need!(r.key()?), need!(r.value()?)));
            }
            Request::MultiSet { pairs }
        }
        12 => Request::CancelWait,
        13 => Request::Ping(need!(r.u32())),
        14 => Request::QueuePush {
            key: need!(r.key()?),
            value: need!(r.value()?),
        },
        15 => Request::QueuePop {
            key: need!(r.key()?),
        },
        16 => Request::QueueLen {
            key: need!(r.key()?),
        },
        other => return Err(CodecError::UnknownQuery(other)),
    };
    Ok(Some((req, r.pos)))
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_keys(out: &mut Vec<u8>, keys: &[Vec<u8>]) {
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    keys.iter().for_each(|k| put_bytes(out, k));
}

/// Encodes a request as PyTorch's client sends it.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    let q = |t: QueryType| t as u8;
    match req {
        Request::Validate(m) => {
            out.push(q(QueryType::Validate));
            out.extend_from_slice(&m.to_le_bytes());
        }
        Request::Set { key, value } => {
            out.push(q(QueryType::Set));
            put_bytes(&mut out, key);
            put_bytes(&mut out, value);
        }
        Request::CompareSet {
            key,
            expected,
            desired,
        } => {
            out.push(q(QueryType::CompareSet));
            put_bytes(&mut out, key);
            put_bytes(&mut out, expected);
            put_bytes(&mut out, desired);
        }
        Request::Get { key } => {
            out.push(q(QueryType::Get));
            put_bytes(&mut out, key);
        }
        Request::Add { key, delta } => {
            out.push(q(QueryType::Add));
            put_bytes(&mut out, key);
            out.extend_from_slice(&delta.to_le_bytes());
        }
        Request::Check { keys } => {
            out.push(q(QueryType::Check));
            put_keys(&mut out, keys);
        }
        Request::Wait { keys } => {
            out.push(q(QueryType::Wait));
            put_keys(&mut out, keys);
        }
        Request::GetNumKeys => out.push(q(QueryType::GetNumKeys)),
        Request::DeleteKey { key } => {
            out.push(q(QueryType::DeleteKey));
            put_bytes(&mut out, key);
        }
        Request::Append { key, value } => {
            out.push(q(QueryType::Append));
            put_bytes(&mut out, key);
            put_bytes(&mut out, value);
        }
        Request::MultiGet { keys } => {
            out.push(q(QueryType::MultiGet));
            put_keys(&mut out, keys);
        }
        Request::MultiSet { pairs } => {
            out.push(q(QueryType::MultiSet));
            out.extend_from_slice(&(pairs.len() as u64).to_le_bytes());
            for (k, v) in pairs {
                put_bytes(&mut out, k);
                put_bytes(&mut out, v);
            }
        }
        Request::CancelWait => out.push(q(QueryType::CancelWait)),
        Request::Ping(n) => {
            out.push(q(QueryType::Ping));
            out.extend_from_slice(&n.to_le_bytes());
        }
        Request::QueuePush { key, value } => {
            out.push(q(QueryType::QueuePush));
            put_bytes(&mut out, key);
            put_bytes(&mut out, value);
        }
        Request::QueuePop { key } => {
            out.push(q(QueryType::QueuePop));
            put_bytes(&mut out, key);
        }
        Request::QueueLen { key } => {
            out.push(q(QueryType::QueueLen));
            put_bytes(&mut out, key);
        }
    }
    out
}

/// A length-prefixed blob, as replies carry values.
pub fn blob(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + value.len());
    put_bytes(&mut out, value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_round_trips_and_partial_input_waits() {
        let reqs = vec![
            Request::Validate(VALIDATION_MAGIC),
            Request::Set {
                key: b"/k".to_vec(),
                value: b"v".to_vec(),
            },
            Request::CompareSet {
                key: b"/k".to_vec(),
                expected: vec![],
                desired: b"n".to_vec(),
            },
            Request::Get {
                key: b"/k".to_vec(),
            },
            Request::Add {
                key: b"/c".to_vec(),
                delta: -2,
            },
            Request::Check {
                keys: vec![b"/a".to_vec(), b"/b".to_vec()],
            },
            Request::Wait {
                keys: vec![b"/a".to_vec()],
            },
            Request::GetNumKeys,
            Request::DeleteKey {
                key: b"/k".to_vec(),
            },
            Request::Append {
                key: b"/k".to_vec(),
                value: b"x".to_vec(),
            },
            Request::MultiGet {
                keys: vec![b"/a".to_vec()],
            },
            Request::MultiSet {
                pairs: vec![(b"/a".to_vec(), b"1".to_vec())],
            },
            Request::CancelWait,
            Request::Ping(7),
            Request::QueuePush {
                key: b"q".to_vec(),
                value: b"1".to_vec(),
            },
            Request::QueuePop { key: b"q".to_vec() },
            Request::QueueLen { key: b"q".to_vec() },
        ];
        for req in reqs {
            let bytes = encode_request(&req);
            assert_eq!(
                decode_request(&bytes).unwrap(),
                Some((req.clone(), bytes.len()))
            );
            for cut in 0..bytes.len() {
                assert_eq!(
                    decode_request(&bytes[..cut]).unwrap(),
                    None,
                    "{req:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn limits_are_pytorchs() {
        let mut bytes = vec![QueryType::Get as u8];
        bytes.extend_from_slice(&(MAX_KEY_LEN + 1).to_le_bytes());
        assert_eq!(
            decode_request(&bytes),
            Err(CodecError::KeyTooLong(MAX_KEY_LEN + 1))
        );
        assert_eq!(decode_request(&[99]), Err(CodecError::UnknownQuery(99)));
    }
}

//! A TCPStore client speaking PyTorch's protocol (keys get PyTorch's "/" prefix, so
//! Python clients of the same store see the same names).

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use toporun_shared::store::codec::{
    encode_request, CHECK_READY, VALIDATION_MAGIC, WAIT_STOP_WAITING,
};
use toporun_shared::store::Request;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not connect to the store at {addr} within {waited:.1?}")]
    Connect {
        addr: String,
        waited: Duration,
        source: std::io::Error,
    },
    #[error("lost the connection to the store at {addr}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("timed out after {0:?} waiting for store keys {1:?}")]
    WaitTimeout(Duration, Vec<String>),
    #[error("store answered ping {got:#x}, expected {want:#x}: not a TCPStore")]
    BadPing { got: u32, want: u32 },
    #[error("the store at {addr} did not answer within {after:.0?}: its host is frozen, overloaded or unreachable")]
    Deadline { addr: String, after: Duration },
    #[error("the store at {addr} announced a {len}-byte value, more than a store sends")]
    BadReply { addr: String, len: u64 },
}

/// How long one request may take unless the caller says otherwise (torch's
/// rendezvous read_timeout default).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes of reply buffered per connection.
const READ_BUFFER: usize = 1024;
/// How long one connection's handshake may take before it is tried again.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

pub struct StoreClient {
    /// Replies are read through a small buffer: one receive per reply rather than
    /// one per field (a reply is a few fields; large values bypass the buffer).
    stream: BufReader<TcpStream>,
    addr: String,
    /// Requests without a reply, sent with the next request (one write for both).
    pending: Vec<u8>,
    /// Requests sent, for the rendezvous bench's operation rate.
    ops: u64,
    /// Bound on every read and write, so a frozen store ends in an error.
    deadline: Duration,
}

/// `host:port`, bracketing IPv6 hosts.
pub fn display(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn prefixed(key: &str) -> Vec<u8> {
    format!("/{key}").into_bytes()
}

/// Linux connects a socket to itself (TCP simultaneous open) when nothing listens on
/// a local port of the ephemeral range and the kernel picks that same port as the
/// source: the client then talks to itself, and holds the very port the store's host
/// must bind ("already in use"). Such a connection is dropped and counts as refused.
fn not_self_connected(stream: TcpStream) -> std::io::Result<TcpStream> {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) if local == peer => Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "no store listens yet (the connection reached itself)",
        )),
        _ => Ok(stream),
    }
}

impl StoreClient {
    /// Connects with exponential backoff (capped at 1 s) until `timeout`, then runs the
    /// validation handshake and a ping.
    pub async fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<StoreClient, StoreError> {
        Self::connect_from(host, port, None, timeout).await
    }

    /// `connect` from a given local address (the rendezvous bench gives each
    /// simulated node its own loopback address, as real nodes have their own IPs).
    pub async fn connect_from(
        host: &str,
        port: u16,
        source: Option<std::net::IpAddr>,
        timeout: Duration,
    ) -> Result<StoreClient, StoreError> {
        let addr = display(host, port);
        let start = Instant::now();
        let mut delay = Duration::from_millis(10);
        loop {
            // A store under a connection storm may reset or close a fresh connection
            // during the handshake: that is retried like a refused connect.
            // A store that accepts but never answers (black-holed, frozen) is given
            // up on per attempt and, at `timeout`, for good.
            let left = timeout.saturating_sub(start.elapsed());
            let attempt = async {
                let io = |source| StoreError::Io {
                    addr: addr.clone(),
                    source,
                };
                let stream = match source {
                    None => TcpStream::connect(&addr).await.map_err(io)?,
                    Some(ip) => {
                        let to = tokio::net::lookup_host(&addr)
                            .await
                            .map_err(io)?
                            .find(|a| a.is_ipv4() == ip.is_ipv4())
                            .ok_or_else(|| io(std::io::ErrorKind::AddrNotAvailable.into()))?;
                        let socket = if ip.is_ipv4() {
                            tokio::net::TcpSocket::new_v4()
                        } else {
                            tokio::net::TcpSocket::new_v6()
                        }
                        .map_err(io)?;
                        socket.bind(SocketAddr::new(ip, 0)).map_err(io)?;
                        socket.connect(to).await.map_err(io)?
                    }
                };
                Self::handshake(not_self_connected(stream).map_err(io)?, &addr).await
            };
            let err = match tokio::time::timeout(left.min(HANDSHAKE_DEADLINE), attempt).await {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(StoreError::Io { source, .. })) => source,
                Ok(Err(e)) => return Err(e),
                Err(_) => std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connected, but the store did not answer the handshake",
                ),
            };
            if start.elapsed() + delay >= timeout {
                return Err(StoreError::Connect {
                    addr,
                    waited: start.elapsed(),
                    source: err,
                });
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    async fn handshake(stream: TcpStream, addr: &str) -> Result<StoreClient, StoreError> {
        let _ = stream.set_nodelay(true);
        let mut c = StoreClient {
            stream: BufReader::with_capacity(READ_BUFFER, stream),
            addr: addr.to_string(),
            ops: 0,
            deadline: DEFAULT_DEADLINE,
            pending: Vec::new(),
        };
        let nonce = std::process::id();
        let mut hello = encode_request(&Request::Validate(VALIDATION_MAGIC));
        hello.extend(encode_request(&Request::Ping(nonce)));
        c.write(&hello).await?;
        let got = c.read_u32().await?;
        if got != nonce {
            return Err(StoreError::BadPing { got, want: nonce });
        }
        Ok(c)
    }

    /// Bounds every later request (the rendezvous read_timeout).
    pub fn set_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        self.stream.get_ref().peer_addr().ok()
    }

    fn io(&self, source: std::io::Error) -> StoreError {
        StoreError::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let (deadline, addr) = (self.deadline, self.addr.clone());
        if self.pending.is_empty() {
            return Self::within(deadline, addr, self.stream.write_all(bytes)).await;
        }
        let mut all = std::mem::take(&mut self.pending);
        all.extend_from_slice(bytes);
        Self::within(deadline, addr, self.stream.write_all(&all)).await
    }

    async fn send(&mut self, req: Request) -> Result<(), StoreError> {
        self.ops += 1;
        self.write(&encode_request(&req)).await
    }

    /// Requests sent on this connection.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    async fn read_u32(&mut self) -> Result<u32, StoreError> {
        let (deadline, addr) = (self.deadline, self.addr.clone());
        Self::within(deadline, addr, self.stream.read_u32_le()).await
    }

    async fn read_i64(&mut self) -> Result<i64, StoreError> {
        let (deadline, addr) = (self.deadline, self.addr.clone());
        Self::within(deadline, addr, self.stream.read_i64_le()).await
    }

    async fn read_u8(&mut self) -> Result<u8, StoreError> {
        let (deadline, addr) = (self.deadline, self.addr.clone());
        Self::within(deadline, addr, self.stream.read_u8()).await
    }

    async fn read_blob(&mut self) -> Result<Vec<u8>, StoreError> {
        let (deadline, addr) = (self.deadline, self.addr.clone());
        let len = Self::within(deadline, addr.clone(), self.stream.read_u64_le()).await?;
        // A hostile or broken server must not make this process allocate at will.
        if len > toporun_shared::store::state::MAX_REPLY_BYTES as u64 {
            return Err(StoreError::BadReply { addr, len });
        }
        let mut v = vec![0u8; len as usize];
        Self::within(deadline, addr, self.stream.read_exact(&mut v)).await?;
        Ok(v)
    }

    async fn within<T>(
        deadline: Duration,
        addr: String,
        op: impl std::future::Future<Output = std::io::Result<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(deadline, op).await {
            Ok(r) => r.map_err(|source| StoreError::Io { addr, source }),
            Err(_) => Err(StoreError::Deadline {
                addr,
                after: deadline,
            }),
        }
    }

    pub async fn set(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(Request::Set {
            key: prefixed(key),
            value: value.to_vec(),
        })
        .await
    }

    /// A SET that goes out with the next request on this connection (SET has no
    /// reply, so nothing waits for it): the caller must make another request.
    pub fn set_with_next(&mut self, key: &str, value: &[u8]) {
        self.ops += 1;
        self.pending.extend(encode_request(&Request::Set {
            key: prefixed(key),
            value: value.to_vec(),
        }));
    }

    pub async fn add(&mut self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.send(Request::Add {
            key: prefixed(key),
            delta,
        })
        .await?;
        self.read_i64().await
    }

    pub async fn append(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(Request::Append {
            key: prefixed(key),
            value: value.to_vec(),
        })
        .await
    }

    pub async fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.send(Request::CompareSet {
            key: prefixed(key),
            expected: expected.to_vec(),
            desired: desired.to_vec(),
        })
        .await?;
        self.read_blob().await
    }

    /// Whether every key exists now.
    pub async fn check(&mut self, keys: &[&str]) -> Result<bool, StoreError> {
        self.send(Request::Check {
            keys: keys.iter().map(|k| prefixed(k)).collect(),
        })
        .await?;
        Ok(self.read_u8().await? == CHECK_READY)
    }

    /// Waits for keys; on timeout cancels the wait on the server, as PyTorch does.
    pub async fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.send(Request::Wait {
            keys: keys.iter().map(|k| prefixed(k)).collect(),
        })
        .await?;
        match tokio::time::timeout(timeout, self.stream.read_u8()).await {
            Ok(r) => r.map(|_| ()).map_err(|e| self.io(e)),
            Err(_) => {
                self.send(Request::CancelWait).await?;
                // Either the late STOP_WAITING then WAIT_CANCELED, or just WAIT_CANCELED.
                if self.read_u8().await? == WAIT_STOP_WAITING {
                    self.read_u8().await?;
                }
                Err(StoreError::WaitTimeout(
                    timeout,
                    keys.iter().map(|k| k.to_string()).collect(),
                ))
            }
        }
    }

    /// Waits for the key, then reads it (PyTorch's get).
    pub async fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], timeout).await?;
        self.send(Request::Get { key: prefixed(key) }).await?;
        self.read_blob().await
    }

    pub async fn multi_get(
        &mut self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.wait(keys, timeout).await?;
        self.multi_get_now(keys).await
    }

    /// Reads keys the caller knows exist (one round trip instead of two).
    pub async fn multi_get_now(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> {
        self.send(Request::MultiGet {
            keys: keys.iter().map(|k| prefixed(k)).collect(),
        })
        .await?;
        let mut out = Vec::with_capacity(keys.len());
        for _ in keys {
            out.push(self.read_blob().await?);
        }
        Ok(out)
    }

    pub async fn multi_set(&mut self, pairs: &[(&str, &[u8])]) -> Result<(), StoreError> {
        self.send(Request::MultiSet {
            pairs: pairs
                .iter()
                .map(|(k, v)| (prefixed(k), v.to_vec()))
                .collect(),
        })
        .await
    }

    pub async fn delete_key(&mut self, key: &str) -> Result<bool, StoreError> {
        self.send(Request::DeleteKey { key: prefixed(key) }).await?;
        Ok(self.read_i64().await? > 0)
    }

    pub async fn num_keys(&mut self) -> Result<i64, StoreError> {
        self.send(Request::GetNumKeys).await?;
        self.read_i64().await
    }

    pub async fn queue_push(&mut self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.send(Request::QueuePush {
            key: prefixed(key),
            value: value.to_vec(),
        })
        .await
    }

    /// Pops the front of a queue, waiting up to `timeout` for one to arrive.
    pub async fn queue_pop(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], timeout).await?;
        self.send(Request::QueuePop { key: prefixed(key) }).await?;
        let len = self.read_i64().await?;
        if len > 0 {
            self.read_blob().await
        } else {
            Ok(Vec::new())
        }
    }

    pub async fn queue_len(&mut self, key: &str) -> Result<i64, StoreError> {
        self.send(Request::QueueLen { key: prefixed(key) }).await?;
        self.read_i64().await
    }

    pub async fn ping(&mut self, nonce: u32) -> Result<u32, StoreError> {
        self.send(Request::Ping(nonce)).await?;
        self.read_u32().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;

    #[tokio::test]
    async fn every_operation_against_our_server() {
        let server = StoreServer::bind(0).unwrap();
        let t = Duration::from_secs(2);
        let mut c = StoreClient::connect("127.0.0.1", server.port(), t)
            .await
            .unwrap();
        c.set("k", b"v").await.unwrap();
        assert_eq!(c.get("k", t).await.unwrap(), b"v");
        assert_eq!(server.get(b"/k").unwrap(), b"v");
        assert_eq!(c.add("n", 5).await.unwrap(), 5);
        assert_eq!(c.add("n", -2).await.unwrap(), 3);
        assert_eq!(c.compare_set("k", b"v", b"w").await.unwrap(), b"w");
        assert!(c.check(&["k", "n"]).await.unwrap());
        assert!(!c.check(&["nope"]).await.unwrap());
        assert!(matches!(
            c.wait(&["nope"], Duration::from_millis(50)).await,
            Err(StoreError::WaitTimeout(..))
        ));
        c.append("a", b"x").await.unwrap();
        c.append("a", b"y").await.unwrap();
        c.multi_set(&[("m1", b"1"), ("m2", b"2")]).await.unwrap();
        assert_eq!(
            c.multi_get(&["a", "m1", "m2"], t).await.unwrap(),
            vec![b"xy".to_vec(), b"1".to_vec(), b"2".to_vec()]
        );
        assert_eq!(c.num_keys().await.unwrap(), 5);
        assert!(c.delete_key("a").await.unwrap());
        assert!(!c.delete_key("a").await.unwrap());
        c.queue_push("q", b"first").await.unwrap();
        assert_eq!(c.queue_len("q").await.unwrap(), 1);
        assert_eq!(c.queue_pop("q", t).await.unwrap(), b"first");
        assert_eq!(c.ping(42).await.unwrap(), 42);
    }

    #[tokio::test]
    async fn a_waiting_client_wakes_when_another_sets() {
        let server = StoreServer::bind(0).unwrap();
        let port = server.port();
        let waiter = tokio::spawn(async move {
            let mut c = StoreClient::connect("127.0.0.1", port, Duration::from_secs(2))
                .await
                .unwrap();
            c.get("late", Duration::from_secs(5)).await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        server.set(b"/late", b"here".to_vec());
        assert_eq!(waiter.await.unwrap(), b"here");
    }

    #[tokio::test]
    async fn connect_gives_up_after_the_timeout_saying_where() {
        let err = StoreClient::connect("127.0.0.1", 1, Duration::from_millis(100))
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    }

    #[tokio::test]
    async fn a_connection_to_itself_is_refused() {
        // Simultaneous open: a socket bound to a port and connected to that same port.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let me = socket.local_addr().unwrap();
        let stream = socket.connect(me).await.unwrap();
        let e = not_self_connected(stream).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}

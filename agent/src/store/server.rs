//! Serves PyTorch's TCPStore protocol on tokio: one task per connection, one lock
//! around the state machine and the connections' outboxes. The store runs on a thread
//! and runtime of its own, so no client can delay the launcher's signal handling or
//! supervision, and every connection is bounded: an idle one holds no read buffer, and
//! one whose replies are not being read is not read either.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, Notify};
use toporun_shared::store::{decode_request, ConnId, StoreState};

/// Reply bytes a connection may have queued before the store stops reading its
/// requests (pipelined 8 MiB GETs from a client that never reads).
const OUTBOX_LIMIT: usize = 32 << 20;
/// How much a connection reads at a time.
const READ_CHUNK: usize = 16 << 10;

/// One connection's way out: the writer's queue and the bytes in it.
struct Outbox {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
}

#[derive(Default)]
struct Inner {
    state: StoreState,
    outboxes: HashMap<ConnId, Outbox>,
}

impl Inner {
    fn send(&self, replies: Vec<(ConnId, Vec<u8>)>) {
        for (conn, bytes) in replies {
            if let Some(o) = self.outboxes.get(&conn) {
                o.queued.fetch_add(bytes.len(), Ordering::AcqRel);
                let _ = o.tx.send(bytes);
            }
        }
    }
}

/// Who may connect: loopback only (a job on one node) or every interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Loopback,
    All,
}

/// A running store. Dropping it does not stop it; the process's end does.
#[derive(Clone)]
pub struct StoreServer {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    connections: Arc<AtomicU64>,
}

fn socket_on(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let sock = if addr.is_ipv6() {
        let s = TcpSocket::new_v6()?;
        // Dual-stack whatever net.ipv6.bindv6only says, as PyTorch's store does:
        // workers given 127.0.0.1 must reach a store bound to [::].
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Ipv6V6Only, &false)
            .map_err(std::io::Error::from)?;
        s
    } else {
        TcpSocket::new_v4()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    // A large backlog, so thousands of nodes can connect at once.
    sock.listen(8192)
}

/// Every interface: `[::]` dual-stack, else `0.0.0.0` (no IPv6). Loopback: 127.0.0.1,
/// and ::1 on the same port where the host has IPv6 (`localhost` may resolve to it).
fn listen(port: u16, reach: Reach) -> std::io::Result<Vec<TcpListener>> {
    match reach {
        Reach::All => socket_on(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port))
            .or_else(|_| socket_on(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)))
            .map(|l| vec![l]),
        Reach::Loopback => {
            let v4 = socket_on(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))?;
            let port = v4.local_addr()?.port();
            let mut all = vec![v4];
            all.extend(socket_on(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port)).ok());
            Ok(all)
        }
    }
}

/// A listener on every interface, as the store's (`[::]` dual-stack, else
/// `0.0.0.0`), for another service of the agent (the network check's probes).
pub fn listen_all(port: u16) -> std::io::Result<TcpListener> {
    listen(port, Reach::All).map(|mut l| l.remove(0))
}

impl StoreServer {
    /// Binds now on every interface (so the port is ours before any worker starts)
    /// and serves on its own thread. Port 0 picks a free port.
    pub fn bind(port: u16) -> std::io::Result<StoreServer> {
        Self::bind_on(port, Reach::All)
    }

    pub fn bind_on(port: u16, reach: Reach) -> std::io::Result<StoreServer> {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let connections: Arc<AtomicU64> = Arc::default();
        let (i, c) = (inner.clone(), connections.clone());
        let addr = crate::own_thread::serve("toporun-store", move |bound| async move {
            let (addr, listeners) =
                match listen(port, reach).and_then(|l| Ok((l[0].local_addr()?, l))) {
                    Ok((addr, l)) => {
                        bound(Ok(addr));
                        (addr, l)
                    }
                    Err(e) => return bound(Err(e)),
                };
            let server = StoreServer {
                addr,
                inner: i,
                connections: c,
            };
            let loops: Vec<_> = listeners
                .into_iter()
                .map(|l| tokio::spawn(server.clone().accept_loop(l)))
                .collect();
            for l in loops {
                let _ = l.await;
            }
        })?;
        Ok(StoreServer {
            addr,
            inner,
            connections,
        })
    }

    /// The store's state. A connection's task that panicked while holding it leaves
    /// the state whole (every operation's change is one map update), so the lock's
    /// poison is cleared rather than passed on to every other connection.
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Operations served so far.
    pub fn ops(&self) -> u64 {
        self.lock().state.ops
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Forgets the last round's worker keys before a new round's workers start, so
    /// they meet a store as fresh as the one torchrun gives every round (gloo and
    /// NCCL bootstrap would otherwise read dead ranks' addresses). The rendezvous'
    /// own keys stay.
    pub fn forget_workers(&self) -> usize {
        self.lock()
            .state
            .retain_keys(|k| k.starts_with(b"/toporun/"))
    }

    /// Reads a key as a worker would see it (client keys carry a leading "/").
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().state.get(key).cloned()
    }

    /// Sets a key from inside the agent, waking waiting clients.
    pub fn set(&self, key: &[u8], value: Vec<u8>) {
        let mut inner = self.lock();
        let replies = inner.state.set(key, value);
        inner.send(replies);
    }

    /// Adds from inside the agent; returns the new value.
    pub fn add(&self, key: &[u8], delta: i64) -> i64 {
        let mut inner = self.lock();
        let (v, replies) = inner.state.add(key, delta);
        inner.send(replies);
        v
    }

    async fn accept_loop(self, listener: TcpListener) {
        let next = AtomicU64::new(1);
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    self.connections.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(self.clone().serve(id, stream));
                }
                // Out of file descriptors and the like: back off instead of spinning.
                Err(e) => {
                    tracing::warn!("store accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn serve(self, id: ConnId, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let drained = Arc::new(Notify::new());
        self.lock().outboxes.insert(
            id,
            Outbox {
                tx,
                queued: queued.clone(),
            },
        );
        let (q, d) = (queued.clone(), drained.clone());
        let writer = tokio::spawn(async move {
            while let Some(mut bytes) = rx.recv().await {
                // Coalesce replies that are already queued into one write.
                while let Ok(more) = rx.try_recv() {
                    bytes.extend(more);
                }
                let ok = wr.write_all(&bytes).await.is_ok();
                q.fetch_sub(bytes.len(), Ordering::AcqRel);
                d.notify_one();
                if !ok {
                    break;
                }
            }
        });
        // Empty (no allocation) while the connection is idle.
        let mut buf: Vec<u8> = Vec::new();
        'conn: loop {
            // Requests already buffered are served first, as far as the outbox allows.
            let mut used = 0;
            {
                let mut inner = self.lock();
                while queued.load(Ordering::Acquire) < OUTBOX_LIMIT {
                    match decode_request(&buf[used..]) {
                        Ok(Some((req, len))) => {
                            used += len;
                            let fx = inner.state.apply(id, req);
                            inner.send(fx.replies);
                            if fx.close {
                                if let Some(why) = fx.error {
                                    tracing::warn!("store: closing connection {id}: {why}");
                                }
                                break 'conn;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::debug!("store connection {id}: {e}; closing it");
                            break 'conn;
                        }
                    }
                }
            }
            buf.drain(..used);
            if queued.load(Ordering::Acquire) >= OUTBOX_LIMIT {
                // The client is not reading its replies: stop reading its requests
                // until the writer catches up (or the connection dies).
                tokio::select! {
                    _ = drained.notified() => {}
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                if writer.is_finished() {
                    break;
                }
                continue;
            }
            if buf.is_empty() {
                // Idle: hold no buffer until there is something to read, and give
                // back what a large request needed.
                buf = Vec::new();
                if rd.readable().await.is_err() {
                    break;
                }
            }
            buf.reserve(READ_CHUNK);
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let mut inner = self.lock();
        inner.outboxes.remove(&id);
        inner.state.disconnect(id);
        drop(inner);
        writer.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreClient;
    use std::time::Duration;

    /// A task that panics while holding the state (as a bug in one connection's
    /// handling would) leaves the store serving every other connection.
    #[tokio::test]
    async fn a_panic_under_the_lock_does_not_poison_the_store() {
        let server = StoreServer::bind(0).unwrap();
        server.set(b"/before", b"1".to_vec());
        let s = server.clone();
        let panicked = std::thread::spawn(move || {
            let _held = s.inner.lock().unwrap();
            panic!("a connection's bug");
        })
        .join();
        assert!(panicked.is_err());
        assert!(server.inner.is_poisoned());
        let t = Duration::from_secs(2);
        let mut c = StoreClient::connect("127.0.0.1", server.port(), t)
            .await
            .unwrap();
        assert_eq!(c.get("before", t).await.unwrap(), b"1");
        c.set("after", b"2").await.unwrap();
        // SET has no reply: a GET on the same connection orders after it.
        assert_eq!(c.get("after", t).await.unwrap(), b"2");
        assert_eq!(server.get(b"/after").unwrap(), b"2");
    }
}

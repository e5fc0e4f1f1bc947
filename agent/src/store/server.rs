//! Serves PyTorch's TCPStore protocol on tokio: one task per connection, one lock
//! around the state machine and the connections' outboxes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use toporun_shared::store::{decode_request, ConnId, StoreState};

#[derive(Default)]
struct Inner {
    state: StoreState,
    outboxes: HashMap<ConnId, mpsc::UnboundedSender<Vec<u8>>>,
}

impl Inner {
    fn send(&self, replies: Vec<(ConnId, Vec<u8>)>) {
        for (conn, bytes) in replies {
            if let Some(tx) = self.outboxes.get(&conn) {
                let _ = tx.send(bytes);
            }
        }
    }
}

/// A running store. Dropping it does not stop it; the runtime's end does.
#[derive(Clone)]
pub struct StoreServer {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    connections: Arc<AtomicU64>,
}

/// PyTorch binds `::` (dual-stack) and falls back to 0.0.0.0; so do we. The backlog
/// is large so thousands of nodes can connect at once.
fn listen(port: u16, host: Option<std::net::IpAddr>) -> std::io::Result<TcpListener> {
    let try_bind = |addr: SocketAddr| -> std::io::Result<TcpListener> {
        let sock = if addr.is_ipv6() {
            TcpSocket::new_v6()?
        } else {
            TcpSocket::new_v4()?
        };
        sock.set_reuseaddr(true)?;
        sock.bind(addr)?;
        sock.listen(8192)
    };
    match host {
        Some(ip) => try_bind(SocketAddr::new(ip, port)),
        None => try_bind(SocketAddr::from(([0u16; 8], port)))
            .or_else(|_| try_bind(SocketAddr::from(([0, 0, 0, 0], port)))),
    }
}

impl StoreServer {
    /// Binds now (so the port is ours before any worker starts) and serves in the
    /// background of the current tokio runtime. Port 0 picks a free port.
    pub fn bind(port: u16) -> std::io::Result<StoreServer> {
        Self::bind_on(port, None)
    }

    pub fn bind_on(port: u16, host: Option<std::net::IpAddr>) -> std::io::Result<StoreServer> {
        let listener = listen(port, host)?;
        let server = StoreServer {
            addr: listener.local_addr()?,
            inner: Arc::default(),
            connections: Arc::default(),
        };
        tokio::spawn(server.clone().accept_loop(listener));
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Operations served so far.
    pub fn ops(&self) -> u64 {
        self.inner.lock().expect("store lock").state.ops
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Reads a key as a worker would see it (client keys carry a leading "/").
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner
            .lock()
            .expect("store lock")
            .state
            .get(key)
            .cloned()
    }

    /// Sets a key from inside the agent, waking waiting clients.
    pub fn set(&self, key: &[u8], value: Vec<u8>) {
        let mut inner = self.inner.lock().expect("store lock");
        let replies = inner.state.set(key, value);
        inner.send(replies);
    }

    /// Adds from inside the agent; returns the new value.
    pub fn add(&self, key: &[u8], delta: i64) -> i64 {
        let mut inner = self.inner.lock().expect("store lock");
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
        self.inner
            .lock()
            .expect("store lock")
            .outboxes
            .insert(id, tx);
        let writer = tokio::spawn(async move {
            while let Some(mut bytes) = rx.recv().await {
                // Coalesce replies that are already queued into one write.
                while let Ok(more) = rx.try_recv() {
                    bytes.extend(more);
                }
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
            }
        });
        let mut buf = Vec::with_capacity(4096);
        let mut chunk = vec![0u8; 64 * 1024];
        'conn: loop {
            let n = match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            let mut used = 0;
            let mut inner = self.inner.lock().expect("store lock");
            loop {
                match decode_request(&buf[used..]) {
                    Ok(Some((req, len))) => {
                        used += len;
                        let fx = inner.state.apply(id, req);
                        inner.send(fx.replies);
                        if fx.close {
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
            drop(inner);
            buf.drain(..used);
        }
        let mut inner = self.inner.lock().expect("store lock");
        inner.outboxes.remove(&id);
        inner.state.disconnect(id);
        drop(inner);
        writer.abort();
    }
}

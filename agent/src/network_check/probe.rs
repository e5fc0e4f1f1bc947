//! One path measured over TCP between two node agents: the sender connects to the
//! receiver's listener, says which path and round it is, echoes a few small messages
//! (the receiver times the round trips), then streams until the receiver, having
//! counted what arrived over the window, closes. The receiver's count is the figure:
//! what crossed the link, not what the sender's buffers took. A window in which the
//! stream stopped for a while (a sender or receiver not scheduled on a busy host, a
//! retransmit timeout) is counted again once: a shaped or degraded link delivers a
//! steady trickle, and one pause must not make a healthy path look slow.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toporun_shared::network_check::schedule::Path;
use toporun_shared::network_check::verdict::PathFigure;

/// How long the receiver counts the stream.
pub const WINDOW: Duration = Duration::from_millis(500);
/// No bytes for this long inside a window is a pause, not a rate: 20 Mbit/s brings
/// a packet every 0.6 ms.
const PAUSE: Duration = Duration::from_millis(150);
/// At most this much is read uncounted before a second window: more than any
/// socket's receive buffer (Linux's tcp_rmem tops at 6 MiB by default).
const DRAIN_BYTES: usize = 32 << 20;
/// Windows counted at most: the first, and one more where the first paused.
pub const WINDOWS: u32 = 2;
/// How long a receiver waits for its sender to connect and a sender to connect.
pub const CONNECT_WAIT: Duration = Duration::from_secs(3);
/// Small messages timed; the quickest is the round trip.
const PINGS: usize = 5;
const MAGIC: &[u8; 4] = b"TPNC";
const CHUNK: usize = 256 * 1024;

/// Which path of which probe round, and the receiver's nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub k: u32,
    pub path: Path,
    pub nonce: u64,
}

/// The first bytes a sender writes.
fn header(p: Probe) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[..4].copy_from_slice(MAGIC);
    h[4..8].copy_from_slice(&p.k.to_le_bytes());
    h[8..12].copy_from_slice(&p.path.from.to_le_bytes());
    h[12..16].copy_from_slice(&p.path.to.to_le_bytes());
    h[16..24].copy_from_slice(&p.nonce.to_le_bytes());
    h
}

/// How long one of the receiver's addresses gets to connect and answer the first
/// ping: an address that names another machine (docker0's 172.17.0.1 is on every
/// host) drops the header, and the next address is tried.
const TRY_WAIT: Duration = Duration::from_secs(1);
/// How long a connection gets to say which path it is.
const HEADER_WAIT: Duration = Duration::from_millis(300);

/// Sends on `path` to the receiver, at the first of its addresses `to` that answers as
/// that receiver, until it closes or the probe's time is up.
pub async fn send(to: &[SocketAddr], p: Probe) {
    let deadline = Instant::now() + CONNECT_WAIT + WINDOW * WINDOWS + Duration::from_secs(2);
    let _ = tokio::time::timeout_at(deadline.into(), stream(to, p)).await;
}

/// A connection to `to` where the receiver answered the first ping.
async fn answered(to: SocketAddr, p: Probe) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(to).await?;
    s.set_nodelay(true)?;
    s.write_all(&header(p)).await?;
    let mut ping = [0u8; 8];
    s.read_exact(&mut ping).await?;
    s.write_all(&ping).await?;
    Ok(s)
}

/// The sender's side of the round trips after the first (which [`answered`] echoed).
async fn echo_pings(s: &mut TcpStream) -> std::io::Result<()> {
    let mut ping = [0u8; 8];
    for _ in 1..PINGS {
        s.read_exact(&mut ping).await?;
        s.write_all(&ping).await?;
    }
    Ok(())
}

async fn stream(to: &[SocketAddr], p: Probe) -> std::io::Result<()> {
    let until = Instant::now() + CONNECT_WAIT;
    let mut found = None;
    for a in to.iter().cycle() {
        if Instant::now() >= until {
            break;
        }
        if let Ok(Ok(s)) = tokio::time::timeout(TRY_WAIT, answered(*a, p)).await {
            found = Some(s);
            break;
        }
        // Refused at once (the receiver not listening yet): not a busy loop.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(mut s) = found else {
        return Err(std::io::ErrorKind::TimedOut.into());
    };
    echo_pings(&mut s).await?;
    let chunk = vec![0x5au8; CHUNK];
    loop {
        // Ends when the receiver closes (reset or broken pipe).
        s.write_all(&chunk).await?;
    }
}

/// Receives on `path` at `listener`: its figure, zero where the sender never came
/// or broke off. Connections that are not this path's sender are dropped.
pub async fn receive(listener: &TcpListener, p: Probe) -> (PathFigure, Option<SocketAddr>) {
    let path = p.path;
    let none = PathFigure {
        path,
        gbit: 0.0,
        rtt_us: 0.0,
    };
    let until = Instant::now() + CONNECT_WAIT + WINDOW;
    let Ok((mut s, local)) = tokio::time::timeout_at(until.into(), accept(listener, p)).await
    else {
        return (none, None);
    };
    let measured = tokio::time::timeout(WINDOW * (WINDOWS + 2), measure(&mut s)).await;
    match measured {
        Ok(Ok((gbit, rtt_us))) => (PathFigure { path, gbit, rtt_us }, Some(local)),
        _ => (none, Some(local)),
    }
}

/// The first connection that says it is probe `p`, with this end's address.
async fn accept(listener: &TcpListener, p: Probe) -> (TcpStream, SocketAddr) {
    let want = header(p);
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            continue;
        };
        let mut got = [0u8; 24];
        let read = tokio::time::timeout(HEADER_WAIT, s.read_exact(&mut got)).await;
        if matches!(read, Ok(Ok(_))) && got == want {
            if let Ok(local) = s.local_addr() {
                return (s, local);
            }
        }
    }
}

/// The stream's rate (Gbit/s) over the window, or over a second window where the
/// first paused, and the quickest round trip (us).
async fn measure(s: &mut TcpStream) -> std::io::Result<(f64, f64)> {
    s.set_nodelay(true)?;
    let mut rtt = f64::INFINITY;
    let mut ping = [0u8; 8];
    for i in 0..PINGS {
        ping[0] = i as u8;
        let t = Instant::now();
        s.write_all(&ping).await?;
        s.read_exact(&mut ping).await?;
        rtt = rtt.min(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut buf = vec![0u8; CHUNK];
    // Counted from the end of the first read: the time to the first byte is not
    // the link's rate.
    if s.read(&mut buf).await? == 0 {
        return Ok((0.0, rtt));
    }
    let mut counted = window(s, &mut buf).await;
    for _ in 1..WINDOWS {
        if !counted.paused || counted.ended {
            break;
        }
        drain(s, &mut buf);
        counted = window(s, &mut buf).await;
    }
    Ok((counted.gbit, rtt))
}

/// Reads, uncounted, what waits in the socket (at most [`DRAIN_BYTES`]): after a
/// receiver that was not scheduled, the backlog is the pause's, not the next
/// window's rate.
fn drain(s: &TcpStream, buf: &mut [u8]) {
    let mut left = DRAIN_BYTES;
    while left > 0 {
        match s.try_read(buf) {
            Ok(n) if n > 0 => left = left.saturating_sub(n),
            _ => return,
        }
    }
}

/// One window's count.
#[derive(Debug, Clone, Copy)]
struct Counted {
    gbit: f64,
    /// No bytes came for [`PAUSE`] or longer.
    paused: bool,
    /// The sender closed or broke off.
    ended: bool,
}

/// Counts what arrives over one window.
async fn window(s: &mut TcpStream, buf: &mut [u8]) -> Counted {
    let start = Instant::now();
    let (mut bytes, mut last, mut paused, mut ended) = (0u64, start, false, false);
    while start.elapsed() < WINDOW {
        let left = WINDOW.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, s.read(buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                ended = true;
                break;
            }
            Err(_) => break,
            Ok(Ok(m)) => {
                bytes += m as u64;
                paused |= last.elapsed() >= PAUSE;
                last = Instant::now();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-6);
    Counted {
        gbit: bytes as f64 * 8.0 / secs / 1e9,
        paused: paused || (!ended && last.elapsed() >= PAUSE),
        ended,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_path_on_loopback_is_measured_and_strangers_are_ignored() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = l.local_addr().unwrap();
        let p = Probe {
            k: 1,
            path: Path { from: 1, to: 0 },
            nonce: 0x5eed,
        };
        // A stranger, the same path of another round, and one without the nonce
        // connect first.
        let mut stranger = TcpStream::connect(at).await.unwrap();
        stranger
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let stale = tokio::spawn(async move { send(&[at], Probe { k: 0, ..p }).await });
        let forged = tokio::spawn(async move { send(&[at], Probe { nonce: 1, ..p }).await });
        // The first address names no receiver: the next one is tried.
        let closed = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            send(&[closed, at], p).await
        });
        let (f, local) = receive(&l, p).await;
        assert!(f.gbit > 0.1, "loopback carries more than 100 Mbit/s: {f:?}");
        assert!(f.rtt_us > 0.0 && f.rtt_us < 100_000.0, "{f:?}");
        assert_eq!(local.unwrap().ip(), at.ip());
        let _ = tokio::join!(sender, stale, forged);
    }

    /// A sender at a steady `mbit`, silent for `pause` once it has sent for 100 ms.
    async fn paced(at: SocketAddr, p: Probe, mbit: u64, pause: Option<Duration>) {
        let mut s = answered(at, p).await.unwrap();
        echo_pings(&mut s).await.unwrap();
        // A chunk every 5 ms, late ticks caught up: the rate holds on a busy host.
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let chunk = vec![0u8; (mbit * 1_000_000 / 8 / 200) as usize];
        let start = Instant::now();
        let mut pause = pause;
        loop {
            tick.tick().await;
            if start.elapsed() > Duration::from_millis(100) {
                if let Some(p) = pause.take() {
                    tokio::time::sleep(p).await;
                    tick.reset();
                }
            }
            if s.write_all(&chunk).await.is_err() {
                return;
            }
        }
    }

    async fn paced_figure(mbit: u64, pause: Option<Duration>) -> (f64, Duration) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = l.local_addr().unwrap();
        let p = Probe {
            k: 0,
            path: Path { from: 1, to: 0 },
            nonce: 3,
        };
        let sender = tokio::spawn(paced(at, p, mbit, pause));
        let t = Instant::now();
        let (f, _) = receive(&l, p).await;
        let took = t.elapsed();
        let _ = sender.await;
        (f.gbit * 1000.0, took)
    }

    /// A steady trickle (a shaped link) is its rate, counted once; a stream that
    /// stopped for 350 ms of its window (a sender not scheduled) is counted again,
    /// not called a third of its rate.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trickle_is_its_rate_and_a_pause_is_counted_again() {
        let (mbit, _) = paced_figure(40, None).await;
        assert!((28.0..60.0).contains(&mbit), "{mbit} Mbit/s");
        let (mbit, took) = paced_figure(40, Some(Duration::from_millis(350))).await;
        assert!((28.0..60.0).contains(&mbit), "{mbit} Mbit/s");
        assert!(took >= WINDOW * 2, "two windows: {took:?}");
    }

    #[tokio::test]
    async fn a_sender_that_never_comes_is_a_zero_within_the_wait() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let t = Instant::now();
        let p = Probe {
            k: 0,
            path: Path { from: 2, to: 0 },
            nonce: 7,
        };
        let (f, local) = receive(&l, p).await;
        assert_eq!((f.gbit, f.rtt_us, local), (0.0, 0.0, None));
        assert!(t.elapsed() < CONNECT_WAIT + WINDOW + Duration::from_millis(500));
    }
}

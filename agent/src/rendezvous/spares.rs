//! Spares (nodes that arrived after a round closed and wait for the next) told alive
//! from dead. etcd's leases forget a dead spare on their own; a TCPStore's counter
//! never goes down, so there each spare's beat has to be seen moving. A dead spare
//! counted as waiting would have the nodes restart for it, or go on without a
//! refused node, and then wait out the join timeout for a node that never comes.

use super::backend::{Backend, Kv, KvError};
use std::time::{Duration, Instant};

/// Watches the spares over repeated looks: one that has not beaten for `limit` is
/// dead; one seen for the first time is alive until it has been silent that long.
pub(super) struct SpareBeats {
    last: Vec<(i64, Instant)>,
    limit: Duration,
}

impl SpareBeats {
    pub(super) fn new(limit: Duration) -> SpareBeats {
        SpareBeats {
            last: Vec::new(),
            limit,
        }
    }

    /// How many of the spares counted under `key` are alive at this look.
    pub(super) async fn alive(&mut self, c: &mut Kv, key: &str) -> Result<u64, KvError> {
        let Some(beats) = c.tally_beats(key).await? else {
            return c.tally_count(key).await;
        };
        Ok(self.observe(&beats, Instant::now()))
    }

    fn observe(&mut self, beats: &[i64], now: Instant) -> u64 {
        if self.last.len() < beats.len() {
            self.last.resize(beats.len(), (i64::MIN, now));
        }
        let mut alive = 0;
        for (last, &beat) in self.last.iter_mut().zip(beats) {
            if beat != last.0 {
                *last = (beat, now);
            }
            if now.duration_since(last.1) <= self.limit {
                alive += 1;
            }
        }
        alive
    }
}

/// How many of the spares counted under `key` are alive, for a decision taken once:
/// in a TCPStore, those whose beat moved within `window` (longer than a keep-alive).
pub async fn alive_spares(c: &mut Kv, key: &str, window: Duration) -> Result<u64, KvError> {
    let Some(before) = c.tally_beats(key).await? else {
        return c.tally_count(key).await;
    };
    if before.is_empty() {
        return Ok(0);
    }
    tokio::time::sleep(window).await;
    let after = c.tally_beats(key).await?.unwrap_or_default();
    let moved = after
        .iter()
        .enumerate()
        .filter(|(i, beat)| before.get(*i) != Some(*beat))
        .count();
    Ok(u64::try_from(moved).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::test_client as client;
    use crate::store::StoreServer;

    const BEAT: Duration = Duration::from_millis(100);

    /// A spare that counts itself under `key`, then beats every BEAT until dropped.
    async fn spare(port: u16, key: &'static str) -> tokio::task::JoinHandle<()> {
        let mut c = client(port).await;
        let place = c.tally_alive(key, BEAT * 3, None).await.unwrap();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(BEAT).await;
                c.tally_alive(key, BEAT * 3, Some(place)).await.unwrap();
            }
        })
    }

    #[tokio::test]
    async fn a_spare_that_stopped_beating_is_not_counted_alive() {
        let s = StoreServer::bind(0).unwrap();
        let live = spare(s.port(), "w").await;
        let dead = spare(s.port(), "w").await;
        dead.abort();
        let mut c = client(s.port()).await;
        assert_eq!(
            c.tally_count("w").await.unwrap(),
            2,
            "the counter never forgets"
        );
        assert_eq!(alive_spares(&mut c, "w", BEAT * 3).await.unwrap(), 1);
        live.abort();
        tokio::time::sleep(BEAT).await;
        assert_eq!(alive_spares(&mut c, "w", BEAT * 3).await.unwrap(), 0);
        assert_eq!(alive_spares(&mut c, "none", BEAT * 3).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn looks_forget_a_spare_once_it_has_been_silent_past_the_limit() {
        let s = StoreServer::bind(0).unwrap();
        let live = spare(s.port(), "w").await;
        let dead = spare(s.port(), "w").await;
        dead.abort();
        let mut c = client(s.port()).await;
        let mut beats = SpareBeats::new(BEAT * 3);
        // First seen: both alive until silent for the limit.
        assert_eq!(beats.alive(&mut c, "w").await.unwrap(), 2);
        tokio::time::sleep(BEAT * 5).await;
        assert_eq!(beats.alive(&mut c, "w").await.unwrap(), 1);
        live.abort();
        tokio::time::sleep(BEAT * 5).await;
        assert_eq!(beats.alive(&mut c, "w").await.unwrap(), 0);
    }

    #[test]
    fn a_place_that_appears_later_is_watched_from_then() {
        let t0 = Instant::now();
        let mut beats = SpareBeats::new(Duration::from_secs(1));
        assert_eq!(beats.observe(&[1], t0), 1);
        assert_eq!(beats.observe(&[1, 1], t0 + Duration::from_millis(1500)), 1);
        assert_eq!(beats.observe(&[2, 1], t0 + Duration::from_millis(2000)), 2);
        assert_eq!(beats.observe(&[2, 1], t0 + Duration::from_millis(3100)), 0);
    }
}

//! Spares (nodes that arrived after a round closed and wait for the next) told alive
//! from dead. etcd's leases forget a dead spare on their own; a TCPStore's counter
//! never goes down, so there each spare's beat has to be seen moving. A dead spare
//! counted as waiting would have the nodes restart for it, or go on without a
//! refused node, and then wait out the join timeout for a node that never comes.

use super::backend::{Backend, Beat, Kv, KvError};
use super::config::Config;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Beyond a keep-alive: a spare's loop polls every 100 ms and makes a few requests
/// of the store before it beats.
const SLACK: Duration = Duration::from_secs(1);

/// A time in which a living spare that beats every `keepalive` beats at least once:
/// two keep-alives and a second.
pub fn beat_window(keepalive: Duration) -> Duration {
    keepalive.saturating_mul(2).saturating_add(SLACK)
}

/// How long a spare may go without a beat before the running nodes take it as dead:
/// the keep-alive timeout, and never under `beat_window` (a short interval or a
/// single allowed miss would lose a living spare between two of its beats).
pub(super) fn silence_limit(cfg: &Config) -> Duration {
    let timeout = cfg.keepalive_interval * cfg.keepalive_misses;
    timeout.max(beat_window(cfg.keepalive_interval))
}

/// Watches the spares over repeated looks: one that has not beaten for `limit` is
/// dead; one seen for the first time is alive until it has been silent that long
/// (so a watch that starts late counts a long-dead spare for that long).
pub(super) struct SpareBeats {
    last: BTreeMap<u64, (i64, Instant)>,
    limit: Duration,
}

impl SpareBeats {
    pub(super) fn new(limit: Duration) -> SpareBeats {
        SpareBeats {
            last: BTreeMap::new(),
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

    fn observe(&mut self, beats: &[Beat], now: Instant) -> u64 {
        // Places no longer read (the newest are) are forgotten.
        self.last
            .retain(|place, _| beats.iter().any(|b| b.0 == *place));
        let mut alive = 0;
        for &(place, beat) in beats {
            let last = self.last.entry(place).or_insert((beat, now));
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
    let before: BTreeMap<u64, i64> = before.into_iter().collect();
    let after = c.tally_beats(key).await?.unwrap_or_default();
    let moved = after
        .iter()
        .filter(|(place, beat)| before.get(place) != Some(beat));
    Ok(u64::try_from(moved.count()).unwrap_or(u64::MAX))
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

    #[tokio::test]
    async fn a_spare_that_restarts_again_and_again_grows_no_look_without_bound() {
        let s = StoreServer::bind(0).unwrap();
        let mut c = client(s.port()).await;
        for _ in 0..300 {
            c.tally_alive("w", BEAT, None).await.unwrap();
        }
        let beats = c.tally_beats("w").await.unwrap().unwrap();
        let places: Vec<u64> = beats.iter().map(|b| b.0).collect();
        assert_eq!(places, (44..300).collect::<Vec<u64>>());
        assert!(beats.iter().all(|b| b.1 == 1), "{beats:?}");
    }

    #[test]
    fn a_place_that_appears_later_is_watched_from_then() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut beats = SpareBeats::new(Duration::from_secs(1));
        assert_eq!(beats.observe(&[(0, 1)], t0), 1);
        assert_eq!(beats.observe(&[(0, 1), (1, 1)], at(1500)), 1);
        assert_eq!(beats.observe(&[(0, 2), (1, 1)], at(2000)), 2);
        assert_eq!(beats.observe(&[(0, 2), (1, 1)], at(3100)), 0);
        // Place 0 no longer read (only the newest are): forgotten, not counted.
        assert_eq!(beats.observe(&[(1, 2)], at(3200)), 1);
        assert_eq!(beats.last.len(), 1);
    }

    #[test]
    fn a_short_keep_alive_still_leaves_room_for_a_beat() {
        let mut cfg = crate::rendezvous::tests::cfg(crate::rendezvous::Shape::Static { nnodes: 2 });
        cfg.keepalive_interval = Duration::from_millis(50);
        cfg.keepalive_misses = 1;
        assert_eq!(silence_limit(&cfg), Duration::from_millis(1100));
        cfg.keepalive_interval = Duration::from_secs(5);
        cfg.keepalive_misses = 3;
        assert_eq!(silence_limit(&cfg), Duration::from_secs(15));
    }
}

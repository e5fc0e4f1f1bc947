//! The job-wide straggler decision on several nodes. Each node writes its rank rows
//! under `ranks/<node>` at every sample; the node hosting the workers' store reads
//! every node's, decides, prints each change, and writes the job's view (rows,
//! stragglers, the lines said with a count) under `stragglers`, where the other
//! nodes read it, print each change once, and show it in `toporun top`.

use crate::job::session::meeting::Meeting;
use crate::status::JobStatus;
use crate::store::{StoreClient, StoreError};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use toporun_shared::stacks::straggler::{RankRow, Straggler, Verdicts};
use toporun_shared::stacks::top_table::TopTable;

/// The job's view, as the deciding node writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Notice {
    /// Counts the changes said, so each node prints each once.
    seq: u32,
    said: Vec<String>,
    stragglers: Vec<Straggler>,
    ranks: Vec<RankRow>,
}

/// Starts exchanging this node's rows (sent at each sample).
pub fn start(
    x: Meeting,
    span: Duration,
    mut rows: watch::Receiver<Vec<RankRow>>,
    status: JobStatus,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut c = match x.connect().await {
            Ok(c) => c,
            Err(e) => return unavailable(&e),
        };
        let mut verdicts = Verdicts::default();
        let start = Instant::now();
        let mut seen = 0;
        while rows.changed().await.is_ok() {
            let mine = rows.borrow_and_update().clone();
            let step = if x.decides {
                x.judge_rows(&mut c, &mine, &mut verdicts, start.elapsed(), span)
                    .await
            } else {
                x.follow_view(&mut c, &mine, &mut seen).await
            };
            match step {
                Ok(Some(n)) => show(&status, span, n),
                Ok(None) => {}
                Err(e) => return unavailable(&e),
            }
        }
    })
}

fn unavailable(e: &StoreError) {
    crate::console::say_warning!("job-wide straggler detection stopped: the workers' store is unreachable ({e}); `toporun top` shows this node's ranks");
}

/// The job's view in `toporun top`, `/status` and `/metrics`.
fn show(status: &JobStatus, span: Duration, n: Notice) {
    status.update(|x| {
        x.top = TopTable {
            window_s: span.as_secs(),
            job_wide: true,
            ranks: n.ranks,
            stragglers: n.stragglers.clone(),
        };
        x.stragglers = n.stragglers;
    });
}

impl Meeting {
    /// Publishes this node's rows, reads every node's, judges and writes the view.
    async fn judge_rows(
        &self,
        c: &mut StoreClient,
        mine: &[RankRow],
        verdicts: &mut Verdicts,
        now: Duration,
        span: Duration,
    ) -> Result<Option<Notice>, StoreError> {
        self.publish_rows(c, mine).await?;
        let keys: Vec<String> = (0..self.nnodes).map(|n| self.keys.rank_rows(n)).collect();
        let mut present = Vec::new();
        for k in &keys {
            if c.check(&[k.as_str()]).await? {
                present.push(k.as_str());
            }
        }
        let mut ranks: Vec<RankRow> = c
            .multi_get_now(&present)
            .await?
            .iter()
            .filter_map(|raw| serde_json::from_slice::<Vec<RankRow>>(raw).ok())
            .flatten()
            .collect();
        ranks.sort_by_key(|r| r.rank);
        let said = verdicts.step(now, &ranks, span);
        for line in &said {
            crate::console::say!("{line}");
        }
        let n = Notice {
            seq: verdicts.seq,
            said,
            stragglers: verdicts.current.clone(),
            ranks,
        };
        c.set(
            &self.keys.stragglers(),
            &serde_json::to_vec(&n).unwrap_or_default(),
        )
        .await?;
        Ok(Some(n))
    }

    /// Publishes this node's rows and reads the deciding node's view, printing a
    /// change not printed yet.
    async fn follow_view(
        &self,
        c: &mut StoreClient,
        mine: &[RankRow],
        seen: &mut u32,
    ) -> Result<Option<Notice>, StoreError> {
        self.publish_rows(c, mine).await?;
        let key = self.keys.stragglers();
        if !c.check(&[key.as_str()]).await? {
            return Ok(None);
        }
        let raw = c.get(&key, Duration::from_secs(5)).await?;
        let Ok(n) = serde_json::from_slice::<Notice>(&raw) else {
            return Ok(None);
        };
        if n.seq > *seen {
            for line in &n.said {
                crate::console::say!("{line}");
            }
            *seen = n.seq;
        }
        Ok(Some(n))
    }

    async fn publish_rows(&self, c: &mut StoreClient, mine: &[RankRow]) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(mine).unwrap_or_default();
        c.set(&self.keys.rank_rows(self.node_rank), &bytes).await
    }
}

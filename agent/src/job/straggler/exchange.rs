//! The job-wide straggler decision on several nodes. Each node writes its rank rows
//! under `ranks/<node>` at every sample; the node hosting the workers' store reads
//! every node's, decides, prints each change, and writes a small notice (the
//! stragglers, the lines said with a count) under `stragglers` at every sample and,
//! every few seconds, the job's view for `toporun top` under `stragglers/view`:
//! bounded to the ranks that wait least. The other nodes read the notice at every
//! sample (printing each change once) and the view as often as it is written.

use crate::job::session::meeting::Meeting;
use crate::status::JobStatus;
use crate::store::{StoreClient, StoreError};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use toporun_shared::stacks::straggler::{RankRow, StragglerNotice as Notice, Verdicts};
use toporun_shared::stacks::top_table::{job_view, JobView as View, JOB_VIEW_ROWS};

/// How often the job's view is written and read.
const VIEW_EVERY: Duration = Duration::from_secs(5);

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
        let (mut seen, mut view_at) = (0, None::<Instant>);
        while rows.changed().await.is_ok() {
            let mine = rows.borrow_and_update().clone();
            let view_due = view_at.is_none_or(|t| t.elapsed() >= VIEW_EVERY);
            let step = if x.decides {
                let now = start.elapsed();
                x.judge_rows(&mut c, &mine, &mut verdicts, now, span, view_due)
                    .await
            } else {
                x.follow_view(&mut c, &mine, &mut seen, view_due).await
            };
            match step {
                Ok((notice, view)) => {
                    view_at = view.is_some().then(Instant::now).or(view_at);
                    show(&status, span, &mine, notice, view);
                }
                Err(e) => return unavailable(&e),
            }
        }
    })
}

fn unavailable(e: &StoreError) {
    crate::console::say_warning!("job-wide straggler detection stopped: the workers' store is unreachable ({e}); `toporun top` shows this node's ranks");
}

/// The job's decision and view in `toporun top`, `/status` and `/metrics`; this
/// node's own rows always in the table.
fn show(status: &JobStatus, span: Duration, mine: &[RankRow], n: Option<Notice>, v: Option<View>) {
    status.update(|x| {
        let t = &mut x.top;
        t.window_s = span.as_secs();
        if let Some(v) = v {
            t.job_wide = true;
            t.hidden = v.total.saturating_sub(v.ranks.len() as u32);
            t.ranks = v.ranks;
        }
        // This node's rows are fresher than the view's.
        t.ranks.retain(|r| !mine.iter().any(|m| m.rank == r.rank));
        t.ranks.extend(mine.iter().cloned());
        t.ranks.sort_by_key(|r| r.rank);
        if let Some(n) = n {
            t.stragglers = n.stragglers.clone();
            x.stragglers = n.stragglers;
        }
    });
}

impl Meeting {
    /// Publishes this node's rows, reads every node's, judges and writes the
    /// notice (and the view when due).
    async fn judge_rows(
        &self,
        c: &mut StoreClient,
        mine: &[RankRow],
        verdicts: &mut Verdicts,
        now: Duration,
        span: Duration,
        view_due: bool,
    ) -> Result<(Option<Notice>, Option<View>), StoreError> {
        self.publish_rows(c, mine).await?;
        // Every node's rows now: a node not published yet is left out.
        let ranks: Vec<RankRow> = self
            .gather(c, |n| self.keys.rank_rows(n), Duration::ZERO)
            .await?
            .into_iter()
            .flatten()
            .collect();
        let said = verdicts.step(now, &ranks, span);
        for line in &said {
            crate::console::say!("{line}");
        }
        let n = Notice {
            seq: verdicts.seq,
            said: verdicts.last_said.clone(),
            stragglers: verdicts.current.clone(),
        };
        self.write(c, &self.keys.stragglers(), &n).await?;
        let view = view_due.then(|| View {
            total: ranks.len() as u32,
            ranks: job_view(ranks, &n.stragglers, JOB_VIEW_ROWS),
        });
        if let Some(v) = &view {
            self.write(c, &self.keys.straggler_view(), v).await?;
        }
        Ok((Some(n), view))
    }

    /// Publishes this node's rows and reads the deciding node's notice (printing a
    /// change not printed yet) and, when due, its view.
    async fn follow_view(
        &self,
        c: &mut StoreClient,
        mine: &[RankRow],
        seen: &mut u32,
        view_due: bool,
    ) -> Result<(Option<Notice>, Option<View>), StoreError> {
        self.publish_rows(c, mine).await?;
        let n = self.read(c, &self.keys.stragglers()).await?;
        if let Some(n) = n.as_ref().filter(|n| n.seq > *seen) {
            for line in &n.said {
                crate::console::say!("{line}");
            }
            *seen = n.seq;
        }
        let view = match view_due {
            true => self.read(c, &self.keys.straggler_view()).await?,
            false => None,
        };
        Ok((n, view))
    }

    async fn publish_rows(&self, c: &mut StoreClient, mine: &[RankRow]) -> Result<(), StoreError> {
        let key = self.keys.rank_rows(self.node_rank);
        c.set(key.name(), &key.encode_slice(mine)).await
    }
}

//! The live NCCL transport report: NCCL writes its init to per-rank files in the run
//! directory (unless the user chose otherwise), toporun follows them, and once every
//! local rank's communicator is up each node reports what NCCL chose; the host merges
//! the nodes' digests through the store into one job-wide report.

use crate::job::run_dir::write_json;
use crate::job::spec::Job;
use crate::nccl_watch::NcclWatch;
use crate::store::StoreClient;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toporun_shared::finding::FindingId;
use toporun_shared::finding::{Finding, Severity};
use toporun_shared::nccl_counters::{PluginKind, ProfilerReport};
use toporun_shared::nccl_log::TRANSPORT_ID;
use toporun_shared::nccl_log::{self, Digest, Topology};

/// Where the node digests meet: the round's `nccl/<node>` keys in the workers' store.
pub struct ReportStore {
    pub host: String,
    pub port: u16,
    pub keys: crate::rendezvous::RoundKeys,
    pub node_rank: u32,
    pub nnodes: u32,
    pub is_host: bool,
    /// NCCL hosts toporun expects the job to form (from the co-location model).
    pub expected_nccl_nodes: Option<u32>,
    /// The machine (boot_id) of every global rank, as the rendezvous learned it.
    pub rank_machines: Vec<Option<String>>,
}

/// How long after every rank's init the report waits for transport lines.
const CONNECT_GRACE: Duration = Duration::from_secs(30);

pub struct Reporter {
    watch: Arc<Mutex<NcclWatch>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Set when the attempt ended: report what there is, wait briefly for the others.
    ended: Arc<AtomicBool>,
    /// Wakes the follower at once when the attempt ends (a 0.1 s job must not wait
    /// for the next poll).
    wake: Arc<tokio::sync::Notify>,
    facts: toporun_shared::facts::HostFacts,
}

fn print(f: &Finding) {
    crate::console::say!(
        "toporun: {}: {}: {}{}",
        f.severity,
        f.id,
        f.summary,
        f.remedy
            .as_ref()
            .map(|r| format!(". Fix: {r}"))
            .unwrap_or_default()
    );
}

fn judged(
    watch: &NcclWatch,
    facts: &toporun_shared::facts::HostFacts,
) -> (nccl_log::LogReport, Vec<Finding>) {
    let mut r = watch.report();
    nccl_log::judge(&mut r, Some(&Topology { facts }));
    let f = nccl_log::findings(&r);
    (r, f)
}

impl Reporter {
    /// Starts following; `nproc` local ranks; the report goes to `run_dir`.
    pub fn start(
        p: &Job,
        dir: &Path,
        prefix: &str,
        nproc: u32,
        run_dir: &Path,
        store: Option<ReportStore>,
    ) -> Reporter {
        let _ = std::fs::create_dir_all(dir);
        let watch = Arc::new(Mutex::new(NcclWatch::new(dir, prefix)));
        let w = watch.clone();
        let facts = p.facts.clone();
        let profiler = p.watch.nccl_profiler.report();
        let run_dir = run_dir.to_path_buf();
        let ended = Arc::new(AtomicBool::new(false));
        let end = ended.clone();
        let wake = Arc::new(tokio::sync::Notify::new());
        let woken = wake.clone();
        let task = tokio::spawn(async move {
            // Ready once every local rank's init completed and it connected its
            // transports (NCCL connects most at the first collective, after init);
            // a rank that never runs a collective is given CONNECT_GRACE.
            let mut complete_at: Option<std::time::Instant> = None;
            loop {
                let stop = end.load(Ordering::Relaxed);
                let (complete, linked) = {
                    let mut g = w.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    g.poll();
                    (
                        g.completed() >= nproc as usize,
                        g.linked() >= nproc as usize,
                    )
                };
                if complete && complete_at.is_none() {
                    complete_at = Some(std::time::Instant::now());
                }
                let grace = complete_at.is_some_and(|t| t.elapsed() > CONNECT_GRACE);
                if (complete && linked) || grace || stop {
                    break;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = woken.notified() => {}
                }
            }
            let (report, findings) = judged(
                &w.lock().unwrap_or_else(std::sync::PoisonError::into_inner),
                &facts,
            );
            if report.comms.is_empty() && findings.is_empty() {
                return; // no NCCL in this job (gloo, CPU)
            }
            let digest = Digest::of(&report, findings);
            write_json(
                &run_dir.join("nccl-report.json"),
                &serde_json::json!({"node": &digest, "communicators": &report.comms, "nccl_profiler": &profiler}),
            );
            if profiler.plugin == PluginKind::User {
                // The reason the report below has no NCCL-side progress: said with it.
                crate::console::say!("toporun: nccl: {}", profiler.says);
            }
            match store {
                None => job_report(digest, None, &[], &run_dir, &profiler),
                Some(s) => {
                    // Every node judges its own line by the machines the rendezvous
                    // learned, as the job-wide report does: NET between ranks of one
                    // machine is below what the hardware allows on every node's line.
                    let (digest, same_machine) = node_view(digest, &s.rank_machines);
                    crate::console::say!("toporun: nccl (node {}): {}", s.node_rank, digest.line());
                    if !s.is_host {
                        same_machine.iter().for_each(print);
                    }
                    if let Err(e) = publish_and_gather(&s, &digest, &run_dir, &end, &profiler).await
                    {
                        crate::console::say!("toporun: nccl report: {e}");
                    }
                }
            }
        });
        Reporter {
            watch,
            task: Some(task),
            ended,
            wake,
            facts: p.facts.clone(),
        }
    }

    /// The attempt ended: report now if NCCL's init never completed everywhere (a
    /// short job, a failure), and give a report still gathering a few seconds.
    pub async fn finish(&mut self) {
        self.ended.store(true, Ordering::Relaxed);
        self.wake.notify_one();
        if let Some(t) = self.task.take() {
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }

    /// Known failures in the NCCL files, read now (a rank just failed).
    pub fn failures(&self) -> Vec<Finding> {
        let mut g = self
            .watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.poll();
        judged(&g, &self.facts)
            .1
            .into_iter()
            .filter(|f| f.severity == Severity::Error && f.id != TRANSPORT_ID)
            .collect()
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// NET between ranks of one machine (co-located nodes NCCL kept apart): the nodes'
/// files cannot tell, the rendezvous can.
fn same_machine_net(d: &mut Digest, machines: &[Option<String>]) -> Option<Finding> {
    let world = d.world()?.id.clone();
    let c = d.comms.iter_mut().find(|c| c.id == world)?;
    let machine = |r: u32| machines.get(r as usize).cloned().flatten();
    let mut hit = Vec::new();
    for (via, pairs) in &c.pairs {
        if !via.starts_with("NET") {
            continue;
        }
        for &(a, b) in pairs {
            if machine(a).is_some() && machine(a) == machine(b) {
                hit.push(format!("{a}-{b} via {via}"));
            }
        }
    }
    if hit.is_empty() {
        return None;
    }
    c.below_best.extend(hit.iter().cloned());
    Some(
        Finding::new(TRANSPORT_ID, Severity::Warning, format!("ranks {} run on one machine but NCCL connected them over the network: the hardware allows P2P between them", hit.join(", ")))
            .fact("cost", format!("measured on 2x H200: {} GB/s between two such pods instead of {} GB/s joined", toporun_shared::measured::POD_SOCKET_GBPS, toporun_shared::measured::POD_JOINED_GBPS))
            .remedy("one pod per node with all its GPUs; where pods must stay separate, give them one /dev/shm (hostIPC or a hostPath mount) and let toporun join them (--colocated join, the default)"),
    )
}

/// A node's digest judged with the job's machines: NET links between ranks of one
/// machine counted below the best, with the finding that says so.
fn node_view(mut d: Digest, machines: &[Option<String>]) -> (Digest, Option<Finding>) {
    let f = same_machine_net(&mut d, machines);
    (d, f)
}

fn job_report(
    mut d: Digest,
    expected_nodes: Option<u32>,
    machines: &[Option<String>],
    run_dir: &Path,
    profiler: &ProfilerReport,
) {
    let same_machine = same_machine_net(&mut d, machines);
    let mut findings = d.findings.clone();
    findings.extend(same_machine);
    if let (Some(want), Some(got)) = (expected_nodes, d.world().and_then(|c| c.nnodes)) {
        if want != got {
            findings.push(Finding::new(FindingId::NcclPrediction, Severity::Warning, format!("toporun predicted {want} NCCL host(s) for this job, NCCL counted {got}: toporun's co-location model missed how NCCL identified the hosts (NCCL_HOSTID, hostname, /dev/shm); the run directory's nccl-report-job.json has the details")));
        }
    }
    crate::console::say!("toporun: nccl: {}", d.line());
    for f in &findings {
        print(f);
    }
    write_json(
        &run_dir.join("nccl-report-job.json"),
        &serde_json::json!({"job": d, "findings": findings, "expected_nccl_nodes": expected_nodes, "nccl_profiler": profiler}),
    );
}

async fn publish_and_gather(
    s: &ReportStore,
    d: &Digest,
    run_dir: &Path,
    ended: &AtomicBool,
    profiler: &ProfilerReport,
) -> Result<(), crate::store::StoreError> {
    let mut c = StoreClient::connect(&s.host, s.port, Duration::from_secs(30)).await?;
    let mine = s.keys.nccl(s.node_rank);
    c.set(mine.name(), &mine.encode(d)).await?;
    if !s.is_host {
        return Ok(());
    }
    let keys: Vec<_> = (0..s.nnodes).map(|i| s.keys.nccl(i)).collect();
    let refs: Vec<&str> = keys.iter().map(|k| k.name()).collect();
    // Every node reports once its ranks' communicators are up; a node whose ranks
    // never get there leaves the job report unsaid rather than wrong.
    let wait = if ended.load(Ordering::Relaxed) {
        10
    } else {
        600
    };
    let raw = c.multi_get(&refs, Duration::from_secs(wait)).await?;
    let all: Vec<Digest> = keys
        .iter()
        .zip(&raw)
        .filter_map(|(k, b)| k.decode_or_warn(b))
        .collect();
    job_report(
        Digest::merge(&all),
        s.expected_nccl_nodes,
        &s.rank_machines,
        run_dir,
        profiler,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toporun_shared::nccl_log::CommDigest;

    /// Node 1 of two co-located 1-GPU nodes under `--colocated warn` (2x H100,
    /// tests/fixtures/device/full-node-h100x2/split-uts-warn-node1.log): its own log
    /// judged NET/Socket "best available" (it sees one GPU), while the job-wide line
    /// said "below what the hardware allows". Both now say the latter.
    fn socket_pair() -> Digest {
        let mut c = CommDigest {
            id: "world".into(),
            nranks: Some(2),
            nnodes: Some(2),
            best: 1,
            ..Default::default()
        };
        c.pairs
            .entry("NET/Socket/0".into())
            .or_default()
            .insert((0, 1));
        Digest {
            comms: vec![c],
            ..Default::default()
        }
    }

    #[test]
    fn a_node_line_counts_net_on_one_machine_below_the_best() {
        let one = Some("boot-a".to_string());
        let (d, f) = node_view(socket_pair(), &[one.clone(), one]);
        assert!(
            d.line()
                .ends_with("1 link(s) below what the hardware allows"),
            "{}",
            d.line()
        );
        assert_eq!(f.map(|f| f.id), Some(FindingId::NcclTransport));
    }

    #[test]
    fn a_node_line_keeps_net_between_machines_best() {
        let machines = [Some("boot-a".to_string()), Some("boot-b".to_string())];
        let (d, f) = node_view(socket_pair(), &machines);
        assert!(d.line().ends_with("best available"), "{}", d.line());
        assert!(f.is_none());
        let (d, _) = node_view(socket_pair(), &[]);
        assert!(d.line().ends_with("best available"), "{}", d.line());
    }
}

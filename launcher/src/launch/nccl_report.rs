//! The live NCCL transport report: NCCL writes its init to per-rank files in the run
//! directory (unless the user chose otherwise), toporun follows them, and once every
//! local rank's communicator is up each node reports what NCCL chose; the host merges
//! the nodes' digests through the store into one job-wide report.

use super::Prepared;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use toporun_agent::nccl_watch::NcclWatch;
use toporun_agent::store::StoreClient;
use toporun_shared::finding::{Finding, Severity};
use toporun_shared::nccl_log::{self, Digest, Topology};

/// How this launch learns what NCCL did.
pub enum Capture {
    Off(String),
    Files {
        dir: PathBuf,
        prefix: String,
        /// Variables toporun adds to the ranks (none when the user set the file).
        env: BTreeMap<String, String>,
    },
}

pub fn enabled(p: &Prepared) -> bool {
    p.nccl_report
}

/// Decides the capture for one attempt directory.
pub fn capture(p: &Prepared, attempt_dir: &Path) -> Capture {
    if !enabled(p) {
        return Capture::Off("--nccl-report off".into());
    }
    let user = |k: &str| p.parent_env.get(k).filter(|v| !v.is_empty());
    if let Some(pattern) = user("NCCL_DEBUG_FILE") {
        let path = Path::new(pattern);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Capture::Files {
            dir: path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            prefix: name.split('%').next().unwrap_or("").to_string(),
            env: BTreeMap::new(),
        };
    }
    if let Some(level) = user("NCCL_DEBUG") {
        return Capture::Off(format!("NCCL_DEBUG={level} set by you without NCCL_DEBUG_FILE: NCCL prints to the ranks' console, toporun reads no file"));
    }
    let dir = attempt_dir.join("nccl");
    let mut env = BTreeMap::from([
        ("NCCL_DEBUG".to_string(), "INFO".to_string()),
        (
            "NCCL_DEBUG_FILE".to_string(),
            dir.join("nccl.%h.%p.log").display().to_string(),
        ),
    ]);
    if user("NCCL_DEBUG_SUBSYS").is_none() {
        // INIT carries the version, the communicators and every `via` line.
        env.insert("NCCL_DEBUG_SUBSYS".into(), "INIT".into());
    }
    Capture::Files {
        dir,
        prefix: "nccl.".into(),
        env,
    }
}

/// Where the node digests meet: keys under the round's prefix of the store.
pub struct ReportStore {
    pub host: String,
    pub port: u16,
    pub prefix: String,
    pub node_rank: u32,
    pub nnodes: u32,
    pub is_host: bool,
    /// NCCL hosts toporun expects the job to form (from the co-location model).
    pub expected_nccl_nodes: Option<u32>,
}

pub struct Reporter {
    watch: Arc<Mutex<NcclWatch>>,
    task: Option<tokio::task::JoinHandle<()>>,
    /// Set when the attempt ended: report what there is, wait briefly for the others.
    ended: Arc<AtomicBool>,
    facts: toporun_shared::facts::HostFacts,
}

fn print(prefix: &str, f: &Finding) {
    eprintln!(
        "toporun: {}: {}: {}{}",
        f.severity,
        f.id,
        f.summary,
        f.remedy
            .as_ref()
            .map(|r| format!(". Fix: {r}"))
            .unwrap_or_default()
    );
    let _ = prefix;
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

fn write_json(path: &Path, v: &impl serde::Serialize) {
    if let Ok(s) = serde_json::to_string_pretty(v) {
        let _ = std::fs::write(path, s);
    }
}

impl Reporter {
    /// Starts following; `nproc` local ranks; the report goes to `run_dir`.
    pub fn start(
        p: &Prepared,
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
        let run_dir = run_dir.to_path_buf();
        let ended = Arc::new(AtomicBool::new(false));
        let end = ended.clone();
        let task = tokio::spawn(async move {
            loop {
                let stop = end.load(Ordering::Relaxed);
                let ready = {
                    let mut g = w.lock().expect("watch lock");
                    g.poll();
                    g.completed() >= nproc as usize
                };
                if ready || stop {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let (report, findings) = judged(&w.lock().expect("watch lock"), &facts);
            if report.comms.is_empty() && findings.is_empty() {
                return; // no NCCL in this job (gloo, CPU)
            }
            let digest = Digest::of(&report, findings);
            write_json(
                &run_dir.join("nccl-report.json"),
                &serde_json::json!({"node": &digest, "communicators": &report.comms}),
            );
            match store {
                None => job_report(&digest, None, &run_dir),
                Some(s) => {
                    eprintln!("toporun: nccl (node {}): {}", s.node_rank, digest.line());
                    if let Err(e) = publish_and_gather(&s, &digest, &run_dir, &end).await {
                        eprintln!("toporun: nccl report: {e}");
                    }
                }
            }
        });
        Reporter {
            watch,
            task: Some(task),
            ended,
            facts: p.facts.clone(),
        }
    }

    /// The attempt ended: report now if NCCL's init never completed everywhere (a
    /// short job, a failure), and give a report still gathering a few seconds.
    pub async fn finish(&mut self) {
        self.ended.store(true, Ordering::Relaxed);
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
        let mut g = self.watch.lock().expect("watch lock");
        g.poll();
        judged(&g, &self.facts)
            .1
            .into_iter()
            .filter(|f| f.severity == Severity::Error && f.id != "nccl.transport")
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

fn job_report(d: &Digest, expected_nodes: Option<u32>, run_dir: &Path) {
    let mut findings = d.findings.clone();
    if let (Some(want), Some(got)) = (expected_nodes, d.world().and_then(|c| c.nnodes)) {
        if want != got {
            findings.push(Finding::new("nccl.prediction", Severity::Warning, format!("toporun expected NCCL to see {want} host(s), NCCL counted {got} nodes: its host identity (NCCL_HOSTID, hostname, /dev/shm) differs from what toporun read; please report this with the run directory's nccl-report.json")));
        }
    }
    eprintln!("toporun: nccl: {}", d.line());
    for f in &findings {
        print("", f);
    }
    write_json(
        &run_dir.join("nccl-report-job.json"),
        &serde_json::json!({"job": d, "findings": findings, "expected_nccl_nodes": expected_nodes}),
    );
}

async fn publish_and_gather(
    s: &ReportStore,
    d: &Digest,
    run_dir: &Path,
    ended: &AtomicBool,
) -> anyhow::Result<()> {
    let mut c = StoreClient::connect(&s.host, s.port, Duration::from_secs(30)).await?;
    c.set(
        &format!("{}{}", s.prefix, s.node_rank),
        &serde_json::to_vec(d)?,
    )
    .await?;
    if !s.is_host {
        return Ok(());
    }
    let keys: Vec<String> = (0..s.nnodes).map(|i| format!("{}{i}", s.prefix)).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Every node reports once its ranks' communicators are up; a node whose ranks
    // never get there leaves the job report unsaid rather than wrong.
    let wait = if ended.load(Ordering::Relaxed) {
        10
    } else {
        600
    };
    let raw = c.multi_get(&refs, Duration::from_secs(wait)).await?;
    let all: Vec<Digest> = raw
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok())
        .collect();
    job_report(&Digest::merge(&all), s.expected_nccl_nodes, run_dir);
    Ok(())
}

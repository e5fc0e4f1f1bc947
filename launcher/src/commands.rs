//! toporun's own subcommands: `probe`, `topo`, `preflight`, `bench` (and the
//! dispatch to `nccl-log`), on typed arguments.

use crate::documents;
use crate::exit::{CannotRun, ExitStatus};
use crate::facts_source;
use crate::output::{self, Style};
use crate::subcommands::{
    Bench, BenchBackend, Cli, Globals, Metadata, PreflightArgs, PreflightFormat, ReportFormat, Sub,
};
use anyhow::Result;
use toporun_agent::job::stacks_socket::Request;
use toporun_shared::finding::{worst, Severity};
use toporun_shared::preflight::{self, PreflightOptions, Requirement};
use toporun_shared::units::parse_size;

pub fn dispatch(cli: Cli) -> ExitStatus {
    crate::exit::quiet_on_closed_pipe();
    let g = &cli.globals;
    let result = match cli.command {
        Sub::Probe { format, metadata } => probe(g, format, &metadata),
        Sub::Topo { format } => topo(g, format),
        Sub::Preflight(args) => preflight(g, &args),
        Sub::NcclLog { files, format } => crate::nccl_log_cmd::run(g, &files, format),
        Sub::Stacks { run_dir, format } => stacks(run_dir.as_deref(), format),
        Sub::Top {
            run_dir,
            format,
            once,
        } => top(run_dir.as_deref(), format, once),
        Sub::FrTrace { paths, format } => crate::fr_trace_cmd::run(&paths, format),
        Sub::Bench {
            which:
                Bench::Rendezvous {
                    nodes,
                    backend,
                    endpoint,
                    timeout,
                    format,
                    in_process,
                },
        } => bench_rendezvous(
            nodes,
            backend,
            endpoint.as_deref(),
            timeout,
            format,
            in_process,
        ),
        Sub::Bench {
            which: Bench::StoreServer,
        } => bench_store_server(),
        Sub::Bench {
            which:
                Bench::Stacks {
                    python,
                    ranks,
                    seconds,
                    interval_ms,
                },
        } => crate::bench_stacks::run(&python, ranks, seconds, interval_ms),
    };
    result.unwrap_or_else(|e| crate::exit::report(&e))
}

fn facts(g: &Globals) -> Result<toporun_shared::facts::HostFacts> {
    facts_source::load(g.facts.as_ref(), g.nvidia_smi_topo.as_ref())
}

/// Live facts with the instance type from the cloud's metadata service, asked while
/// the host is probed (it costs nothing then, BUDGET at most off-cloud).
fn facts_and_cloud(g: &Globals, metadata: &Metadata) -> Result<toporun_shared::facts::HostFacts> {
    use toporun_agent::probe::cloud_metadata::{self, Endpoints};
    let ask = (g.facts.is_none() && !metadata.no_metadata).then(|| {
        std::thread::spawn(|| {
            cloud_metadata::instance(&Endpoints::from_env(|k| std::env::var(k).ok()))
        })
    });
    let mut f = facts(g)?;
    if let Some(asked) = ask {
        f.cloud = asked.join().ok().flatten();
    }
    Ok(f)
}

fn probe(g: &Globals, format: ReportFormat, metadata: &Metadata) -> Result<ExitStatus> {
    let f = facts_and_cloud(g, metadata)?;
    match format {
        ReportFormat::Json => println!("{}", f.to_json()),
        ReportFormat::Text => print!(
            "{}{}",
            output::host_summary(&f),
            if f.gpus.count() > 0 {
                output::matrix_text(&f)
            } else {
                String::new()
            }
        ),
    }
    Ok(ExitStatus::Success)
}

fn topo(g: &Globals, format: ReportFormat) -> Result<ExitStatus> {
    let f = facts(g)?;
    if format == ReportFormat::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&documents::Topo::of(&f))?
        );
        return Ok(ExitStatus::Success);
    }
    if f.gpus.count() == 0 {
        println!(
            "no GPU visible{}",
            f.gpus
                .nvml_error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    } else {
        print!("{}", output::matrix_text(&f));
        let bad: Vec<String> = f
            .gpus
            .p2p
            .iter()
            .filter(|p| !(p.read.ok_or_unknown() && p.write.ok_or_unknown()))
            .map(|p| {
                format!(
                    "GPU{}-GPU{} read {:?} write {:?}",
                    p.a, p.b, p.read, p.write
                )
            })
            .collect();
        println!(
            "\nP2P: {}",
            if f.gpus.p2p.is_empty() {
                "unknown (no NVML data)".to_string()
            } else if bad.is_empty() {
                "read/write OK for every pair".into()
            } else {
                bad.join("; ")
            }
        );
    }
    println!(
        "NICs: {}",
        f.nics
            .iter()
            .map(|n| format!(
                "{} ({}{}{})",
                n.name,
                n.state,
                n.speed_mbps
                    .map(|s| format!(", {} Gb/s", s / 1000))
                    .unwrap_or_default(),
                if n.default_route {
                    ", default route"
                } else {
                    ""
                }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "RDMA: {}",
        if f.rdma.is_empty() {
            "none".into()
        } else {
            f.rdma
                .iter()
                .map(|d| format!("{} ({:?})", d.name, d.kind))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    Ok(ExitStatus::Success)
}

fn preflight(g: &Globals, args: &PreflightArgs) -> Result<ExitStatus> {
    let min_shm = args.min_shm.as_deref().unwrap_or("1Gi");
    let min_shm_bytes = parse_size(min_shm).ok_or_else(|| {
        CannotRun(format!(
            "--min-shm {min_shm}: not a size (use 1Gi, 16Gi, 512Mi, or bytes)"
        ))
    })?;
    let opts = PreflightOptions {
        expect_gpus: args.expect_gpus,
        min_shm_bytes,
        min_shm_explicit: args.min_shm.is_some(),
        require: args.require.iter().map(|r| Requirement::from(*r)).collect(),
    };
    if args.measure && g.facts.is_none() {
        toporun_agent::probe::link_bandwidth::start_driver();
    }
    let mut f = facts_and_cloud(g, &args.metadata)?;
    if args.measure {
        if g.facts.is_some() {
            return Err(CannotRun("--measure measures this machine's GPUs; --facts replays another's facts (a measurement recorded in them is checked without --measure)".into()).into());
        }
        watchdog(crate::measure_child::DEADLINE);
        f.bandwidth = Some(toporun_agent::probe::link_bandwidth::measure(&f.gpus));
    }
    let findings = preflight::run(&f, &opts);
    match args.format {
        PreflightFormat::Json => {
            let doc = documents::Preflight {
                bandwidth: f.bandwidth.as_ref(),
                findings: &findings,
                ok: worst(&findings) < Severity::Error,
            };
            println!("{}", serde_json::to_string_pretty(&doc)?)
        }
        PreflightFormat::Junit => print!("{}", output::junit(&findings)),
        PreflightFormat::Text => {
            print!("{}", output::findings_text(&findings, &Style::stdout()));
            let errors = findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .count();
            let warnings = findings
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .count();
            println!(
                "\n{}: {errors} error(s), {warnings} warning(s)",
                if errors == 0 { "fit" } else { "NOT FIT" }
            );
        }
    }
    Ok(match worst(&findings) {
        Severity::Error => ExitStatus::Failed,
        _ => ExitStatus::Success,
    })
}

/// A CUDA driver can hang in cuInit (a GPU fallen off the bus): say what is awaited
/// after 5 s, and give up (exit 2, "could not run") at the deadline.
fn watchdog(deadline: std::time::Duration) {
    std::thread::spawn(move || {
        let early = std::time::Duration::from_secs(5).min(deadline);
        std::thread::sleep(early);
        crate::console::say!(
            "toporun: --measure: still waiting for the CUDA driver and the copies after {} s",
            early.as_secs()
        );
        std::thread::sleep(deadline - early);
        crate::console::say!("toporun: error: --measure did not finish in {} s: the CUDA driver hangs (a GPU fallen off the bus? nvidia-smi -q, dmesg for Xid 79)", deadline.as_secs());
        // The main thread is stuck in the driver: only an exit from here ends it.
        // The host failed (its driver hangs), not the options: a failed check, as an
        // error finding is.
        #[allow(clippy::exit)]
        std::process::exit(i32::from(toporun_shared::root_cause::exit_codes::FAILURE));
    });
}

fn bench_rendezvous(
    nodes: u32,
    backend: BenchBackend,
    endpoint: Option<&str>,
    timeout: u64,
    format: ReportFormat,
    in_process: bool,
) -> Result<ExitStatus> {
    use toporun_agent::rendezvous::bench::Target;
    let timeout = std::time::Duration::from_secs(timeout);
    // One connection per simulated node.
    toporun_agent::supervise::open_files::raise();
    let mut _server = None;
    let target = match (backend, endpoint) {
        (BenchBackend::Etcd, None) => {
            return Err(CannotRun(
                "--backend etcd needs --endpoint (etcd's client endpoints)".into(),
            )
            .into())
        }
        (BenchBackend::Etcd, Some(list)) => Target::Etcd(
            toporun_agent::rendezvous::etcd_client::parse_endpoints(list, false)
                .map_err(|e| CannotRun(format!("--endpoint: {e}")))?,
        ),
        (BenchBackend::Store, Some(e)) => {
            let ep = toporun_shared::torchrun::endpoint::parse(e)
                .map_err(|m| CannotRun(format!("--endpoint {m}")))?;
            Target::Store(
                ep.host,
                ep.port.ok_or_else(|| {
                    CannotRun(format!("--endpoint {e}: give the port too (HOST:PORT)"))
                })?,
            )
        }
        (BenchBackend::Store, None) if in_process => Target::InProcess,
        (BenchBackend::Store, None) => {
            let (child, port) = spawn_store_server()?;
            _server = Some(child);
            Target::Store("127.0.0.1".into(), port)
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt
        .block_on(toporun_agent::rendezvous::bench::bench(
            nodes, target, timeout,
        ))
        .map_err(|e| anyhow::anyhow!("rendezvous bench failed: {e}"))?;
    if let Some(mut child) = _server {
        stop_store_server(&mut child);
    }
    match format {
        ReportFormat::Json => println!("{}", serde_json::to_string(&r)?),
        ReportFormat::Text => println!(
            "{} nodes joined in {:.3} s against {}: {} store operations, {:.0} ops/s",
            r.nodes, r.seconds, r.store, r.ops, r.ops_per_second
        ),
    }
    Ok(ExitStatus::Success)
}

/// The run directory of the job running here: `run_dir`, or the one job registered.
fn job_dir(run_dir: Option<&str>) -> Result<std::path::PathBuf> {
    use toporun_agent::job::stacks_socket::{index_dir, running};
    if let Some(d) = run_dir {
        return Ok(std::path::PathBuf::from(d));
    }
    match running().as_slice() {
        [] => Err(CannotRun(format!(
            "no toporun job runs here (none registered in {}): pass the job's run directory",
            index_dir().display()
        ))
        .into()),
        [(_, dir)] => Ok(dir.clone()),
        many => {
            let list: Vec<String> = many
                .iter()
                .map(|(pid, d)| format!("pid {pid}: {}", d.display()))
                .collect();
            Err(CannotRun(format!(
                "several toporun jobs run here; pass one run directory: {}",
                list.join("; ")
            ))
            .into())
        }
    }
}

/// Asks the job in `dir` over its socket.
fn ask_job(dir: &std::path::Path, request: Request) -> Result<String> {
    use toporun_agent::job::stacks_socket::{ask, SOCKET};
    Ok(ask(dir, request).map_err(|e| {
        CannotRun(format!(
            "cannot reach the job through {}: {e} (is it running, and is this its run directory?)",
            dir.join(SOCKET).display()
        ))
    })?)
}

/// `toporun stacks [RUN_DIR]`: asks the running launcher over its socket.
fn stacks(run_dir: Option<&str>, format: ReportFormat) -> Result<ExitStatus> {
    let json = format == ReportFormat::Json;
    print!("{}", ask_job(&job_dir(run_dir)?, Request::Stacks { json })?);
    Ok(ExitStatus::Success)
}

/// `toporun top [RUN_DIR]`: the table each second until the job ends (or once).
fn top(run_dir: Option<&str>, format: ReportFormat, once: bool) -> Result<ExitStatus> {
    let dir = job_dir(run_dir)?;
    let json = format == ReportFormat::Json;
    if once || json {
        print!("{}", ask_job(&dir, Request::Top { json })?);
        return Ok(ExitStatus::Success);
    }
    let clear = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut text = ask_job(&dir, Request::Top { json: false })?;
    let mut shown: Option<(String, std::time::Instant)> = None;
    loop {
        if clear {
            // Home and clear the screen, as top does.
            print!("\x1b[H\x1b[2J{text}");
        } else if log_due(shown.as_ref().map(|(t, at)| (t == &text, at.elapsed()))) {
            println!("{text}");
            shown = Some((text.clone(), std::time::Instant::now()));
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        let Ok(next) = ask_job(&dir, Request::Top { json: false }) else {
            println!("toporun: the job ended");
            return Ok(ExitStatus::Success);
        };
        text = next;
    }
}

/// Without a terminal (a log, a pipe), `top` prints a frame when it differs from the
/// last one printed, at most every `TOP_LOG_EVERY`: a log of a frame a second says
/// nothing more. `last`: whether the frame is the same as the last printed, and how
/// long ago that was; None before the first.
fn log_due(last: Option<(bool, std::time::Duration)>) -> bool {
    last.is_none_or(|(same, ago)| !same && ago >= TOP_LOG_EVERY)
}

const TOP_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts `toporun bench store-server` and reads the port it serves on.
fn spawn_store_server() -> Result<(std::process::Child, u16)> {
    use std::io::BufRead;
    let exe = std::env::current_exe()?;
    let mut child = std::process::Command::new(exe)
        .args(["bench", "store-server"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let port = line.trim().parse().map_err(|_| {
        anyhow::anyhow!("the bench's store process did not say its port ({line:?})")
    })?;
    Ok((child, port))
}

fn stop_store_server(child: &mut std::process::Child) {
    drop(child.stdin.take());
    let _ = child.wait();
}

fn bench_store_server() -> Result<ExitStatus> {
    toporun_agent::supervise::open_files::raise();
    let server =
        toporun_agent::store::StoreServer::bind_on(0, toporun_agent::store::Reach::Loopback)?;
    println!("{}", server.port());
    // Serves until the bench closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    Ok(ExitStatus::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn top_without_a_terminal_logs_a_changed_frame_at_most_every_ten_seconds() {
        assert!(log_due(None), "the first frame");
        assert!(
            !log_due(Some((true, Duration::from_secs(60)))),
            "the same frame"
        );
        assert!(
            !log_due(Some((false, Duration::from_secs(1)))),
            "changed, too soon"
        );
        assert!(log_due(Some((false, TOP_LOG_EVERY))));
    }
}

//! `probe`, `topo`, `preflight`.

use crate::facts_source::{self, CannotRun};
use crate::output::{self, Style};
use anyhow::Result;
use clap::ArgMatches;
use toporun_shared::finding::{worst, Severity};
use toporun_shared::preflight::{self, PreflightOptions, Requirement};
use toporun_shared::units::parse_size;

pub fn dispatch(m: &ArgMatches) -> u8 {
    if !matches!(m.subcommand_name(), Some("launch") | None) {
        crate::exit::quiet_on_closed_pipe();
    }
    let result = match m.subcommand() {
        Some(("probe", sub)) => probe(m, sub),
        Some(("topo", sub)) => topo(m, sub),
        Some(("preflight", sub)) => preflight(m, sub),
        Some(("launch", sub)) => {
            // Re-check the launch form's entrypoint as argparse would.
            let argv: Vec<String> = std::env::args().collect();
            let at = argv.iter().position(|a| a == "launch").unwrap_or(0);
            return match crate::cli::parse_launch(crate::cli::launch_command("launch"), &argv[at..])
            {
                Ok(_) => crate::launch::run(sub),
                Err(e) => crate::exit::usage(e),
            };
        }
        Some(("nccl-log", sub)) => crate::nccl_log_cmd::run(m, sub),
        Some(("bench", sub)) => match sub.subcommand() {
            Some(("rendezvous", b)) => bench_rendezvous(b),
            Some(("store-server", _)) => bench_store_server(),
            _ => Ok(2),
        },
        _ => Ok(2),
    };
    result.unwrap_or_else(|e| crate::exit::report(&e))
}

fn facts(m: &ArgMatches, sub: &ArgMatches) -> Result<toporun_shared::facts::HostFacts> {
    let pick = |id: &str| {
        sub.get_one::<String>(id)
            .or_else(|| m.get_one::<String>(id))
    };
    facts_source::load(pick("facts"), pick("nvidia_smi_topo"))
}

/// Live facts with the instance type from the cloud's metadata service, asked while
/// the host is probed (it costs nothing then, BUDGET at most off-cloud).
fn facts_and_cloud(m: &ArgMatches, sub: &ArgMatches) -> Result<toporun_shared::facts::HostFacts> {
    use toporun_agent::cloud_metadata::{self, Endpoints};
    let given = sub
        .get_one::<String>("facts")
        .or_else(|| m.get_one::<String>("facts"));
    let off = sub.get_flag("no_metadata")
        || std::env::var("TOPORUN_NO_METADATA")
            .is_ok_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
    let ask = (given.is_none() && !off).then(|| {
        std::thread::spawn(|| {
            cloud_metadata::instance(&Endpoints::from_env(|k| std::env::var(k).ok()))
        })
    });
    let mut f = facts(m, sub)?;
    if let Some(asked) = ask {
        f.cloud = asked.join().ok().flatten();
    }
    Ok(f)
}

fn format(sub: &ArgMatches) -> &str {
    sub.get_one::<String>("format")
        .map(String::as_str)
        .unwrap_or("text")
}

fn probe(m: &ArgMatches, sub: &ArgMatches) -> Result<u8> {
    let f = facts_and_cloud(m, sub)?;
    match format(sub) {
        "json" => println!("{}", f.to_json()),
        _ => print!(
            "{}{}",
            output::host_summary(&f),
            if f.gpus.count() > 0 {
                output::matrix_text(&f)
            } else {
                String::new()
            }
        ),
    }
    Ok(0)
}

fn topo(m: &ArgMatches, sub: &ArgMatches) -> Result<u8> {
    let f = facts(m, sub)?;
    if format(sub) == "json" {
        let p2p: Vec<serde_json::Value> = f
            .gpus
            .p2p
            .iter()
            .map(|p| serde_json::json!({"a": p.a, "b": p.b, "read": p.read, "write": p.write}))
            .collect();
        let doc = serde_json::json!({
            "gpus": f.gpus.devices.iter().map(|d| serde_json::json!({"index": d.index, "name": d.name, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "cpu_affinity": toporun_shared::cpulist::format(&d.cpu_affinity), "numa_node": d.numa_node})).collect::<Vec<_>>(),
            "matrix": f.gpus.links,
            "p2p": p2p,
            "nics": f.nics,
            "rdma": f.rdma,
            "source": f.gpus.source,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(0);
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
    Ok(0)
}

fn preflight(m: &ArgMatches, sub: &ArgMatches) -> Result<u8> {
    let min_shm = sub.get_one::<String>("min_shm").expect("has default");
    let min_shm_bytes = parse_size(min_shm).ok_or_else(|| {
        CannotRun(format!(
            "--min-shm {min_shm}: not a size (use 1Gi, 16Gi, 512Mi, or bytes)"
        ))
    })?;
    let require = sub
        .get_many::<String>("require")
        .into_iter()
        .flatten()
        .map(|r| match r.as_str() {
            "nvlink" => Requirement::Nvlink,
            "rdma" => Requirement::Rdma,
            _ => Requirement::Efa,
        })
        .collect();
    let opts = PreflightOptions {
        expect_gpus: sub.get_one::<u32>("expect_gpus").copied(),
        min_shm_bytes,
        min_shm_explicit: sub.value_source("min_shm")
            == Some(clap::parser::ValueSource::CommandLine),
        require,
    };
    let mut f = facts_and_cloud(m, sub)?;
    if sub.get_flag("measure") {
        if m.get_one::<String>("facts").is_some() || sub.get_one::<String>("facts").is_some() {
            return Err(CannotRun("--measure measures this machine's GPUs; --facts replays another's facts (a measurement recorded in them is checked without --measure)".into()).into());
        }
        watchdog(crate::measure_child::DEADLINE);
        f.bandwidth = Some(toporun_agent::link_bandwidth::measure(&f.gpus));
    }
    let findings = preflight::run(&f, &opts);
    match format(sub) {
        "json" => {
            let mut doc =
                serde_json::json!({"ok": worst(&findings) < Severity::Error, "findings": findings});
            if let Some(b) = &f.bandwidth {
                doc["bandwidth"] = serde_json::to_value(b)?;
            }
            println!("{}", serde_json::to_string_pretty(&doc)?)
        }
        "junit" => print!("{}", output::junit(&findings)),
        _ => {
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
    Ok(u8::from(worst(&findings) == Severity::Error))
}

/// A CUDA driver can hang in cuInit (a GPU fallen off the bus): say what is awaited
/// after 5 s, and give up (exit 2, "could not run") at the deadline.
fn watchdog(deadline: std::time::Duration) {
    std::thread::spawn(move || {
        let early = std::time::Duration::from_secs(5).min(deadline);
        std::thread::sleep(early);
        eprintln!(
            "toporun: --measure: still waiting for the CUDA driver and the copies after {} s",
            early.as_secs()
        );
        std::thread::sleep(deadline - early);
        eprintln!("toporun: error: --measure did not finish in {} s: the CUDA driver hangs (a GPU fallen off the bus? nvidia-smi -q, dmesg for Xid 79)", deadline.as_secs());
        // The main thread is stuck in the driver: only an exit from here ends it.
        #[allow(clippy::exit)]
        std::process::exit(2);
    });
}

fn bench_rendezvous(b: &ArgMatches) -> Result<u8> {
    use toporun_agent::rendezvous::bench::Target;
    let nodes = *b.get_one::<u32>("nodes").expect("required");
    let timeout =
        std::time::Duration::from_secs(*b.get_one::<u64>("timeout").expect("has default"));
    // One connection per simulated node.
    toporun_agent::supervise::open_files::raise();
    let endpoint = b.get_one::<String>("endpoint");
    let mut _server = None;
    let target = match (b.get_one::<String>("backend").map(String::as_str), endpoint) {
        (Some("etcd"), None) => {
            return Err(CannotRun(
                "--backend etcd needs --endpoint (etcd's client endpoints)".into(),
            )
            .into())
        }
        (Some("etcd"), Some(list)) => Target::Etcd(
            toporun_agent::rendezvous::etcd_client::parse_endpoints(list, false)
                .map_err(|e| CannotRun(format!("--endpoint: {e}")))?,
        ),
        (_, Some(e)) => {
            let ep = toporun_shared::torchrun::endpoint::parse(e)
                .map_err(|m| CannotRun(format!("--endpoint {m}")))?;
            Target::Store(
                ep.host,
                ep.port.ok_or_else(|| {
                    CannotRun(format!("--endpoint {e}: give the port too (HOST:PORT)"))
                })?,
            )
        }
        (_, None) => {
            if std::env::var_os("XX_INPROC").is_some() {
                Target::InProcess
            } else {
                let (child, port) = spawn_store_server()?;
                _server = Some(child);
                Target::Store("127.0.0.1".into(), port)
            }
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
    match format(b) {
        "json" => println!("{}", serde_json::to_string(&r)?),
        _ => println!(
            "{} nodes joined in {:.3} s against {}: {} store operations, {:.0} ops/s",
            r.nodes, r.seconds, r.store, r.ops, r.ops_per_second
        ),
    }
    Ok(0)
}

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

fn bench_store_server() -> Result<u8> {
    toporun_agent::supervise::open_files::raise();
    let server =
        toporun_agent::store::StoreServer::bind_on(0, toporun_agent::store::Reach::Loopback)?;
    println!("{}", server.port());
    // Serves until the bench closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    Ok(0)
}

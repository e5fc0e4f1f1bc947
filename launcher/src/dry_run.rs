//! `launch --dry-run`: the host, what is wrong, the NCCL plan with reasons, and every
//! local rank's complete environment and command line. Starts nothing.

use crate::documents;
use crate::output::{findings_text, host_summary, Style};
use crate::subcommands::DryRunFormat;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;
use toporun_agent::job::{gpu_timing_line, Job, NodePlace};
use toporun_agent::rendezvous::Place;
use toporun_shared::finding::Finding;
use toporun_shared::nccl_counters::PluginPlaces;
use toporun_shared::nccl_log::{capture, Capture};
use toporun_shared::network_check::CheckMode;
use toporun_shared::plan::Source;
use toporun_shared::rank_env::AttemptPlaces;
use toporun_shared::torchrun::RdzvBackend;

struct RankView {
    local_rank: u32,
    rank: Option<u32>,
    gpu: Option<(u32, String)>,
    cpus: Option<String>,
    env: BTreeMap<String, String>,
    argv: Vec<String>,
}

/// The node the launch would run, and whether its ranks are known before the
/// rendezvous: one node is node 0 of 1 whatever `--node-rank` says (as the launch
/// runs it); a static rendezvous knows this node's rank (every node assumed to run
/// as many ranks); another backend assigns it when the round closes.
fn dry_place(p: &Job) -> (NodePlace, bool) {
    let o = &p.opts;
    let (mut master, port) = o.store_address();
    if o.rdzv_backend == RdzvBackend::Etcd {
        master = "<node rank 0 of the round, port chosen there>".into();
    }
    let run_id = o.run_id("<random at start>");
    if o.nnodes_max == 1 {
        return (
            NodePlace::one_node(p.nproc, run_id, 0, (master, port)),
            true,
        );
    }
    let known = o.rdzv_backend == RdzvBackend::Static;
    let node_rank = if known { o.node_rank } else { 0 };
    let place = Place {
        round: 0,
        node_rank,
        offset: node_rank * p.nproc,
        world: o.nnodes_max * p.nproc,
        nnodes: o.nnodes_max,
        env: Default::default(),
    };
    (
        NodePlace::in_round(p.nproc, run_id, place, (master, port)),
        known,
    )
}

fn ranks(p: &Job) -> Result<(Vec<RankView>, &'static str)> {
    let (node, known) = dry_place(p);
    let run_dir = Path::new("<run dir>");
    let attempt_dir = run_dir.join("attempt_0");
    let report_env = match capture(p.watch.nccl_report, &p.nccl_seen_env(), &attempt_dir) {
        Capture::Files { env, .. } => env,
        Capture::Off(_) => BTreeMap::new(),
    };
    let timer_file = p.file_timer.serve.then(|| {
        p.file_timer.path.as_ref().map_or_else(
            || "<$TMPDIR/watchdog_timer_<random at start>>".to_string(),
            |f| f.display().to_string(),
        )
    });
    // The launch's own function, with the places it would use.
    let stop_file = p.stop.stop_file(run_dir);
    let counters = p.counters_place("<run dir>", 0, node.places.len());
    let places = AttemptPlaces {
        attempt_dir: &attempt_dir,
        stop_file: &stop_file,
        timer_file,
        cache_home: None,
        profiler: p
            .profiler_plugin()
            .zip(counters.as_ref().and_then(|c| c.dir()))
            .map(|(plugin, counters)| PluginPlaces { plugin, counters }),
    };
    let views = p
        .node_ranks(&node, (0, run_dir), &places, &report_env)?
        .into_iter()
        .map(|r| {
            let mut env = r.env;
            if p.opts.standalone {
                env.insert("MASTER_PORT".into(), "<free port at start>".into());
            }
            if !known {
                for k in ["RANK", "ROLE_RANK", "GROUP_RANK"] {
                    env.insert(k.into(), "<assigned at rendezvous>".into());
                }
            }
            let gpu = r.gpu.and_then(|i| p.facts.gpus.devices.get(i));
            RankView {
                local_rank: r.place.local_rank,
                rank: known.then_some(r.place.rank),
                gpu: gpu.map(|d| (d.index, d.uuid.clone())),
                cpus: r.cpus.map(|c| toporun_shared::cpulist::format(&c)),
                env,
                argv: r.argv,
            }
        })
        .collect();
    let how = if known {
        "static"
    } else {
        "assigned at rendezvous"
    };
    Ok((views, how))
}

/// The report's settings and what toporun expects NCCL to do.
fn nccl_lines(p: &Job) -> (String, toporun_shared::nccl_expect::Expected) {
    let report = match capture(
        p.watch.nccl_report,
        &p.nccl_seen_env(),
        Path::new("<run dir>/attempt_N"),
    ) {
        Capture::Off(why) => format!("off ({why})"),
        Capture::Files { env, dir, .. } if env.is_empty() => {
            format!("on, following your NCCL_DEBUG_FILE in {}", dir.display())
        }
        Capture::Files { env, .. } => format!(
            "on: {}",
            env.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    };
    // Without a GPU the ranks run gloo: the capture is armed, NCCL just never writes.
    let report = if p.cuda_gpus.is_empty() && report.starts_with("on") {
        format!("{report} (nothing to report unless a rank loads NCCL: no GPU visible)")
    } else {
        report
    };
    let mut env = p.plan.env();
    env.extend(p.inherited_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let gpus: Vec<usize> = (0..p.nproc).filter_map(|l| p.cuda_index(l)).collect();
    let expected = toporun_shared::nccl_expect::expect(&p.facts, &gpus, &env, p.opts.nnodes_max);
    (report, expected)
}

/// Output meant to be sourced or given to `docker --env-file` must not gain a line or
/// a command from a variable: names are shell identifiers, and `env` values (which
/// that format cannot quote) hold no line break or NUL. Refused, not rewritten.
fn check_sourceable(name: &str, value: Option<&str>, format: DryRunFormat) -> Result<()> {
    let format = format.name();
    if !toporun_shared::untrusted::valid_name(name) {
        anyhow::bail!(toporun_shared::torchrun::OptionsError::usage(format!(
            "--format {format}: the variable name {name:?} is not a shell identifier; unset it or use --format json"
        )));
    }
    if format == "env" && value.is_some_and(|v| v.contains(['\n', '\r', '\0'])) {
        anyhow::bail!(toporun_shared::torchrun::OptionsError::usage(format!(
            "--format env: the value of {name} holds a line break, which an env file cannot carry; fix the value or use --format shell or json"
        )));
    }
    Ok(())
}

/// One line of a comment: control characters (a line break could end the comment)
/// become spaces.
fn comment(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `entry`: the findings on the entrypoint (`launch.entrypoint`, `launch.python_torch`).
pub fn render(p: &Job, entry: &[Finding], format: DryRunFormat) -> Result<String> {
    let mut findings = entry.to_vec();
    findings.extend(p.findings());
    // Every format checks the ranks' settings (a CPU binding that cannot be met).
    let ranks = ranks(p)?;
    Ok(match format {
        DryRunFormat::Env => env_lines(p, format)?,
        DryRunFormat::Shell => shell_lines(p, format)?,
        DryRunFormat::Json => json_document(p, findings, ranks)?,
        DryRunFormat::Text => text(p, &findings, ranks),
    })
}

/// `--format env`: the node-wide NCCL variables, `NAME=value` a line; those of NCCL's
/// config files are left to NCCL, which reads them there (an env file would pin them).
fn env_lines(p: &Job, format: DryRunFormat) -> Result<String> {
    let vars = p.plan.variables.iter().filter(|v| v.set_in.is_none());
    vars.filter_map(|v| Some((&v.name, v.value.as_ref()?)))
        .map(|(k, v)| {
            check_sourceable(k, Some(v), format)?;
            Ok(format!("{k}={v}\n"))
        })
        .collect()
}

/// `--format shell`: the plan as `export` lines, each with its reason.
fn shell_lines(p: &Job, format: DryRunFormat) -> Result<String> {
    let mut out =
        String::from("# toporun launch --dry-run --format shell: the node-wide NCCL environment\n");
    for v in &p.plan.variables {
        // A config file's value goes into a comment: only its name must be sourceable.
        let value = v.value.as_deref().filter(|_| v.set_in.is_none());
        check_sourceable(&v.name, value, format)?;
        let reason = comment(&v.reason);
        let whose = if v.source == Source::User {
            "user"
        } else {
            "planned"
        };
        match &v.value {
            // NCCL reads it from the file: an export would pin it over the file.
            Some(val) if v.set_in.is_some() => out.push_str(&format!(
                "# {}={}  # {whose}: {reason}\n",
                v.name,
                comment(val)
            )),
            Some(val) => out.push_str(&format!(
                "export {}={}  # {whose}: {reason}\n",
                v.name,
                shlex::try_quote(val).map_err(|e| anyhow::anyhow!("{}: {e}", v.name))?
            )),
            None => out.push_str(&format!("# {} left to NCCL: {reason}\n", v.name)),
        }
    }
    Ok(out)
}

/// `--format json`: the whole dry run as one document.
fn json_document(
    p: &Job,
    findings: Vec<Finding>,
    (views, ranking): (Vec<RankView>, &str),
) -> Result<String> {
    let (nccl_report, nccl_expected) = nccl_lines(p);
    let f = &p.facts;
    let doc = documents::DryRun {
        findings,
        global_ranks: ranking,
        host: documents::DryRunHost {
            gpus: f.gpus.count(),
            hostname: &f.container.hostname,
            links: &f.gpus.links,
            product: f.platform.product_name.as_deref(),
        },
        nccl_expected,
        nccl_report,
        nnodes: format!("{}:{}", p.opts.nnodes_min, p.opts.nnodes_max),
        notes: &p.opts.notes,
        nproc_per_node: p.nproc,
        plan: &p.plan.variables,
        python: documents::Python {
            path: &p.python,
            why: &p.python_why,
        },
        ranks: views
            .iter()
            .map(|r| documents::DryRunRank {
                argv: &r.argv,
                cpus: r.cpus.as_deref(),
                env: &r.env,
                gpu: r.gpu.as_ref().map(|g| g.0),
                gpu_uuid: r.gpu.as_ref().map(|g| g.1.as_str()),
                local_rank: r.local_rank,
                rank: r.rank,
            })
            .collect(),
    };
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// The text a person reads: host, findings, plan, NCCL's expected transport, the GPU
/// timing, the ranks' Python, then each rank.
fn text(p: &Job, findings: &[Finding], ranks: (Vec<RankView>, &str)) -> String {
    let style = Style::stdout();
    let mut out = host_summary(&p.facts);
    out.push_str(&format!("\nfindings ({}):\n", findings.len()));
    out.push_str(&if findings.is_empty() {
        "  none at warning or error level\n".to_string()
    } else {
        findings_text(findings, &style)
    });
    out.push_str("\nNCCL plan:\n");
    for v in &p.plan.variables {
        // A control character (a CRLF file's \r) is shown, not obeyed by the terminal.
        let shown = |val: &str| -> String {
            val.chars()
                .map(|c| match c.is_control() {
                    true => c.escape_default().to_string(),
                    false => c.to_string(),
                })
                .collect()
        };
        let (val, tag) = match (&v.value, v.source) {
            (Some(val), Source::User) => (format!("{}={}", v.name, shown(val)), "user"),
            (Some(val), _) => (format!("{}={}", v.name, shown(val)), "planned"),
            (None, _) => (v.name.clone(), "left to NCCL"),
        };
        out.push_str(&format!("  {val:<40} [{tag}] {}\n", v.reason));
    }
    let (report, expected) = nccl_lines(p);
    out.push_str(&format!(
        "\nNCCL report: {report}\nNCCL expected: {}\n",
        expected.local
    ));
    if let Some(b) = &expected.between_nodes {
        out.push_str(&format!("  between nodes: {b}\n"));
    }
    out.push_str(&format!(
        "GPU timing: {}\n",
        gpu_timing_line(p, Path::new("<run dir>/attempt_N"))
    ));
    out.push_str(&format!("network check: {}\n", network_check_line(p)));
    if p.gpu_of(0).is_some() {
        out.push_str(&format!("{}\n", p.watch.nccl_profiler.line()));
    }
    if let Some(place) = p.counters_place("<run dir>", 0, ranks.0.len()) {
        let line = place.refusal().unwrap_or_else(|| {
            let dir = place.dir().map(|d| d.display().to_string()).unwrap_or_default();
            format!("in memory (tmpfs), one file a rank: {dir}/rank_<rank>; copied into <run dir>/attempt_N/nccl-counters at the attempt's end")
        });
        out.push_str(&format!("NCCL counters: {line}\n"));
    }
    if !p.opts.no_python {
        out.push_str(&format!("\npython: {} ({})\n", p.python, p.python_why));
    }
    out.push_str(&ranks_text(p, ranks));
    out
}

/// Each rank's command and whole environment.
fn ranks_text(p: &Job, (views, ranking): (Vec<RankView>, &str)) -> String {
    let mut out = format!(
        "\nranks: {} per node x {} node(s), global ranks {ranking}\n",
        p.nproc, p.opts.nnodes_max
    );
    for r in &views {
        out.push_str(&format!(
            "\nlocal rank {} (rank {}){}{}\n  command: {}\n",
            r.local_rank,
            r.rank
                .map_or("assigned at rendezvous".into(), |x| x.to_string()),
            r.gpu
                .as_ref()
                .map(|g| format!(", GPU{} {}", g.0, g.1))
                .unwrap_or_default(),
            r.cpus
                .as_ref()
                .map(|c| format!(", CPUs {c}"))
                .unwrap_or_default(),
            r.argv.join(" ")
        ));
        for (k, v) in &r.env {
            out.push_str(&format!("  {k}={v}\n"));
        }
    }
    out
}

/// What `--network-check` will do at each round's start.
fn network_check_line(p: &Job) -> String {
    let mode = p.rdzv.network_check;
    match (mode, p.opts.nnodes_max) {
        (_, 1) => "off (one node: no path between nodes)".into(),
        (CheckMode::Off, _) => "off (--network-check off)".into(),
        _ => format!(
            "{}: after each rendezvous round, before the ranks start, the nodes probe the paths between them {} and name a node well below the others{}",
            mode.as_str(),
            match p.torch_probe_backend() {
                Ok(b) => format!("through the ranks' torch ({}, one process per node started with {}; over TCP between the agents where a node cannot)", b.as_str(), p.python),
                Err(why) => format!("over TCP between the agents, two rounds of 0.5 s (not through torch: {why})"),
            },
            if mode == CheckMode::Gate { "; a slow node is refused (exit 82)" } else { "" }
        ),
    }
}

//! torchrun's options resolved (the table is `option_table`): command line >
//! PET_<DEST> environment > default.

use super::endpoint;
use super::rdzv_conf::RdzvConf;
use super::std_spec::StdSpec;
use std::collections::BTreeMap;
use std::time::Duration;

pub use super::option_table::{default_of, Opt, OptionDef, DEFAULT_SIGNALS, OPTIONS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NprocSpec {
    Count(u32),
    Gpu,
    Cpu,
    Auto,
}

impl NprocSpec {
    /// Ranks per node given the GPUs and CPUs this container has.
    pub fn resolve(self, gpus: usize, cpus: u32) -> Result<u32, OptionsError> {
        let n = match self {
            NprocSpec::Count(n) => n as usize,
            // torchrun: ValueError("Cuda is not available.").
            NprocSpec::Gpu if gpus == 0 => return Err(OptionsError::value("--nproc-per-node=gpu but no GPU is visible in this container (Cuda is not available; see `toporun preflight`)")),
            NprocSpec::Gpu => gpus,
            NprocSpec::Cpu => cpus.max(1) as usize,
            NprocSpec::Auto if gpus > 0 => gpus,
            NprocSpec::Auto => cpus.max(1) as usize,
        };
        if n > MAX_NPROC as usize {
            return Err(OptionsError::usage(format!(
                "--nproc-per-node: {n} ranks on one node; at most {MAX_NPROC}"
            )));
        }
        Ok(n as u32)
    }

    /// Ranks in the whole job: nodes x ranks per node, within what torch can count.
    pub fn world_size(nnodes: u32, nproc: u32) -> Result<u32, OptionsError> {
        let w = u64::from(nnodes) * u64::from(nproc);
        if w > MAX_WORLD {
            return Err(OptionsError::usage(format!(
                "--nnodes {nnodes} x --nproc-per-node {nproc} = {w} ranks: torch counts ranks in a 32-bit int (at most {MAX_WORLD})"
            )));
        }
        Ok(w as u32)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdzvBackend {
    Static,
    C10d,
    /// etcd's v3 API (torchrun's `etcd` and `etcd-v2` spellings): no node is special.
    Etcd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumaBinding {
    None,
    Node,
    Socket,
    Exclusive,
    /// Each rank on one L3 cache domain (core complex) of its GPU's CPUs.
    CoreComplex,
}

/// Everything the launch shape needs, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchOptions {
    pub nnodes_min: u32,
    pub nnodes_max: u32,
    pub nproc: NprocSpec,
    pub rdzv_backend: RdzvBackend,
    /// The endpoint as given (empty for static).
    pub rdzv_endpoint: String,
    pub rdzv_id: Option<String>,
    pub rdzv_conf: RdzvConf,
    pub standalone: bool,
    pub max_restarts: u32,
    pub role: String,
    pub module: bool,
    pub no_python: bool,
    pub log_dir: Option<String>,
    pub redirects: StdSpec,
    pub tee: StdSpec,
    pub local_ranks_filter: Option<Vec<u32>>,
    pub node_rank: u32,
    pub master_addr: String,
    pub master_port: u16,
    pub local_addr: Option<String>,
    pub signals_to_handle: Vec<String>,
    pub numa_binding: NumaBinding,
    pub shutdown_timeout: Duration,
    /// --log-line-prefix-template, else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE.
    pub log_line_prefix_template: Option<String>,
    /// --logs-specs: a torchrun.logs_specs entry point name that must exist.
    pub logs_specs: Option<String>,
    pub virtual_local_rank: bool,
    /// --duplicate-stdout-filters, --duplicate-stderr-filters.
    pub line_filters: LineFilters,
    pub entrypoint: String,
    pub args: Vec<String>,
    /// Words for options accepted but ignored.
    pub notes: Vec<String>,
}

use super::line_filters::{needles, LineFilters};
pub use super::values::{seconds, OptionsError, MAX_NODES, MAX_NPROC, MAX_SECS, MAX_WORLD};

/// c10d's default rendezvous port.
pub const C10D_PORT: u16 = 29400;

const SIGNALS: &[&str] = &[
    "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
];

/// What the command line and the environment gave, looked up as torchrun does:
/// the command line first, then `PET_<DEST>`.
struct Given<'a> {
    cli: &'a BTreeMap<Opt, String>,
    env: &'a BTreeMap<String, String>,
}

fn usage(m: String) -> OptionsError {
    OptionsError::usage(m)
}

/// What torchrun raises as ValueError/RuntimeError once it runs (exit 1).
fn value_err(m: String) -> OptionsError {
    OptionsError::value(m)
}

impl Given<'_> {
    fn pet(&self, o: Opt) -> Option<&String> {
        self.env.get(&o.pet())
    }

    fn value(&self, o: Opt) -> Option<String> {
        self.cli.get(&o).or_else(|| self.pet(o)).cloned()
    }

    /// The value given, else the option table's default (`value` tells unset apart).
    fn value_or_default(&self, o: Opt) -> String {
        self.value(o)
            .unwrap_or_else(|| default_of(o).unwrap_or_default().to_string())
    }

    /// torchrun reads boolean PET_* values with bool(int(value)).
    fn flag(&self, o: Opt) -> Result<bool, OptionsError> {
        if self.cli.contains_key(&o) {
            return Ok(true);
        }
        match self.pet(o) {
            None => Ok(false),
            Some(v) => v.trim().parse::<i64>().map(|n| n != 0).map_err(|_| value_err(format!("{}={v:?}: boolean options from the environment must be integers (1 or 0), as torchrun reads them with bool(int(value))", o.pet()))),
        }
    }

    /// An integer option, given or the table's default.
    fn num(&self, o: Opt) -> Result<u64, OptionsError> {
        let v = self.value_or_default(o);
        v.trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= u64::from(u32::MAX))
            .ok_or_else(|| {
                usage(format!(
                    "--{}: '{v}' is not an integer from 0 to {}",
                    o.dest().replace('_', "-"),
                    u32::MAX
                ))
            })
    }

    /// Notes for options toporun takes but treats differently.
    fn notes(&self) -> Vec<String> {
        OPTIONS
            .iter()
            .filter(|o| {
                o.note.is_some() && (self.cli.contains_key(&o.opt) || self.pet(o.opt).is_some())
            })
            .map(|o| format!("--{}: {}", o.longs[0], o.note.unwrap_or_default()))
            .collect()
    }
}

/// The rendezvous as resolved: backend, endpoint, run id, and whether it is
/// standalone (asked, or implied by one static node without --master-port).
struct Rdzv {
    backend: RdzvBackend,
    endpoint: String,
    id: Option<String>,
    standalone: bool,
}

/// Resolves options. `cli` holds what the command line set (option -> value;
/// flags "true"), `env` the process environment (PET_* and TORCH_ELASTIC_SHUTDOWN_TIMEOUT).
pub fn resolve(
    cli: &BTreeMap<Opt, String>,
    env: &BTreeMap<String, String>,
    entrypoint: &str,
    args: &[String],
) -> Result<LaunchOptions, OptionsError> {
    let g = Given { cli, env };
    let standalone_asked = g.flag(Opt::Standalone)?;
    let (nnodes_min, nnodes_max) = parse_nnodes(&g.value_or_default(Opt::Nnodes))?;
    if standalone_asked && nnodes_max > 1 {
        return Err(usage(format!(
            "--standalone runs a single node but --nnodes is {nnodes_min}:{nnodes_max}"
        )));
    }
    let nproc = parse_nproc(Some(&g.value_or_default(Opt::NprocPerNode)))?;
    let rdzv = rdzv(&g, standalone_asked, nnodes_max)?;
    let module = g.flag(Opt::Module)?;
    let no_python = g.flag(Opt::NoPython)?;
    if module && no_python {
        return Err(value_err(
            "--no-python and -m/--module cannot be used together".into(),
        ));
    }
    let master_port = g.num(Opt::MasterPort)?;
    let master_port = u16::try_from(master_port)
        .map_err(|_| usage(format!("--master-port {master_port} is not a port number")))?;
    let node_rank = g.num(Opt::NodeRank)? as u32; // num() checked the range
    if rdzv.backend == RdzvBackend::Static && node_rank >= nnodes_max {
        return Err(usage(format!(
            "--node-rank {node_rank} is not below --nnodes {nnodes_max}"
        )));
    }
    let std_spec = |o: Opt| {
        StdSpec::parse(&g.value_or_default(o)).map_err(|e| value_err(format!("--{} {e}", o.dest())))
    };
    let (redirects, tee) = (std_spec(Opt::Redirects)?, std_spec(Opt::Tee)?);
    if let Some(mi) = g.value(Opt::MonitorInterval) {
        seconds("--monitor-interval", &mi)?;
    }
    if entrypoint.is_empty() {
        return Err(usage(
            "missing the training script (or module, with -m, or program, with --no-python)".into(),
        ));
    }
    Ok(LaunchOptions {
        nnodes_min,
        nnodes_max,
        nproc,
        rdzv_conf: RdzvConf::parse(&g.value(Opt::RdzvConf).unwrap_or_default())?,
        rdzv_backend: rdzv.backend,
        rdzv_endpoint: rdzv.endpoint,
        rdzv_id: rdzv.id,
        standalone: rdzv.standalone,
        max_restarts: g.num(Opt::MaxRestarts)? as u32,
        role: g.value_or_default(Opt::Role),
        module,
        no_python,
        log_dir: g.value(Opt::LogDir),
        redirects,
        tee,
        local_ranks_filter: local_ranks_filter(g.value(Opt::LocalRanksFilter))?,
        node_rank,
        master_addr: g.value_or_default(Opt::MasterAddr),
        master_port,
        local_addr: g.value(Opt::LocalAddr),
        signals_to_handle: signals(g.value(Opt::SignalsToHandle))?,
        numa_binding: numa_binding(g.value(Opt::NumaBinding).as_deref())?,
        log_line_prefix_template: g
            .value(Opt::LogLinePrefixTemplate)
            .filter(|v| !v.is_empty())
            .or_else(|| env.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE").cloned()),
        logs_specs: cli.get(&Opt::LogsSpecs).cloned(),
        virtual_local_rank: g.flag(Opt::VirtualLocalRank)?,
        line_filters: LineFilters {
            stdout: g
                .value(Opt::DuplicateStdoutFilters)
                .map_or_else(Vec::new, |v| needles(&v)),
            stderr: g
                .value(Opt::DuplicateStderrFilters)
                .map_or_else(Vec::new, |v| needles(&v)),
        },
        shutdown_timeout: match g
            .value(Opt::ShutdownTimeout)
            .or_else(|| env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT").cloned())
        {
            None => seconds(
                "--shutdown-timeout",
                &g.value_or_default(Opt::ShutdownTimeout),
            )?,
            Some(s) => seconds("--shutdown-timeout", &s)?,
        },
        entrypoint: entrypoint.to_string(),
        args: args.to_vec(),
        notes: g.notes(),
    })
}

fn parse_nproc(v: Option<&str>) -> Result<NprocSpec, OptionsError> {
    Ok(match v.map(str::trim) {
        None => NprocSpec::Count(1),
        Some("gpu") => NprocSpec::Gpu,
        Some("cpu") => NprocSpec::Cpu,
        Some("auto") => NprocSpec::Auto,
        Some("xpu") => {
            return Err(usage(
                "--nproc-per-node=xpu: Intel XPUs are not supported by toporun; use a number"
                    .into(),
            ))
        }
        Some(n) => match n.parse::<u64>() {
            Ok(v) if v > 0 && v <= u64::from(MAX_NPROC) => NprocSpec::Count(v as u32),
            Ok(v) if v > 0 => {
                return Err(usage(format!(
                    "--nproc-per-node={v}: at most {MAX_NPROC} ranks per node"
                )))
            }
            _ => {
                return Err(value_err(format!(
                "Unsupported nproc_per_node value: {n} (use a positive number, gpu, cpu or auto)"
            )))
            }
        },
    })
}

fn rdzv(g: &Given, standalone_asked: bool, nnodes_max: u32) -> Result<Rdzv, OptionsError> {
    let backend = match g.value(Opt::RdzvBackend).as_deref().map(str::trim) {
        None | Some("static") => RdzvBackend::Static,
        Some("c10d") => RdzvBackend::C10d,
        Some("etcd" | "etcd-v2") => RdzvBackend::Etcd,
        Some(b) => {
            return Err(usage(format!(
                "--rdzv-backend={b}: unknown backend (static, c10d or etcd)"
            )))
        }
    };
    let endpoint = g.value(Opt::RdzvEndpoint).unwrap_or_default();
    // torch 2.15: one static node with no --master-port runs c10d on localhost:0 (a
    // free port, a fresh run id), as --standalone does.
    let standalone = standalone_asked
        || (backend == RdzvBackend::Static
            && endpoint.is_empty()
            && g.value(Opt::MasterPort).is_none()
            && nnodes_max == 1);
    if standalone {
        return Ok(Rdzv {
            backend: RdzvBackend::C10d,
            endpoint: "localhost:0".into(),
            id: None,
            standalone,
        });
    }
    check_endpoint(backend, &endpoint)?;
    Ok(Rdzv {
        backend,
        endpoint,
        id: g.value(Opt::RdzvId),
        standalone,
    })
}

/// The endpoint a backend needs: etcd's comma-separated client endpoints (with or
/// without a scheme), or one HOST[:PORT].
fn check_endpoint(backend: RdzvBackend, endpoint: &str) -> Result<(), OptionsError> {
    let bad = |e| usage(format!("--rdzv-endpoint {e}"));
    if backend == RdzvBackend::Etcd {
        for ep in endpoint.split(',').filter(|e| !e.trim().is_empty()) {
            let bare = ep
                .trim()
                .trim_start_matches("http://")
                .trim_start_matches("https://");
            endpoint::parse(bare.trim_end_matches('/')).map_err(bad)?;
        }
    } else if !endpoint.is_empty() {
        endpoint::parse(endpoint).map_err(bad)?;
    }
    if endpoint.is_empty() && backend != RdzvBackend::Static {
        let (name, what) = match backend {
            RdzvBackend::Etcd => ("etcd", " (etcd's client endpoints, comma-separated)"),
            _ => ("c10d", ""),
        };
        return Err(usage(format!(
            "--rdzv-backend={name} needs --rdzv-endpoint HOST[:PORT]{what}"
        )));
    }
    Ok(())
}

fn local_ranks_filter(v: Option<String>) -> Result<Option<Vec<u32>>, OptionsError> {
    let Some(v) = v.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    v.split(',')
        .map(|r| {
            r.trim().parse::<u32>().map_err(|_| {
                value_err(format!(
                    "--local-ranks-filter '{v}' must be comma-separated integers"
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn signals(v: Option<String>) -> Result<Vec<String>, OptionsError> {
    let signals: Vec<String> = v
        .unwrap_or_else(|| DEFAULT_SIGNALS.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if let Some(bad) = signals.iter().find(|s| !SIGNALS.contains(&s.as_str())) {
        return Err(usage(format!(
            "--signals-to-handle: {bad} is not one of {}",
            SIGNALS.join(", ")
        )));
    }
    Ok(signals)
}

fn numa_binding(v: Option<&str>) -> Result<NumaBinding, OptionsError> {
    Ok(match v.map(str::trim) {
        None | Some("none") => NumaBinding::None,
        Some("node") => NumaBinding::Node,
        Some("socket") => NumaBinding::Socket,
        Some("exclusive") => NumaBinding::Exclusive,
        Some("core-complex") => NumaBinding::CoreComplex,
        Some(o) => {
            return Err(usage(format!(
                "--numa-binding={o}: use node, socket, exclusive or core-complex"
            )))
        }
    })
}

fn parse_nnodes(v: &str) -> Result<(u32, u32), OptionsError> {
    let bad = || {
        OptionsError::value(format!(
            "--nnodes '{v}' must be N or MIN:MAX with 0 < MIN <= MAX <= {MAX_NODES}"
        ))
    };
    let (lo, hi) = match v.trim().split_once(':') {
        Some((a, b)) => (
            a.trim().parse::<u64>().map_err(|_| bad())?,
            b.trim().parse::<u64>().map_err(|_| bad())?,
        ),
        None => {
            let n: u64 = v.trim().parse().map_err(|_| bad())?;
            (n, n)
        }
    };
    if lo == 0 || lo > hi {
        return Err(bad());
    }
    if hi > u64::from(MAX_NODES) {
        return Err(OptionsError::usage(format!(
            "--nnodes '{v}': at most {MAX_NODES} nodes"
        )));
    }
    Ok((lo as u32, hi as u32))
}

impl LaunchOptions {
    /// Where the store lives, for every node and worker: static rendezvous uses the
    /// master address and port; c10d (and --standalone, resolved to localhost:0) the
    /// rendezvous endpoint, port 29400 by default.
    pub fn store_address(&self) -> (String, u16) {
        match self.rdzv_backend {
            RdzvBackend::Static => (self.master_addr.clone(), self.master_port),
            // resolve() validated the endpoint.
            // etcd: no store at the endpoint; each round's node rank 0 hosts one.
            RdzvBackend::Etcd => (String::new(), 0),
            RdzvBackend::C10d => match endpoint::parse(&self.rdzv_endpoint) {
                Ok(ep) => (ep.host, ep.port.unwrap_or(C10D_PORT)),
                Err(_) => (self.rdzv_endpoint.clone(), C10D_PORT),
            },
        }
    }

    /// The option a user changes when the store's port is taken.
    pub fn store_port_option(&self) -> &'static str {
        match self.rdzv_backend {
            RdzvBackend::Static => "--master-port",
            RdzvBackend::C10d | RdzvBackend::Etcd => "--rdzv-endpoint port",
        }
    }

    /// The job's run id as torchrun names it ("none" for static without --rdzv-id).
    pub fn run_id(&self, random: &str) -> String {
        match (&self.rdzv_id, self.standalone) {
            (_, true) => random.to_string(),
            (Some(id), _) => id.clone(),
            (None, _) => "none".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What a command line set, by dest.
    fn given(pairs: &[(&str, &str)]) -> BTreeMap<Opt, String> {
        pairs
            .iter()
            .map(|(k, v)| (Opt::from_dest(k).expect("an option's dest"), v.to_string()))
            .collect()
    }

    #[test]
    fn every_option_name_has_one_row_and_its_dest_round_trips() {
        let rows: Vec<Opt> = OPTIONS.iter().map(|o| o.opt).collect();
        assert_eq!(rows, Opt::ALL, "one row per option, in the enum's order");
        for o in Opt::ALL {
            assert_eq!(Opt::from_dest(o.dest()), Some(*o));
            assert!(o.pet().starts_with("PET_") && !o.pet().contains('-'));
        }
        assert_eq!(Opt::NprocPerNode.pet(), "PET_NPROC_PER_NODE");
        assert_eq!(Opt::from_dest("nproc-per-node"), None);
    }

    #[test]
    fn command_line_beats_pet_beats_default() {
        let env = map(&[
            ("PET_NPROC_PER_NODE", "4"),
            ("PET_NNODES", "2"),
            ("PET_NODE_RANK", "1"),
        ]);
        let o = resolve(&given(&[("nproc_per_node", "2")]), &env, "train.py", &[]).unwrap();
        assert_eq!(o.nproc, NprocSpec::Count(2));
        assert_eq!((o.nnodes_min, o.nnodes_max, o.node_rank), (2, 2, 1));
        assert_eq!(o.master_port, 29500);
        assert_eq!(o.role, "default");
    }

    #[test]
    fn pet_booleans_are_ints() {
        let o = resolve(&given(&[]), &map(&[("PET_STANDALONE", "1")]), "t.py", &[]).unwrap();
        assert!(o.standalone);
        assert_eq!(o.rdzv_backend, RdzvBackend::C10d);
        let static_env = map(&[("PET_STANDALONE", "0"), ("PET_MASTER_PORT", "29500")]);
        assert!(
            !resolve(&given(&[]), &static_env, "t.py", &[])
                .unwrap()
                .standalone
        );
        assert!(resolve(
            &given(&[]),
            &map(&[("PET_STANDALONE", "true")]),
            "t.py",
            &[]
        )
        .unwrap_err()
        .message
        .contains("bool(int"));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let e = |cli: &[(&str, &str)]| {
            resolve(&given(cli), &map(&[]), "t.py", &[])
                .unwrap_err()
                .message
        };
        assert!(e(&[("nproc_per_node", "many")]).contains("Unsupported nproc_per_node"));
        assert!(e(&[("nnodes", "3:2")]).contains("MIN <= MAX"));
        assert!(e(&[("module", "true"), ("no_python", "true")]).contains("cannot be used together"));
        assert!(e(&[("rdzv_backend", "c10d")]).contains("--rdzv-endpoint"));
        assert!(e(&[("nnodes", "2"), ("node_rank", "2")]).contains("not below"));
        assert!(e(&[("signals_to_handle", "SIGFOO")]).contains("SIGFOO"));
    }

    #[test]
    fn nproc_keywords_resolve_from_the_host() {
        assert_eq!(NprocSpec::Gpu.resolve(4, 64), Ok(4));
        assert!(NprocSpec::Gpu.resolve(0, 64).is_err());
        assert_eq!(NprocSpec::Auto.resolve(0, 2), Ok(2));
        assert_eq!(NprocSpec::Cpu.resolve(8, 16), Ok(16));
    }

    #[test]
    fn shutdown_timeout_from_torch_env() {
        let o = resolve(
            &given(&[("master_port", "29500")]),
            &map(&[("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5")]),
            "t.py",
            &[],
        )
        .unwrap();
        assert_eq!(o.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(o.run_id("x"), "none");
    }

    #[test]
    fn one_node_without_master_port_takes_a_free_port_like_torch_2_15() {
        let o = resolve(&given(&[]), &map(&[]), "t.py", &[]).unwrap();
        assert!(o.standalone);
        assert_eq!(o.rdzv_backend, RdzvBackend::C10d);
        assert_eq!(o.run_id("uuid"), "uuid");
        // A port, an endpoint or several nodes keep the static rendezvous.
        for cli in [
            &[("master_port", "29500")][..],
            &[("nnodes", "2")],
            &[("rdzv_endpoint", "h:1")],
        ] {
            assert!(
                !resolve(&given(cli), &map(&[]), "t.py", &[])
                    .unwrap()
                    .standalone,
                "{cli:?}"
            );
        }
    }

    #[test]
    fn store_address_per_backend() {
        let e = map(&[]);
        let st = resolve(
            &given(&[("master_addr", "n0"), ("master_port", "1234")]),
            &e,
            "t.py",
            &[],
        )
        .unwrap();
        assert_eq!(st.store_address(), ("n0".into(), 1234));
        let c = resolve(
            &given(&[("rdzv_backend", "c10d"), ("rdzv_endpoint", "[::1]")]),
            &e,
            "t.py",
            &[],
        )
        .unwrap();
        assert_eq!(c.store_address(), ("::1".into(), C10D_PORT));
        let sa = resolve(&given(&[("standalone", "true")]), &e, "t.py", &[]).unwrap();
        assert_eq!(sa.store_address(), ("localhost".into(), 0));
    }

    #[test]
    fn python_only_options_get_a_note() {
        let o = resolve(&given(&[("start_method", "fork")]), &map(&[]), "t.py", &[]).unwrap();
        assert!(o.notes[0].contains("--start-method"));
    }

    /// An unset option means what the option table says (and the help shows).
    #[test]
    fn unset_options_take_the_tables_defaults() {
        let o = resolve(&given(&[]), &BTreeMap::new(), "t.py", &[]).unwrap();
        let num = |x: Opt| default_of(x).unwrap().parse::<u32>().unwrap();
        assert_eq!(u32::from(o.master_port), num(Opt::MasterPort));
        assert_eq!(
            (o.node_rank, o.max_restarts),
            (num(Opt::NodeRank), num(Opt::MaxRestarts))
        );
        assert_eq!((o.nnodes_min, o.nnodes_max), (1, num(Opt::Nnodes)));
        assert_eq!(o.nproc, NprocSpec::Count(num(Opt::NprocPerNode)));
        assert_eq!(o.role, default_of(Opt::Role).unwrap());
        assert_eq!(o.master_addr, default_of(Opt::MasterAddr).unwrap());
        assert_eq!(
            o.signals_to_handle.join(","),
            default_of(Opt::SignalsToHandle).unwrap()
        );
        let secs = u64::from(num(Opt::ShutdownTimeout));
        assert_eq!(o.shutdown_timeout, Duration::from_secs(secs));
    }
}

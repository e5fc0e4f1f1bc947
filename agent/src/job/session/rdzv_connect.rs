//! Reaching the rendezvous state: the store (static, c10d) or etcd, saying every 5 s
//! what it still tries and giving up at the join timeout with what to check.

use crate::job::error::{JobError, WithAdvice};
use crate::job::spec::Job;
use crate::rendezvous::etcd_client::{self, Etcd, EtcdError};
use crate::rendezvous::{Config, Shape};
use crate::store::StoreClient;
use crate::supervise::{Event, Events};
use std::time::{Duration, Instant};
use toporun_shared::torchrun::endpoint;
use toporun_shared::torchrun::EtcdProtocol;

type Result<T> = std::result::Result<T, JobError>;

/// Resolves when a handled signal arrives.
pub async fn until_signal(events: &mut Events) {
    while !matches!(events.next().await, Event::Signal(_)) {}
}

/// Connects to the rendezvous store. None when a handled signal arrived.
pub async fn connect_store(
    store_host: &str,
    port: u16,
    is_host: bool,
    cfg: &Config,
    events: &mut Events,
) -> Result<Option<StoreClient>> {
    let (run_id, target) = (&cfg.run_id, endpoint::join(store_host, port));
    let kind = match cfg.shape {
        Shape::Static { .. } => "static",
        Shape::Elastic { .. } => "c10d",
    };
    let verb = if is_host { "hosting" } else { "joining" };
    crate::console::say!("toporun: rendezvous {run_id} ({kind}): {verb} the store at {target}");
    let connecting = StoreClient::connect(store_host, port, cfg.join_timeout);
    tokio::pin!(connecting);
    let started = Instant::now();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(5),
        Duration::from_secs(5),
    );
    let mut client = loop {
        tokio::select! {
            c = &mut connecting => break c.map_err(|e| JobError::failed(format!(
                "could not reach the rendezvous store at {target} within {:.0?}: check that {store_host} resolves from this pod (DNS), that the node hosting it is running (pod scheduled?) and that port {port} is open between nodes",
                cfg.join_timeout), e))?,
            _ = tick.tick() => crate::console::say!("toporun: rendezvous {run_id}: still connecting to the store at {target} ({:.0}s of {:.0}s): is the node hosting it up?", started.elapsed().as_secs_f64(), cfg.join_timeout.as_secs_f64()),
            _ = until_signal(events) => return Ok(None),
        }
    };
    client.set_deadline(cfg.read_timeout);
    Ok(Some(client))
}

/// The etcd client the options describe (endpoints, protocol, TLS).
fn etcd_client(p: &Job) -> Result<Etcd> {
    let conf = &p.opts.rdzv_conf;
    let https = conf.protocol == EtcdProtocol::Https;
    let endpoints = etcd_client::parse_endpoints(&p.opts.rdzv_endpoint, https)
        .map_err(|e| JobError::bad_input("--rdzv-endpoint", e))?;
    let tls = etcd_client::Tls {
        cacert: conf.cacert.clone(),
        cert: conf.cert.clone(),
        key: conf.key.clone(),
    };
    Etcd::new(endpoints, &tls, Duration::from_secs(5))
        .map_err(|e| JobError::bad_input("--rdzv-endpoint and --rdzv-conf", e))
}

/// Reaches the etcd cluster (any member). None when a handled signal arrived.
pub async fn connect_etcd(p: &Job, cfg: &Config, events: &mut Events) -> Result<Option<Etcd>> {
    let mut client = etcd_client(p)?;
    let run_id = &cfg.run_id;
    let at = client.endpoints();
    crate::console::say!("toporun: rendezvous {run_id} (etcd): joining through etcd at {at}");
    let started = Instant::now();
    loop {
        tokio::select! {
            r = client.ping() => match r {
                Ok(()) => break,
                Err(e @ EtcdError::Unreachable { .. }) => {
                    if started.elapsed() >= cfg.join_timeout {
                        let advice = "Check that the endpoints resolve from this pod, that etcd runs there and serves its v3 API on the client port (etcd 3.4 or later), and that the port is open".to_string();
                        let doing = format!("could not reach etcd within {:.0?} at {at}", cfg.join_timeout);
                        return Err(JobError::failed(doing, WithAdvice { error: e, advice }));
                    }
                    crate::console::say!("toporun: rendezvous {run_id}: still trying etcd at {at} ({:.0}s of {:.0}s): {e}", started.elapsed().as_secs_f64(), cfg.join_timeout.as_secs_f64());
                }
                Err(e) => return Err(JobError::failed("reaching etcd", e)),
            },
            _ = until_signal(events) => return Ok(None),
        }
    }
    client.set_deadline(cfg.read_timeout);
    Ok(Some(client))
}

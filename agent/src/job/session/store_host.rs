//! Which node hosts the store, and taking its port: a static job's node rank 0, a
//! c10d node whose endpoint names this machine (or `is_host`). A port that cannot be
//! taken is said with who holds it.

use crate::job::error::JobError;
use crate::job::spec::Job;
use crate::paths::Root;
use crate::probe::port_owner;
use crate::store::{Reach, StoreServer};
use std::net::{IpAddr, ToSocketAddrs};

/// `localhost` or a loopback address.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .trim_matches(['[', ']'])
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether the c10d endpoint names this node: loopback, its hostname, its
/// --local-addr, or a name resolving to one of its addresses. The lookup blocks (DNS),
/// so it runs on a blocking thread, not the runtime that handles signals.
pub async fn endpoint_is_here(p: &Job, host: &str) -> bool {
    let c = &p.facts.container;
    if is_loopback(host) || host == c.hostname || p.opts.local_addr.as_deref() == Some(host) {
        return true;
    }
    let local: Vec<IpAddr> = p
        .facts
        .nics
        .iter()
        .flat_map(|n| n.addresses.iter().filter_map(|a| a.addr.parse().ok()))
        .collect();
    let host = host.to_string();
    tokio::task::spawn_blocking(move || {
        (host.as_str(), 0u16)
            .to_socket_addrs()
            .map(|mut it| it.any(|a| a.ip().is_loopback() || local.contains(&a.ip())))
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// Who holds `port`, for a message ("pid 12 (python3)"), where /proc tells.
pub fn port_holders(root: &Root, port: u16) -> Option<String> {
    let owners = port_owner::holders(root, port);
    (!owners.is_empty()).then(|| {
        owners
            .iter()
            .map(|o| format!("pid {} ({}, {})", o.pid, o.comm, o.state))
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// Binds the store's port, or says why not and what to do.
pub fn bind(p: &Job, port: u16, reach: Reach) -> Result<StoreServer, JobError> {
    StoreServer::bind_on(port, reach).map_err(|source| JobError::Bind {
        port,
        option: p.opts.store_port_option(),
        holder: (source.kind() == std::io::ErrorKind::AddrInUse)
            .then(|| port_holders(&p.root, port))
            .flatten(),
        source,
    })
}

/// A c10d node whose endpoint names this machine binds the port; when it is taken
/// (several nodes on one machine: the first hosts, as torchrun does) it joins instead
/// and says who holds the port, so a store that never comes explains itself.
pub fn bind_c10d(p: &Job, port: u16, target: &str) -> Result<Option<StoreServer>, JobError> {
    match StoreServer::bind(port) {
        Ok(s) => Ok(Some(s)),
        Err(e)
            if e.kind() == std::io::ErrorKind::AddrInUse && p.opts.rdzv_conf.is_host.is_none() =>
        {
            let who = port_holders(&p.root, port).unwrap_or_else(|| "a process this one cannot see (another user, or another network namespace sharing the address)".into());
            crate::console::say!("toporun: the rendezvous endpoint {target} names this machine, but port {port} is taken ({e}) by {who}: joining the store there instead of hosting it. If that is not another toporun or torchrun node of this job, stop it or choose another port");
            Ok(None)
        }
        Err(_) => bind(p, port, Reach::All).map(Some),
    }
}

//! The check among the nodes of a round, over the rendezvous state: each node
//! publishes its probe listener, the nodes run the schedule's probe rounds together
//! (one send and one receive each, a barrier between rounds so that rounds do not
//! share the links), each writes what it received, and node rank 0 judges and
//! writes the report every node reads.

use super::check_round::{counted, read_present, Waits, GATHER_WAIT};
pub use super::check_round::{CheckError, CheckNode, GateRule};
use super::probe::{receive, send, Probe, CONNECT_WAIT, WINDOW, WINDOWS};
use super::torch_path::TorchSide;
use super::torch_round::{agree, through_torch, vote, TORCH_GATHER};
use crate::rendezvous::{alive_spares, Backend, Key, Kv, RoundKeys};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use toporun_shared::facts::Nic;
use toporun_shared::network_check::report::{NetworkReport, NodeRecord};
use toporun_shared::network_check::schedule::{rounds, Path};
use toporun_shared::network_check::verdict::PathFigure;
use toporun_shared::network_check::{DataPath, Listener, PathVote};

/// What the rest of the check waits for the others once one did not come.
const LATE_WAIT: Duration = Duration::from_secs(1);
/// How long a peer's host name may take to resolve.
const RESOLVE_WAIT: Duration = Duration::from_secs(2);
/// Interface addresses of a peer tried, at most.
const MAX_IPS: usize = 8;

/// Runs the check of one round on this node (through torch where every node's
/// probe is ready, else TCP between the agents); the deciding node's report.
pub async fn run(
    kv: &mut Kv,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    torch: Result<TorchSide<'_>, String>,
) -> Result<NetworkReport, CheckError> {
    let started = Instant::now();
    let listener = crate::store::listen_all(0).map_err(CheckError::Listen)?;
    let port = listener.local_addr().map_err(CheckError::Listen)?.port();
    let mine = Listener {
        addr: me.addr.to_string(),
        port,
        ips: me.ips.to_vec(),
        nonce: nonce(),
    };
    let key = keys.probe_listener(me.node_rank);
    kv.set(key.name(), &key.encode(&mine)).await?;
    let (vote, torch) = vote(torch, started).await;
    let path = match agree(kv, keys, me, (vote, started)).await {
        Ok(path) => path,
        Err(e) => {
            if let Some((probe, ..)) = torch {
                probe.end().await;
            }
            return Err(e);
        }
    };
    let mut ending = None;
    let (measured, local, wait) = match (path, torch) {
        (PathVote::Torch { backend }, Some(ready)) => {
            let (measured, probe) = through_torch(ready, keys, me, backend).await;
            ending = Some(probe);
            (measured, None, TORCH_GATHER)
        }
        (path, torch) => {
            if let (PathVote::Tcp { why }, Some((probe, ..))) = (&path, torch) {
                crate::console::say!("toporun: the network check measures over TCP between the agents, not through torch: {why}");
                probe.end().await;
            }
            let (received, local, patience) = over_tcp(kv, keys, me, (&listener, &mine)).await?;
            let wait = Waits {
                gather: patience.min(GATHER_WAIT),
                report: GATHER_WAIT * 2,
                seen: patience.min(GATHER_WAIT / 2),
            };
            ((received, DataPath::Tcp), local, wait)
        }
    };
    let record = record_of(me, local, measured);
    let judged = share(kv, keys, me, record, (started, &wait)).await;
    // It exits meanwhile; gone before the ranks start, whatever the sharing did.
    if let Some(probe) = ending {
        probe.end().await;
    }
    judged
}

/// This node's record written; the report judged (node rank 0) or read; every node
/// counted as having read it.
async fn share(
    kv: &mut Kv,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    record: NodeRecord,
    (started, wait): (Instant, &Waits),
) -> Result<NetworkReport, CheckError> {
    let key = keys.network_record(me.node_rank);
    kv.set(key.name(), &key.encode(&record)).await?;
    kv.tally(&keys.network_records()).await?;
    let judged = match me.node_rank {
        0 => judge(kv, keys, me, (started, wait.gather)).await?,
        _ => {
            let report = keys.network_report();
            let patience = wait.report.saturating_add(me.spare_window());
            let raw = kv.get(report.name(), patience).await?;
            report.decode(&raw)?
        }
    };
    read_by_all(kv, keys, me, wait.seen).await;
    Ok(judged)
}

/// The schedule's probe rounds over TCP, a barrier between them: what this node
/// received, and the local address its sender reached.
async fn over_tcp(
    kv: &mut Kv,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    (listener, mine): (&TcpListener, &Listener),
) -> Result<(Vec<PathFigure>, Option<SocketAddr>, Duration), CheckError> {
    let schedule = rounds(me.nnodes);
    let mut patience = CONNECT_WAIT + WINDOW * WINDOWS + GATHER_WAIT / 2;
    let targets = targets(kv, keys, &schedule, me.node_rank).await?;
    let mut received = Vec::new();
    let mut local = None;
    for (k, round) in schedule.iter().enumerate() {
        let at_k = (k as u32, mine.nonce);
        let (f, at) = probe_round(listener, &targets, at_k, round, me.node_rank).await;
        received.extend(f);
        local = local.or(at);
        // Once a node did not come, the rest waits briefly: one gone during the
        // check does not come back (else each barrier waits in full).
        let done = keys.probe_round_done(k);
        kv.tally(&done).await?;
        if !counted(kv, &done, me.nnodes, patience).await? {
            patience = LATE_WAIT;
        }
    }
    Ok((received, local, patience))
}

/// Where this node was reached: the address a TCP probe reached, else its
/// rendezvous address where that is an IP, else its first interface address (an IP
/// says more than a host name).
fn address_of(me: &CheckNode<'_>, local: Option<SocketAddr>) -> String {
    if let Some(a) = local {
        return a.ip().to_canonical().to_string();
    }
    let ip = |s: &str| s.parse::<IpAddr>().ok().filter(|i| !i.is_loopback());
    match ip(me.addr) {
        Some(a) => a.to_string(),
        None => me
            .ips
            .iter()
            .find(|s| ip(s).is_some())
            .cloned()
            .unwrap_or_else(|| me.addr.to_string()),
    }
}

/// This node's record of what it received.
fn record_of(
    me: &CheckNode<'_>,
    local: Option<SocketAddr>,
    (received, via): (Vec<PathFigure>, DataPath),
) -> NodeRecord {
    let ip = address_of(me, local).parse().ok();
    let (interface, mut expected_gbit) = interface_of(ip, me.nics);
    // Over NCCL's IB or a plugin the TCP interface's rate says nothing.
    if via.rdma() {
        expected_gbit = None;
    }
    NodeRecord {
        node: me.node_rank,
        host: me.host.to_string(),
        addr: address_of(me, local),
        interface,
        expected_gbit,
        received,
        hosts_rendezvous: me.hosts_rendezvous,
        rdma: me.rdma,
        via,
    }
}

/// Every node counts itself as having read the report; the node hosting the store
/// (which the gate may stop) waits, a while, until all have, so that none finds the
/// store gone. Failures here change nothing: this node has its report.
async fn read_by_all(kv: &mut Kv, keys: &RoundKeys, me: &CheckNode<'_>, wait: Duration) {
    let seen = keys.network_seen();
    if kv.tally(&seen).await.is_ok() && me.hosts_rendezvous {
        let _ = counted(kv, &seen, me.nnodes, wait).await;
    }
}

/// Node rank 0: every record that comes, judged, and the report written.
async fn judge(
    kv: &mut Kv,
    keys: &RoundKeys,
    me: &CheckNode<'_>,
    (started, wait): (Instant, Duration),
) -> Result<NetworkReport, CheckError> {
    let report = keys.network_report();
    let records = gather(kv, keys, me.nnodes, wait).await?;
    let took = started.elapsed().as_millis() as u64;
    let mut judged = NetworkReport::judge(me.round, me.nnodes, &records, took);
    judged.spares = spares(kv, keys, me, &judged).await;
    kv.set(report.name(), &report.encode(&judged)).await?;
    Ok(judged)
}

/// The spares of this round, which wait to join the next. The gate counts them to go
/// on without a slow node: where they change its decision, only the living ones, so
/// that nobody waits for a dead one.
async fn spares(kv: &mut Kv, keys: &RoundKeys, me: &CheckNode<'_>, judged: &NetworkReport) -> u32 {
    let waiting = keys.waiting();
    let counted = kv.tally_count(&waiting).await.unwrap_or(0);
    let counted = u32::try_from(counted).unwrap_or(u32::MAX);
    let Some(rule) = me.gate.filter(|_| counted > 0) else {
        return counted;
    };
    let min = rule.elastic_min;
    if judged.gate_with(counted, min) == judged.gate_with(0, min) {
        return counted;
    }
    let alive = alive_spares(kv, &waiting, me.spare_window()).await;
    alive.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The addresses of the nodes this node sends to (at most one a probe round), each
/// resolved without blocking: only those listeners are read, not every node's.
async fn targets(
    kv: &mut Kv,
    keys: &RoundKeys,
    schedule: &[Vec<Path>],
    me: u32,
) -> Result<BTreeMap<u32, Target>, CheckError> {
    let to: BTreeSet<u32> = schedule
        .iter()
        .flatten()
        .filter(|p| p.from == me)
        .map(|p| p.to)
        .collect();
    let mut out = BTreeMap::new();
    for node in to {
        let key = keys.probe_listener(node);
        let raw = kv.get(key.name(), GATHER_WAIT).await?;
        if let Ok(l) = key.decode(&raw) {
            out.insert(node, (addresses(&l).await, l.nonce));
        }
    }
    Ok(out)
}

/// A peer's addresses to try, and the nonce its receiver wants.
type Target = (Vec<SocketAddr>, u64);

/// This node's nonce, from the kernel's random source.
fn nonce() -> u64 {
    let id = crate::paths::random_id().replace('-', "");
    u64::from_str_radix(id.get(..16).unwrap_or(&id), 16)
        .unwrap_or_else(|_| u64::from(std::process::id()))
}

/// Where a listener may be reached, in the order to try: its address where it is
/// an IP, its interfaces' addresses, then its host name resolved (at most 2 s);
/// loopback only where nothing else names it.
async fn addresses(l: &Listener) -> Vec<SocketAddr> {
    let ip = |s: &str| s.parse::<IpAddr>().ok().filter(|i| !i.is_loopback());
    let mut out: Vec<IpAddr> = Vec::new();
    let literal = ip(&l.addr);
    let named = literal.is_none() && toporun_shared::untrusted::valid_host(&l.addr);
    out.extend(literal);
    out.extend(l.ips.iter().take(MAX_IPS).filter_map(|s| ip(s)));
    if named {
        let looked = tokio::time::timeout(
            RESOLVE_WAIT,
            tokio::net::lookup_host((l.addr.as_str(), l.port)),
        )
        .await;
        if let Ok(Ok(found)) = looked {
            out.extend(found.map(|a| a.ip()).filter(|i| !i.is_loopback()));
        }
    }
    // Only loopback named it: every node is on this machine (a test, or nodes of
    // one host), or none answers there (another machine's nonce is not said).
    if out.is_empty() {
        out.extend(l.addr.parse::<IpAddr>().ok());
    }
    let mut seen = BTreeSet::new();
    out.retain(|a| seen.insert(*a));
    out.into_iter()
        .map(|ip| SocketAddr::new(ip, l.port))
        .collect()
}

/// This node's send and receive of probe round `k`, at once: what it received, and
/// the local address its sender reached.
async fn probe_round(
    listener: &TcpListener,
    targets: &BTreeMap<u32, Target>,
    (k, mine): (u32, u64),
    round: &[Path],
    me: u32,
) -> (Option<PathFigure>, Option<SocketAddr>) {
    let out = round.iter().find(|p| p.from == me).copied();
    let inn = round.iter().find(|p| p.to == me).copied();
    let sending = async {
        if let Some(path) = out {
            if let Some((to, nonce)) = targets.get(&path.to).filter(|t| !t.0.is_empty()) {
                send(
                    to,
                    Probe {
                        k,
                        path,
                        nonce: *nonce,
                    },
                )
                .await;
            }
        }
    };
    let receiving = async {
        match inn {
            Some(path) => {
                let (f, at) = receive(
                    listener,
                    Probe {
                        k,
                        path,
                        nonce: mine,
                    },
                )
                .await;
                (Some(f), at)
            }
            None => (None, None),
        }
    };
    let ((), got) = tokio::join!(sending, receiving);
    got
}

/// Every node's record that comes within `wait` (counted, then read at once).
async fn gather(
    kv: &mut Kv,
    keys: &RoundKeys,
    nnodes: u32,
    wait: Duration,
) -> Result<Vec<NodeRecord>, CheckError> {
    counted(kv, &keys.network_records(), nnodes, wait).await?;
    let all: Vec<Key<NodeRecord>> = (0..nnodes).map(|n| keys.network_record(n)).collect();
    let records = read_present(kv, &all).await?;
    // A record speaks for the node whose key it is under, no other.
    Ok(all
        .iter()
        .zip(records)
        .filter_map(|(k, r)| r.filter(|r| k.name() == keys.network_record(r.node).name()))
        .collect())
}

/// The interface that holds `ip`, and its rate in Gbit/s where the facts know it.
fn interface_of(ip: Option<IpAddr>, nics: &[Nic]) -> (Option<String>, Option<f64>) {
    let Some(ip) = ip.map(|i| i.to_canonical()) else {
        return (None, None);
    };
    let nic = nics.iter().find(|n| {
        n.addresses
            .iter()
            .any(|a| a.addr.parse::<IpAddr>().is_ok_and(|x| x == ip))
    });
    match nic {
        Some(n) => (
            Some(n.name.clone()),
            n.speed_mbps.filter(|s| *s > 0).map(|s| s as f64 / 1000.0),
        ),
        None => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rendezvous::{test_client as client, RunKeys};
    use crate::store::StoreServer;
    use toporun_shared::facts::NicAddress;
    use toporun_shared::network_check::report::Gate;

    const BEAT: Duration = Duration::from_millis(100);

    /// Four nodes' records as they write them, node 2's paths at 20 Mbit/s.
    async fn node_2_slow(kv: &mut Kv, keys: &RoundKeys) {
        let paths = rounds(4);
        for n in 0..4 {
            let received = paths.iter().flatten().filter(|p| p.to == n);
            let figure = |&path: &Path| PathFigure {
                path,
                gbit: if path.from == 2 || path.to == 2 {
                    0.02
                } else {
                    8.0
                },
                rtt_us: 60.0,
            };
            let record = NodeRecord {
                node: n,
                host: format!("node-{n}"),
                addr: format!("10.0.0.{}", n + 1),
                interface: Some("eth0".into()),
                expected_gbit: Some(10.0),
                received: received.map(figure).collect(),
                hosts_rendezvous: n == 0,
                rdma: false,
                via: DataPath::Tcp,
            };
            let key = keys.network_record(n);
            kv.set(key.name(), &key.encode(&record)).await.unwrap();
            kv.tally(&keys.network_records()).await.unwrap();
        }
    }

    /// Node rank 0 of four, under `gate` (None: report).
    fn node_0(gate: Option<GateRule>) -> CheckNode<'static> {
        CheckNode {
            round: 0,
            node_rank: 0,
            nnodes: 4,
            host: "node-0",
            addr: "10.0.0.1",
            ips: &[],
            nics: &[],
            hosts_rendezvous: true,
            rdma: false,
            spare_beat: BEAT,
            gate,
        }
    }

    #[tokio::test]
    async fn the_gate_counts_the_spares_still_beating_not_one_that_died() {
        let s = StoreServer::bind(0).unwrap();
        let mut kv = client(s.port()).await;
        let keys = RunKeys::new("spares", None).round(0);
        node_2_slow(&mut kv, &keys).await;
        let me = node_0(Some(GateRule {
            elastic_min: Some(4),
        }));
        // A spare that counted itself, then died (its pod evicted): the store's
        // counter still says one, and a gate that counted it would go on without
        // node 2 and wait out the join timeout for a node that never comes.
        let (waiting, ttl) = (keys.waiting(), me.spare_beat * 3);
        client(s.port())
            .await
            .tally_alive(&waiting, ttl, None)
            .await
            .unwrap();
        let report = judge(&mut kv, &keys, &me, (Instant::now(), GATHER_WAIT))
            .await
            .unwrap();
        assert_eq!(report.refusable(), [2]);
        assert_eq!(report.spares, 0);
        assert!(
            matches!(report.gate(Some(4)), Gate::Stop(why) if why.contains("3 node(s) would be left"))
        );
        // One that keeps beating takes node 2's place.
        let mut live = client(s.port()).await;
        let place = live.tally_alive(&waiting, ttl, None).await.unwrap();
        let beating = tokio::spawn(async move {
            loop {
                tokio::time::sleep(BEAT).await;
                live.tally_alive(&waiting, ttl, Some(place)).await.unwrap();
            }
        });
        let report = judge(&mut kv, &keys, &me, (Instant::now(), GATHER_WAIT))
            .await
            .unwrap();
        beating.abort();
        assert_eq!(report.spares, 1);
        assert_eq!(report.gate(Some(4)), Gate::Without(vec![2]));
        // Under report, where nobody is refused, the counter is said as it is, at once.
        let t = Instant::now();
        let reporting = node_0(None);
        let report = judge(&mut kv, &keys, &reporting, (t, GATHER_WAIT)).await;
        assert_eq!(report.unwrap().spares, 2);
        assert!(t.elapsed() < me.spare_window(), "{:?}", t.elapsed());
    }

    #[test]
    fn the_interface_is_the_one_holding_the_address_a_peer_reached() {
        let nic = |name: &str, addr: &str, speed| Nic {
            name: name.into(),
            speed_mbps: speed,
            addresses: vec![NicAddress {
                addr: addr.into(),
                prefix_len: 24,
            }],
            ..Default::default()
        };
        let nics = [
            nic("lo", "127.0.0.1", None),
            nic("eth0", "10.1.0.7", Some(100_000)),
        ];
        let mapped: IpAddr = "::ffff:10.1.0.7".parse().unwrap();
        assert_eq!(
            interface_of(Some(mapped), &nics),
            (Some("eth0".into()), Some(100.0))
        );
        assert_eq!(
            interface_of(Some("127.0.0.1".parse().unwrap()), &nics),
            (Some("lo".into()), None)
        );
        assert_eq!(interface_of(None, &nics), (None, None));
    }
}

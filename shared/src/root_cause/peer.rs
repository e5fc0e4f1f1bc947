//! A peer that went away, as the rank that lost it says: gloo's and NCCL's closed or
//! reset connections, and the TCPStore's. The rank dies within milliseconds of the
//! peer, long before keep-alives can say which node was lost.

/// What gloo, NCCL and the TCPStore print when the other end is gone.
const SIGNATURES: [&str; 7] = [
    "Connection closed by peer",
    "Connection reset by peer",
    "Connection closed by remote peer",
    "remote process exited or there was a network error",
    "ncclRemoteError",
    "DistNetworkError",
    "Broken pipe",
];

/// Which of the known messages `line` holds ("Connection closed by peer").
pub fn signature(line: &str) -> Option<&'static str> {
    SIGNATURES.iter().copied().find(|s| line.contains(s))
}

/// The line of `text` saying a peer went away (the last one), and the peer's address
/// where the line gives it (gloo: `[10.0.0.2]:41234`).
pub fn lost_peer(text: &str) -> Option<(String, Option<String>)> {
    let line = text
        .lines()
        .rev()
        .find(|l| SIGNATURES.iter().any(|s| l.contains(s)))?
        .trim()
        .to_string();
    let addr = address(&line);
    Some((line, addr))
}

/// The peer's `host:port` a line gives (gloo: `[10.0.0.2]:41234`).
pub fn address(line: &str) -> Option<String> {
    line.split('[').skip(1).find_map(|rest| {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        let port: String = port.chars().take_while(char::is_ascii_digit).collect();
        let ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':');
        (ok && !port.is_empty()).then(|| format!("{host}:{port}"))
    })
}

/// Whether a peer's host is this machine seen through loopback, where a port number
/// names a local process (on another host, the same number means nothing here).
pub fn is_loopback(host: &str) -> bool {
    host.trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|a| a.is_loopback())
}

/// A node of the round as a peer's address names it: its name for people
/// (`hostname, address`) and every address it is reached at (the one it advertised,
/// its interfaces').
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeAddrs {
    pub name: String,
    pub addrs: Vec<String>,
}

/// Addresses kept per node: a pod has a few, a host with many bridges more.
pub const MAX_ADDRS: usize = 32;

/// The nodes (ranks in the round's table) at a peer's `host:port`; more than one
/// where nodes share an address (one machine).
pub fn nodes_at(peer: &str, nodes: &[NodeAddrs]) -> Vec<u32> {
    let host = peer
        .rsplit_once(':')
        .map_or(peer, |(h, _)| h)
        .trim_matches(['[', ']']);
    (0u32..)
        .zip(nodes)
        .filter(|(_, n)| n.addrs.iter().any(|a| a == host))
        .map(|(n, _)| n)
        .collect()
}

/// Whether an interface address can name a node to its peers: not loopback, which
/// every node has, nor link-local, which every link has.
pub fn names_a_node(addr: &str) -> bool {
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => !a.is_loopback() && !a.is_link_local(),
        Ok(std::net::IpAddr::V6(a)) => !a.is_loopback() && (a.segments()[0] & 0xffc0) != 0xfe80,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gloo_and_nccl_lines_are_found_with_the_address() {
        let gloo = "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41234\n";
        let (line, addr) = lost_peer(gloo).unwrap();
        assert!(line.ends_with("[10.0.0.2]:41234"));
        assert_eq!(addr.as_deref(), Some("10.0.0.2:41234"));
        let nccl =
            "NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n";
        assert_eq!(lost_peer(nccl).unwrap().1, None);
        assert_eq!(lost_peer("ValueError: x\n"), None);
    }

    #[test]
    fn a_peer_address_maps_to_its_node() {
        let node = |addrs: &[&str]| NodeAddrs {
            name: String::new(),
            addrs: addrs.iter().map(|a| a.to_string()).collect(),
        };
        // Node 0 advertised its pod name; its interface says its IP.
        let table = [
            node(&["trainer-0", "10.0.0.1"]),
            node(&["10.0.0.2"]),
            node(&["trainer-2", "10.0.0.2", "fd00::2"]),
        ];
        assert_eq!(nodes_at("10.0.0.1:41234", &table), [0]);
        assert_eq!(nodes_at("10.0.0.2:5", &table), [1, 2]);
        assert_eq!(nodes_at("[fd00::2]:5", &table), [2]);
        assert_eq!(nodes_at("fd00::2:5", &table), [2]);
        assert!(nodes_at("10.9.9.9:5", &table).is_empty());
    }

    #[test]
    fn loopback_and_link_local_name_no_node() {
        assert!(names_a_node("10.0.0.1"));
        assert!(names_a_node("fd00::2"));
        for a in ["127.0.0.1", "::1", "169.254.1.1", "fe80::1", "eth0"] {
            assert!(!names_a_node(a), "{a}");
        }
    }
}

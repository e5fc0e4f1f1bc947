//! Who holds a TCP port in this network namespace, from /proc: the sockets bound to
//! it in /proc/net/tcp{,6} (listening, or a connection from that port), then the
//! processes holding them among /proc/<pid>/fd. Used to say why toporun could not
//! take a port.

use crate::paths::{Root, PROC, PROC_NET_TCP, PROC_NET_TCP6};

/// A process that holds a socket bound to the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortOwner {
    pub pid: u32,
    /// Its command name (/proc/<pid>/comm).
    pub comm: String,
    /// The socket's TCP state (LISTEN, ESTABLISHED, SYN_SENT...).
    pub state: &'static str,
}

/// The kernel's TCP state numbers (include/net/tcp_states.h), as /proc shows them.
fn state_name(hex: &str) -> &'static str {
    match hex {
        "01" => "ESTABLISHED",
        "02" => "SYN_SENT",
        "03" => "SYN_RECV",
        "04" => "FIN_WAIT1",
        "05" => "FIN_WAIT2",
        "06" => "TIME_WAIT",
        "07" => "CLOSE",
        "08" => "CLOSE_WAIT",
        "09" => "LAST_ACK",
        "0A" => "LISTEN",
        "0B" => "CLOSING",
        _ => "?",
    }
}

/// The inodes and states of sockets bound to `port` (inode 0: no process holds it,
/// as in TIME_WAIT).
fn bound_sockets(root: &Root, port: u16) -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for table in [PROC_NET_TCP, PROC_NET_TCP6] {
        let Some(text) = root.read(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let port_hex = local.rsplit(':').next().unwrap_or("");
            if u16::from_str_radix(port_hex, 16) == Ok(port) && *inode != "0" {
                out.push(((*inode).to_string(), state_name(state)));
            }
        }
    }
    out
}

/// The processes holding sockets bound to `port`, where /proc lets this process see
/// them (other users' descriptors need privileges); empty when none can be named.
pub fn holders(root: &Root, port: u16) -> Vec<PortOwner> {
    let sockets = bound_sockets(root, port);
    if sockets.is_empty() {
        return Vec::new();
    }
    let wanted: Vec<(String, &'static str)> = sockets
        .iter()
        .map(|(i, state)| (format!("socket:[{i}]"), *state))
        .collect();
    let mut owners = Vec::new();
    for pid in root.list(PROC).iter().filter_map(|p| p.parse::<u32>().ok()) {
        let fd_dir = root.join(format!("{PROC}/{pid}/fd"));
        let Ok(fds) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        let held = fds.flatten().find_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            wanted
                .iter()
                .find(|(w, _)| target.as_os_str() == w.as_str())
                .map(|(_, state)| *state)
        });
        if let Some(state) = held {
            let comm = root
                .read(format!("{PROC}/{pid}/comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default();
            owners.push(PortOwner { pid, comm, state });
        }
    }
    owners
}

/// Every socket's inode and local port in /proc/net/tcp{,6}.
fn local_ports(root: &Root) -> std::collections::HashMap<String, u16> {
    let mut out = std::collections::HashMap::new();
    for table in [PROC_NET_TCP, PROC_NET_TCP6] {
        for line in root.read(table).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (f.get(1), f.get(9)) else {
                continue;
            };
            let port = local.rsplit(':').next().unwrap_or("");
            if let Ok(port) = u16::from_str_radix(port, 16) {
                out.insert(inode.to_string(), port);
            }
        }
    }
    out
}

/// The local TCP ports each of `pids` holds (listening, or its end of a connection):
/// a peer's `[127.0.0.1]:35742` in another rank's error names the rank that held it.
pub fn ports_held(root: &Root, pids: &[i32]) -> std::collections::HashMap<i32, Vec<u16>> {
    let ports = local_ports(root);
    pids.iter()
        .map(|pid| {
            let held: Vec<u16> = root
                .list(format!("{PROC}/{pid}/fd"))
                .iter()
                .filter_map(|fd| {
                    std::fs::read_link(root.join(format!("{PROC}/{pid}/fd/{fd}"))).ok()
                })
                .filter_map(|t| {
                    let t = t.to_string_lossy().into_owned();
                    let inode = t.strip_prefix("socket:[")?.strip_suffix(']')?.to_string();
                    ports.get(&inode).copied()
                })
                .collect();
            (*pid, held)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_a_process_holds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let held = ports_held(&Root::live(), &[me]);
        assert!(held[&me].contains(&port), "{held:?}");
    }

    #[test]
    fn names_the_process_holding_a_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let owners = holders(&Root::live(), port);
        assert!(
            owners
                .iter()
                .any(|o| o.pid == std::process::id() && o.state == "LISTEN"),
            "{owners:?}"
        );
        drop(listener);
        assert!(holders(&Root::live(), port).is_empty());
    }

    #[test]
    fn reads_listening_sockets_from_a_tree() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::at(d.path());
        std::fs::create_dir_all(d.path().join("proc/net")).unwrap();
        std::fs::write(
            d.path().join(PROC_NET_TCP),
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n   1: 0100007F:1F91 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4343 1\n",
        )
        .unwrap();
        assert_eq!(
            bound_sockets(&root, 0x1F90),
            vec![("4242".into(), "LISTEN")]
        );
        assert_eq!(
            bound_sockets(&root, 0x1F91),
            vec![("4343".into(), "ESTABLISHED")]
        );
        assert!(bound_sockets(&root, 0x1F92).is_empty());
    }
}

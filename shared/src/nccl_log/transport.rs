//! NCCL's transport names (`P2P/CUMEM`, `SHM/direct/direct`, `NET/IB/0/GDRDMA`...) and
//! the classes a reader cares about.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a link between two ranks runs over, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// GPU to GPU directly: NVLink or PCIe peer-to-peer.
    P2p,
    /// Staged through host memory.
    Shm,
    /// Through a network plugin (sockets or RDMA).
    Net,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::P2p => "p2p",
            Class::Shm => "shm",
            Class::Net => "net",
        })
    }
}

/// A transport as NCCL named it, with its class and, for NET, whether it is RDMA.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Transport {
    pub via: String,
    pub class: Class,
    /// NET over InfiniBand, RoCE, EFA (Libfabric/OFI) rather than TCP sockets.
    pub rdma: bool,
}

impl Transport {
    /// Classifies NCCL's text after `via `; None for a name NCCL does not use.
    pub fn parse(via: &str) -> Option<Transport> {
        let via = via.trim();
        let head = via.split('/').next()?;
        let class = match head {
            "P2P" => Class::P2p,
            "SHM" => Class::Shm,
            "NET" | "COLLNET" => Class::Net,
            _ => return None,
        };
        let rdma = class == Class::Net && !via.starts_with("NET/Socket");
        Some(Transport {
            via: via.to_string(),
            class,
            rdma,
        })
    }

    /// The short cell of the transport matrix.
    pub fn short(&self) -> &'static str {
        match (self.class, self.rdma) {
            (Class::P2p, _) => "P2P",
            (Class::Shm, _) => "SHM",
            (Class::Net, true) => "RDMA",
            (Class::Net, false) => "SOCK",
        }
    }

    /// Lower is faster: P2P, SHM, RDMA, sockets.
    pub fn rank(&self) -> u8 {
        match (self.class, self.rdma) {
            (Class::P2p, _) => 0,
            (Class::Shm, _) => 1,
            (Class::Net, true) => 2,
            (Class::Net, false) => 3,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_form_classifies() {
        let cases = [
            ("P2P/CUMEM", Class::P2p, "P2P"),
            ("P2P/CUMEM/read", Class::P2p, "P2P"),
            ("P2P/IPC", Class::P2p, "P2P"),
            ("P2P/direct pointer", Class::P2p, "P2P"),
            ("SHM/direct/direct", Class::Shm, "SHM"),
            ("SHM/direct", Class::Shm, "SHM"),
            ("NET/Socket/0", Class::Net, "SOCK"),
            ("NET/IB/0/GDRDMA", Class::Net, "RDMA"),
            ("NET/Libfabric/0/GDRDMA", Class::Net, "RDMA"),
            ("NET/AWS Libfabric/1", Class::Net, "RDMA"),
        ];
        for (via, class, short) in cases {
            let t = Transport::parse(via).unwrap();
            assert_eq!((t.class, t.short()), (class, short), "{via}");
        }
        assert!(Transport::parse("TCP/whatever").is_none());
        assert!(Transport::parse("").is_none());
    }
}

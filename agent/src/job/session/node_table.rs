//! The table the coordinator prints when a round closes.

use crate::rendezvous::NodeInfo;
use toporun_shared::untrusted::printable;

pub fn node_table(run_id: &str, round: u32, infos: &[NodeInfo]) -> String {
    let total: u32 = infos.iter().map(|i| i.nproc).sum();
    let mut out = format!(
        "toporun: rendezvous {run_id} round {round} complete: {} nodes, {total} ranks\n",
        infos.len()
    );
    if infos.len() > 64 {
        return out;
    }
    out.push_str("  node  hostname                 address                  ranks      GPUs\n");
    let mut base = 0;
    for (i, n) in infos.iter().enumerate() {
        out.push_str(&format!(
            "  {:<5} {:<24} {:<24} {:<10} {}\n",
            i,
            printable(&n.hostname),
            printable(&n.addr),
            format!("{}-{}", base, base + n.nproc.max(1) - 1),
            n.gpus
        ));
        base += n.nproc;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_run_on_in_node_order() {
        let node = |nproc| NodeInfo {
            hostname: "h".into(),
            addr: "a".into(),
            nproc,
            ..Default::default()
        };
        let t = node_table("job", 2, &[node(2), node(3)]);
        assert!(t.contains("round 2 complete: 2 nodes, 5 ranks"), "{t}");
        assert!(t.contains("0-1") && t.contains("2-4"), "{t}");
    }
}

//! Replays byte transcripts of a real PyTorch client talking to a real PyTorch
//! TCPStore server (tests/fixtures/source/tcpstore) against toporun's state machine:
//! every connection must get the same reply bytes.

use std::collections::BTreeMap;
use toporun_shared::store::{decode_request, StoreState};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn replay(path: &str) -> usize {
    let text = std::fs::read_to_string(format!(
        "{}/../tests/fixtures/source/tcpstore/{path}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut state = StoreState::new();
    let mut inbox: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut ours: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut theirs: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for chunk in doc["log"].as_array().unwrap() {
        let conn = chunk["conn"].as_u64().unwrap();
        let bytes = unhex(chunk["hex"].as_str().unwrap());
        if chunk["dir"] == "s2c" {
            theirs.entry(conn).or_default().extend(bytes);
            continue;
        }
        let buf = inbox.entry(conn).or_default();
        buf.extend(bytes);
        while let Some((req, used)) = decode_request(buf).unwrap() {
            buf.drain(..used);
            let fx = state.apply(conn, req);
            assert!(!fx.close, "connection {conn} closed");
            for (to, reply) in fx.replies {
                ours.entry(to).or_default().extend(reply);
            }
        }
    }
    for (conn, want) in &theirs {
        assert_eq!(
            ours.get(conn).map(Vec::as_slice).unwrap_or_default(),
            want.as_slice(),
            "{path}: connection {conn}"
        );
    }
    theirs.values().map(Vec::len).sum()
}

#[test]
fn client_operations_transcript() {
    assert!(replay("client-ops-torch-2.15.json") > 300_000);
}

#[test]
fn two_gloo_workers_initialising_through_an_agent_store() {
    assert!(replay("worker-init-gloo-2ranks-torch-2.15.json") > 0);
}

//! toporun's store client against PyTorch's own TCPStore server (real PyTorch from the
//! cached virtualenv, scripts/dev/setup_venv.sh).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use toporun_agent::store::{StoreClient, StoreError};

mod common;
use common::python;

const SERVER: &str = r#"
import sys, time, torch.distributed as dist
from datetime import timedelta
s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
print(s.port, flush=True)
s.wait(["done"], timedelta(seconds=60))
assert s.get("k") == b"v", s.get("k")
print("SERVER_SAW_OUR_KEYS", flush=True)
"#;

#[tokio::test]
#[ignore = "needs PyTorch: run scripts/dev/test.sh"]
async fn our_client_against_pytorchs_server() {
    let mut server = Command::new(python())
        .args(["-c", SERVER])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the venv python (scripts/dev/setup_venv.sh)");
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let port: u16 = lines.next().unwrap().unwrap().trim().parse().unwrap();
    let t = Duration::from_secs(5);
    let mut c = StoreClient::connect("127.0.0.1", port, t).await.unwrap();
    c.set("k", b"v").await.unwrap();
    assert_eq!(c.get("k", t).await.unwrap(), b"v");
    assert_eq!(c.add("n", 7).await.unwrap(), 7);
    assert_eq!(c.compare_set("k", b"v", b"w").await.unwrap(), b"w");
    assert_eq!(c.compare_set("k", b"x", b"y").await.unwrap(), b"w");
    c.set("k", b"v").await.unwrap();
    assert!(c.check(&["k", "n"]).await.unwrap());
    assert!(matches!(
        c.wait(&["absent"], Duration::from_millis(100)).await,
        Err(StoreError::WaitTimeout(..))
    ));
    c.append("a", b"1").await.unwrap();
    c.append("a", b"2").await.unwrap();
    c.multi_set(&[("m1", b"x"), ("m2", b"y")]).await.unwrap();
    assert_eq!(
        c.multi_get(&["a", "m1", "m2"], t).await.unwrap(),
        vec![b"12".to_vec(), b"x".to_vec(), b"y".to_vec()]
    );
    assert!(c.num_keys().await.unwrap() >= 5);
    assert!(c.delete_key("a").await.unwrap());
    c.queue_push("q", b"one").await.unwrap();
    assert_eq!(c.queue_len("q").await.unwrap(), 1);
    assert_eq!(c.queue_pop("q", t).await.unwrap(), b"one");
    assert_eq!(c.ping(99).await.unwrap(), 99);
    c.set("done", b"1").await.unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "SERVER_SAW_OUR_KEYS");
    assert!(server.wait().unwrap().success());
}

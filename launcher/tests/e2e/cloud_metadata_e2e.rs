//! The instance type from a cloud's metadata service, through the binary, against a
//! local HTTP server that answers like each cloud's (tests/fixtures/metadata): the
//! IMDSv2 token step, GCP's and Azure's headers, a slow server (the 300 ms bound
//! holds), a refused connection and garbage (no delay, no finding).

use crate::support;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(mode: &str) -> Server {
        let mut child = Command::new("python3")
            .arg(scripts().join("metadata_server.py"))
            .arg(mode)
            .arg(fixtures().join("metadata"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the server's port");
        Server { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// toporun with every metadata endpoint at `url` (or the ones given per cloud).
fn asking(aws: &str, gcp: &str, azure: &str) -> Command {
    let mut c = toporun();
    c.env_remove("TOPORUN_NO_METADATA")
        .env_remove("AWS_EC2_METADATA_DISABLED")
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", aws)
        .env("GCE_METADATA_HOST", gcp.trim_start_matches("http://"))
        .env("TOPORUN_AZURE_METADATA_ENDPOINT", azure);
    c
}

fn probe_cloud(cmd: &mut Command) -> (serde_json::Value, Duration) {
    let t0 = Instant::now();
    let (code, out, err) = run(cmd.args(["probe", "--format", "json"]));
    let took = t0.elapsed();
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    (v["cloud"].clone(), took)
}

fn instance_finding(cmd: &mut Command) -> Option<serde_json::Value> {
    let (_, out, err) = run(cmd.args(["preflight", "--format", "json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "instance.devices")
        .cloned()
}

#[test]
fn each_cloud_names_its_instance_type() {
    let cases = [
        ("aws", "p5.48xlarge", "AWS IMDSv2"),
        ("gcp", "a3-ultragpu-8g", "GCP metadata server"),
        ("azure", "Standard_ND96isr_H100_v5", "Azure IMDS"),
    ];
    for (mode, want, source) in cases {
        let s = Server::start(mode);
        // Every cloud's requests go to the one server, as on a real VM, where the
        // other two clouds' paths answer 404.
        let (cloud, _) = probe_cloud(&mut asking(&s.url(), &s.url(), &s.url()));
        assert_eq!(cloud["provider"], mode, "{cloud}");
        assert_eq!(cloud["instance_type"], want, "{cloud}");
        assert!(
            cloud["source"].as_str().unwrap().starts_with(source),
            "{cloud}"
        );
        // No GPU on this machine: the instance's are missing, with the request to make.
        let f =
            instance_finding(&mut asking(&s.url(), &s.url(), &s.url())).expect("instance.devices");
        assert_eq!(f["severity"], "warning", "{f}");
        assert!(
            f["summary"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{want}: 8 ")),
            "{f}"
        );
        assert!(
            f["remedy"].as_str().unwrap().contains("nvidia.com/gpu: 8"),
            "{f}"
        );
        assert!(
            f["facts"]["source"]
                .as_str()
                .unwrap()
                .starts_with("https://"),
            "{f}"
        );
    }
}

#[test]
fn imdsv2_needs_its_token_and_disabled_means_not_asked() {
    let s = Server::start("aws");
    let refused = format!("http://127.0.0.1:{}", free_port());
    let (cloud, _) = probe_cloud(&mut asking(&s.url(), &refused, &refused));
    assert_eq!(
        cloud["instance_type"], "p5.48xlarge",
        "the token step worked"
    );
    let (cloud, _) =
        probe_cloud(asking(&s.url(), &refused, &refused).env("AWS_EC2_METADATA_DISABLED", "true"));
    assert!(cloud.is_null(), "{cloud}");
    let (code, out, _) = run(asking(&s.url(), &refused, &refused).args([
        "probe",
        "--no-metadata",
        "--format",
        "json",
    ]));
    assert_eq!(code, 0);
    assert!(!out.contains("\"cloud\""), "{out}");
}

/// The slow server answers after 3 s; the probe gives the services 300 ms in all.
/// Against a probe without metadata in the same run, the slow one costs far less
/// than the server's 3 s: a missing bound fails this, a loaded machine's second of
/// noise does not.
#[test]
fn a_slow_server_costs_at_most_the_bound() {
    let slow = Server::start("slow");
    let t0 = Instant::now();
    let (code, _, _) = run(toporun().args(["probe", "--no-metadata", "--format", "json"]));
    assert_eq!(code, 0);
    let base = t0.elapsed();
    let (cloud, took) = probe_cloud(&mut asking(&slow.url(), &slow.url(), &slow.url()));
    assert!(cloud.is_null(), "{cloud}");
    let extra = took.saturating_sub(base);
    eprintln!("slow metadata: probe {took:?}, without metadata {base:?}");
    assert!(
        extra < Duration::from_millis(1500),
        "metadata cost {extra:?} (probe {took:?}, without metadata {base:?}): the server held its answer 3 s"
    );
    assert!(instance_finding(&mut asking(&slow.url(), &slow.url(), &slow.url())).is_none());
}

#[test]
fn refused_or_garbage_answers_give_nothing_without_delay() {
    let refused = format!("http://127.0.0.1:{}", free_port());
    let (cloud, took) = probe_cloud(&mut asking(&refused, &refused, &refused));
    assert!(cloud.is_null(), "{cloud}");
    assert!(took < Duration::from_millis(1000), "{took:?}");
    assert!(instance_finding(&mut asking(&refused, &refused, &refused)).is_none());
    let junk = Server::start("garbage");
    let (cloud, _) = probe_cloud(&mut asking(&junk.url(), &junk.url(), &junk.url()));
    assert!(cloud.is_null(), "garbage is not an instance type: {cloud}");
    assert!(instance_finding(&mut asking(&junk.url(), &junk.url(), &junk.url())).is_none());
    let endless = Server::start("endless");
    let (cloud, took) = probe_cloud(&mut asking(&endless.url(), &endless.url(), &endless.url()));
    assert!(cloud.is_null(), "an answer without end is not one: {cloud}");
    assert!(took < Duration::from_millis(1000), "{took:?}");
}

//! A real etcd cluster on loopback for the elastic tests: members started from the
//! `etcd` binary scripts/dev/setup_etcd.sh installs (`TOPORUN_ETCD`, else PATH), each
//! killable on its own.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    /// Client URLs, one per member.
    pub clients: Vec<String>,
    _dir: tempfile::TempDir,
}

/// Where the members keep their data: in memory (/dev/shm) where it has room, so a
/// shared disk that is slow to fsync or nearly full cannot stall the cluster's
/// elections under a test; else the temporary directory.
fn data_dir() -> tempfile::TempDir {
    let room = nix::sys::statvfs::statvfs(SHM)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0);
    let shm = (room >= SHM_NEEDED).then(|| tempfile::tempdir_in(SHM).ok());
    shm.flatten()
        .unwrap_or_else(|| tempfile::tempdir().unwrap())
}

const SHM: &str = "/dev/shm";
/// A 3-member cluster's WALs (64 MB preallocated each) and databases, with room to
/// spare for the ranks' own /dev/shm use (Docker's default /dev/shm is 64 MB).
const SHM_NEEDED: u64 = 1 << 30;

fn binary() -> PathBuf {
    std::env::var_os("TOPORUN_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster answers.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, false)
    }

    /// One member serving clients over TLS only and asking for a client certificate
    /// (a CA, the server's and a client's certificate made with openssl, in `tls_dir()`).
    pub fn start_tls() -> EtcdCluster {
        EtcdCluster::start_with(1, true)
    }

    /// Where `start_tls` keeps ca.pem, client.pem and client-key.pem.
    pub fn tls_dir(&self) -> PathBuf {
        self._dir.path().join("tls")
    }

    /// A member may lose its free port to another test between the pick and etcd's
    /// bind (the members' logs then say "address already in use"): a cluster that does
    /// not come up is started again on other ports, three times at most.
    fn start_with(n: usize, tls: bool) -> EtcdCluster {
        let mut logs = String::new();
        for _ in 0..3 {
            let cluster = EtcdCluster::try_start(n, tls);
            if cluster.wait_ready() {
                return cluster;
            }
            logs = cluster.logs();
        }
        panic!("etcd did not come up in three tries; the last members' logs:\n{logs}");
    }

    fn logs(&self) -> String {
        (0..self.members.len())
            .map(|i| {
                let log = self._dir.path().join(format!("m{i}.log"));
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                format!(
                    "m{i}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn try_start(n: usize, tls: bool) -> EtcdCluster {
        let dir = data_dir();
        let tls_dir = dir.path().join("tls");
        if tls {
            make_certificates(&tls_dir);
        }
        let scheme = if tls { "https" } else { "http" };
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| (super::free_port(), super::free_port()))
            .collect();
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect();
        // One token for the cluster (its members must agree), unique per test.
        let token = format!("t{}", ports[0].0);
        let mut members = Vec::new();
        let mut clients = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let url = format!("{scheme}://127.0.0.1:{client}");
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log"))).unwrap();
            let mut cmd = Command::new(binary());
            if tls {
                cmd.arg("--cert-file")
                    .arg(tls_dir.join("server.pem"))
                    .arg("--key-file")
                    .arg(tls_dir.join("server-key.pem"))
                    .arg("--trusted-ca-file")
                    .arg(tls_dir.join("ca.pem"))
                    .arg("--client-cert-auth");
            }
            let child = cmd
                .args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(dir.path().join(format!("m{i}")))
                .args([
                    "--listen-client-urls",
                    &url,
                    "--advertise-client-urls",
                    &url,
                ])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                ])
                .args(["--initial-cluster", &initial.join(",")])
                .args([
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &token,
                ])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start etcd ({}): {e}; run scripts/dev/setup_etcd.sh",
                        binary().display()
                    )
                });
            members.push(Some(child));
            clients.push(url);
        }
        EtcdCluster {
            members,
            clients,
            _dir: dir,
        }
    }

    /// Whether every member answers within 30 s.
    fn wait_ready(&self) -> bool {
        let start = Instant::now();
        let mut b = super::http();
        if self.clients[0].starts_with("https") {
            let dir = self.tls_dir();
            let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
            let mut id = read("client.pem");
            id.extend(read("client-key.pem"));
            b = b
                .tls_certs_only(vec![
                    reqwest::Certificate::from_pem(&read("ca.pem")).unwrap()
                ])
                .identity(reqwest::Identity::from_pem(&id).unwrap());
        }
        let http = b.build().unwrap();
        for url in &self.clients {
            loop {
                let ok = http
                    .post(format!("{url}/v3/kv/put"))
                    .body(r#"{"key":"cmVhZHk=","value":"MQ=="}"#)
                    .send()
                    .is_ok_and(|r| r.status().is_success());
                if ok {
                    break;
                }
                if start.elapsed() > Duration::from_secs(30) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        true
    }

    /// The endpoints as --rdzv-endpoint takes them.
    pub fn endpoints(&self) -> String {
        self.clients
            .iter()
            .map(|u| {
                u.trim_start_matches("http://")
                    .trim_start_matches("https://")
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Writes a key through the JSON gateway of a live member.
    pub fn put(&self, key: &str, value: &str) {
        use base64::Engine;
        let b = base64::engine::general_purpose::STANDARD;
        let body = serde_json::json!({"key": b.encode(key), "value": b.encode(value)});
        let url = self
            .clients
            .iter()
            .zip(&self.members)
            .find(|(_, m)| m.is_some())
            .map(|(u, _)| u)
            .expect("a live member");
        let r = super::http()
            .build()
            .unwrap()
            .post(format!("{url}/v3/kv/put"))
            .body(body.to_string())
            .send()
            .unwrap();
        assert!(r.status().is_success());
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, with openssl.
/// The server certificate also allows client use: etcd 3.4 gateway dials its own gRPC
/// port with it.
fn make_certificates(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca.pem -days 2 -subj /CN=toporun-test-ca
openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj /CN=127.0.0.1
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out server.pem -days 2 -extfile server.ext
openssl req -newkey rsa:2048 -nodes -keyout client-key.pem -out client.csr -subj /CN=toporun-node
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca-key.pem -CAcreateserial -out client.pem -days 2 -extfile client.ext
"#;
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .expect("openssl makes the test certificates");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

//! etcd's v3 API through its JSON gateway (served on every client port since etcd 3.4),
//! with reqwest: no protobuf compiler at build time. Requests go to one member and
//! move to the next when it is unreachable, so losing a member while the cluster
//! keeps quorum changes nothing for the caller.

use super::etcd_wire::{
    KeepAliveResponse, LeaseGrantResponse, PutResponse, RangeResponse, TxnResponse,
};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use toporun_shared::untrusted::printable;

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no etcd member answered within {waited:.1?} (tried {endpoints}): {last}")]
    Unreachable {
        endpoints: String,
        waited: Duration,
        last: String,
    },
    #[error("etcd at {endpoint} refused {what}: {message}")]
    Refused {
        endpoint: String,
        what: String,
        message: String,
    },
    #[error("etcd at {endpoint} answered {what} with something that is not etcd's v3 API ({detail}); is it etcd 3.4 or later?")]
    NotEtcd {
        endpoint: String,
        what: String,
        detail: String,
    },
    #[error("bad etcd endpoint {0:?}: expected host:port or http(s)://host:port, comma-separated")]
    BadEndpoint(String),
    #[error("etcd TLS: {0}")]
    Tls(String),
    #[error("no etcd endpoint: --rdzv-endpoint names none")]
    NoEndpoints,
}

/// TLS settings, as torchrun's etcd rendezvous takes them from --rdzv-conf.
#[derive(Debug, Clone, Default)]
pub struct Tls {
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// One range answer's key-value pair.
#[derive(Debug, Clone)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
}

#[derive(Clone)]
pub struct Etcd {
    http: reqwest::Client,
    endpoints: Vec<String>,
    current: usize,
    /// How long one call may try, moving across members.
    deadline: Duration,
    ops: u64,
}

/// How long one member gets before the next is tried.
const PER_MEMBER: Duration = Duration::from_secs(3);

/// `host:port` or a URL, comma-separated, into base URLs (port 2379 by default).
pub fn parse_endpoints(list: &str, https: bool) -> Result<Vec<String>, EtcdError> {
    let scheme = if https { "https" } else { "http" };
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (scheme, rest) = match e.split_once("://") {
                Some((s @ ("http" | "https"), rest)) => (s, rest),
                Some(_) => return Err(EtcdError::BadEndpoint(printable(e))),
                None => (scheme, e),
            };
            let rest = rest.trim_end_matches('/');
            let (host, port) = toporun_shared::torchrun::endpoint::parse(rest)
                .map(|ep| (ep.host, ep.port.unwrap_or(2379)))
                .map_err(|_| EtcdError::BadEndpoint(printable(e)))?;
            if host.is_empty() || !toporun_shared::untrusted::valid_host(&host) {
                return Err(EtcdError::BadEndpoint(printable(e)));
            }
            Ok(format!(
                "{scheme}://{}",
                crate::store::client::display(&host, port)
            ))
        })
        .collect::<Result<Vec<_>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err(EtcdError::BadEndpoint(list.to_string()))
            } else {
                Ok(v)
            }
        })
}

fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// The end of a prefix range: the prefix with its last byte incremented.
fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return b64(&end);
        }
    }
    b64(&[0])
}

impl Etcd {
    pub fn new(endpoints: Vec<String>, tls: &Tls, deadline: Duration) -> Result<Etcd, EtcdError> {
        // Every request indexes the list: an empty one is refused here, not a panic later.
        if endpoints.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        crate::tls::install_provider();
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(30))
            .no_proxy();
        if tls.cacert.is_some() || tls.cert.is_some() || tls.key.is_some() {
            b = tls_settings(b, tls)?;
        }
        let http = b.build().map_err(|e| EtcdError::Tls(e.to_string()))?;
        Ok(Etcd {
            http,
            endpoints,
            current: 0,
            deadline,
            ops: 0,
        })
    }

    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    pub fn ops(&self) -> u64 {
        self.ops
    }

    pub fn set_deadline(&mut self, d: Duration) {
        self.deadline = d;
    }

    /// One call of the v3 API: tries the current member, then the others, until the
    /// deadline. An answer from etcd that is an error is not retried elsewhere.
    async fn call(&mut self, path: &str, body: Value) -> Result<Value, EtcdError> {
        self.ops += 1;
        let start = Instant::now();
        let mut last: String;
        loop {
            let base = self.endpoints[self.current].clone();
            let left = self.deadline.saturating_sub(start.elapsed());
            let sent = self
                .http
                .post(format!("{base}{path}"))
                .timeout(left.min(PER_MEMBER).max(Duration::from_millis(50)))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await;
            match sent {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    let v: Value = serde_json::from_str(&text).map_err(|_| EtcdError::NotEtcd {
                        endpoint: base.clone(),
                        what: path.into(),
                        detail: format!(
                            "HTTP {status}: {}",
                            printable(&text.chars().take(120).collect::<String>())
                        ),
                    })?;
                    // A member without a leader (lost quorum on its side) is asked
                    // again elsewhere; other errors are etcd's answer.
                    let message = v.get("error").or_else(|| v.get("message"));
                    match message {
                        Some(m) if !status.is_success() || v.get("header").is_none() => {
                            let m = printable(m.as_str().unwrap_or_default());
                            if m.contains("no leader")
                                || m.contains("leader changed")
                                || status.is_server_error()
                            {
                                last = format!("{base}: {m}");
                            } else {
                                return Err(EtcdError::Refused {
                                    endpoint: base,
                                    what: path.into(),
                                    message: m,
                                });
                            }
                        }
                        _ => return Ok(v),
                    }
                }
                Err(e) => last = format!("{base}: {}", error_chain(&e)),
            }
            if start.elapsed() >= self.deadline {
                return Err(EtcdError::Unreachable {
                    endpoints: self.endpoints(),
                    waited: start.elapsed(),
                    last,
                });
            }
            self.current = (self.current + 1) % self.endpoints.len();
            if self.current == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// A call whose answer must have the shape `R`; any other is not etcd's.
    async fn call_as<R: DeserializeOwned>(
        &mut self,
        path: &str,
        body: Value,
    ) -> Result<R, EtcdError> {
        let v = self.call(path, body).await?;
        serde_json::from_value(v).map_err(|e| self.not_etcd(path, &e.to_string()))
    }

    /// Any answer from the cluster (used to wait for it at start).
    pub async fn ping(&mut self) -> Result<(), EtcdError> {
        self.call("/v3/kv/range", json!({"key": b64(b"toporun/ping")}))
            .await
            .map(|_| ())
    }

    /// Puts a value; returns the revision it was written at.
    pub async fn put(
        &mut self,
        key: &str,
        value: &[u8],
        lease: Option<i64>,
    ) -> Result<i64, EtcdError> {
        let mut body = json!({"key": b64(key.as_bytes()), "value": b64(value)});
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        let v: PutResponse = self.call_as("/v3/kv/put", body).await?;
        Ok(v.header.revision)
    }

    /// Keys under a prefix, oldest first (by creation), at most `limit` (0: all).
    pub async fn prefix(
        &mut self,
        prefix: &str,
        keys_only: bool,
        limit: i64,
    ) -> Result<Vec<KeyValue>, EtcdError> {
        let v: RangeResponse = self
            .call_as(
                "/v3/kv/range",
                json!({
                    "key": b64(prefix.as_bytes()),
                    "range_end": prefix_end(prefix),
                    "keys_only": keys_only,
                    "limit": limit.to_string(),
                    "sort_target": "CREATE",
                    "sort_order": "ASCEND",
                }),
            )
            .await?;
        self.kvs(v)
    }

    /// How many keys lie under a prefix.
    pub async fn count(&mut self, prefix: &str) -> Result<i64, EtcdError> {
        let v: RangeResponse = self
            .call_as(
                "/v3/kv/range",
                json!({"key": b64(prefix.as_bytes()), "range_end": prefix_end(prefix), "count_only": true}),
            )
            .await?;
        Ok(v.count)
    }

    /// TCPStore's compare_set in one transaction: `desired` is written when the key
    /// holds `expected` (or is absent and `expected` is empty); returns the value now.
    pub async fn compare_set(
        &mut self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, EtcdError> {
        let k = b64(key.as_bytes());
        let compare = if expected.is_empty() {
            json!({"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
        } else {
            json!({"key": k, "target": "VALUE", "result": "EQUAL", "value": b64(expected)})
        };
        let v: TxnResponse = self
            .call_as(
                "/v3/kv/txn",
                json!({
                    "compare": [compare],
                    "success": [{"request_put": {"key": k, "value": b64(desired)}}],
                    "failure": [{"request_range": {"key": k}}],
                }),
            )
            .await?;
        if v.succeeded {
            return Ok(desired.to_vec());
        }
        let range = v.responses.into_iter().next().unwrap_or_default();
        Ok(self
            .kvs(range.response_range)?
            .into_iter()
            .next()
            .map(|kv| kv.value)
            .unwrap_or_else(|| expected.to_vec()))
    }

    /// Several puts in transactions of at most 128 operations (etcd's default limit).
    pub async fn put_all(&mut self, pairs: &[(&str, &[u8])]) -> Result<(), EtcdError> {
        for chunk in pairs.chunks(128) {
            let ops: Vec<Value> = chunk
                .iter()
                .map(|(k, v)| json!({"request_put": {"key": b64(k.as_bytes()), "value": b64(v)}}))
                .collect();
            self.call("/v3/kv/txn", json!({"success": ops})).await?;
        }
        Ok(())
    }

    /// Several gets in transactions of at most 128; None for absent keys.
    pub async fn get_all(&mut self, keys: &[&str]) -> Result<Vec<Option<Vec<u8>>>, EtcdError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(128) {
            let ops: Vec<Value> = chunk
                .iter()
                .map(|k| json!({"request_range": {"key": b64(k.as_bytes())}}))
                .collect();
            let v: TxnResponse = self.call_as("/v3/kv/txn", json!({"success": ops})).await?;
            let mut responses = v.responses.into_iter();
            for _ in chunk {
                let r = responses.next().unwrap_or_default().response_range;
                out.push(self.kvs(r)?.into_iter().next().map(|kv| kv.value));
            }
        }
        Ok(out)
    }

    /// A lease of `ttl` seconds (etcd may raise it to its minimum).
    pub async fn grant(&mut self, ttl: i64) -> Result<i64, EtcdError> {
        let v: LeaseGrantResponse = self
            .call_as("/v3/lease/grant", json!({"TTL": ttl.to_string()}))
            .await?;
        match v.id {
            0 => Err(self.not_etcd("/v3/lease/grant", "no lease ID")),
            id => Ok(id),
        }
    }

    /// Refreshes a lease; false when it has expired already.
    pub async fn keep_alive(&mut self, id: i64) -> Result<bool, EtcdError> {
        let v: KeepAliveResponse = self
            .call_as("/v3/lease/keepalive", json!({"ID": id.to_string()}))
            .await?;
        Ok(v.result.ttl > 0)
    }

    fn not_etcd(&self, what: &str, detail: &str) -> EtcdError {
        EtcdError::NotEtcd {
            endpoint: self.endpoints[self.current].clone(),
            what: what.into(),
            detail: detail.into(),
        }
    }

    fn kvs(&self, range: RangeResponse) -> Result<Vec<KeyValue>, EtcdError> {
        let decode = |field: &str, text: &str| {
            B64.decode(text)
                .map_err(|_| self.not_etcd("a range", &format!("{field} is not base64")))
        };
        range
            .kvs
            .into_iter()
            .map(|kv| {
                Ok(KeyValue {
                    key: String::from_utf8_lossy(&decode("key", &kv.key)?).into_owned(),
                    value: decode("value", &kv.value)?,
                    create_revision: kv.create_revision,
                })
            })
            .collect()
    }
}

/// The error and its causes on one line (reqwest's Display alone hides the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The CA to trust (instead of the system's) and the client certificate, as
/// torchrun's etcd rendezvous takes them (`cacert`, `cert`, `key`).
fn tls_settings(
    mut b: reqwest::ClientBuilder,
    tls: &Tls,
) -> Result<reqwest::ClientBuilder, EtcdError> {
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| EtcdError::Tls(format!("{what} {}: {e}", printable(path))))
    };
    if let Some(ca) = &tls.cacert {
        let certs = reqwest::Certificate::from_pem_bundle(&read("cacert", ca)?).map_err(|e| {
            EtcdError::Tls(format!("cacert {}: {}", printable(ca), error_chain(&e)))
        })?;
        if certs.is_empty() {
            return Err(EtcdError::Tls(format!(
                "cacert {}: no PEM certificate in it",
                printable(ca)
            )));
        }
        b = b.tls_certs_only(certs);
    }
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let mut pem = read("cert", cert)?;
            pem.push(b'\n');
            pem.extend(read("key", key)?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                EtcdError::Tls(format!(
                    "cert {} / key {}: {}",
                    printable(cert),
                    printable(key),
                    error_chain(&e)
                ))
            })?;
            b = b.identity(id);
        }
        (None, None) => {}
        _ => {
            return Err(EtcdError::Tls(
                "--rdzv-conf cert and key go together (the client certificate and its private key)"
                    .into(),
            ))
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_default_port_and_scheme() {
        assert_eq!(
            parse_endpoints("a:1, http://b , [::1]:3", false).unwrap(),
            vec!["http://a:1", "http://b:2379", "http://[::1]:3"]
        );
        assert_eq!(parse_endpoints("c", true).unwrap(), vec!["https://c:2379"]);
        assert!(parse_endpoints("", false).is_err());
        assert!(parse_endpoints("ftp://x:1", false).is_err());
        assert!(parse_endpoints("a:notaport", false).is_err());
    }

    #[test]
    fn no_endpoints_is_an_error_not_a_panic() {
        let e = Etcd::new(Vec::new(), &Tls::default(), Duration::from_secs(1)).err();
        assert!(matches!(e, Some(EtcdError::NoEndpoints)), "{e:?}");
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(B64.decode(prefix_end("a/")).unwrap(), b"a0");
        assert_eq!(B64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }
}

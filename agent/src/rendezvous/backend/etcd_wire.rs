//! The answers of etcd's v3 JSON gateway that toporun reads, as types. The gateway
//! writes 64-bit integers as strings and leaves out every field at its zero value
//! (`succeeded: false`, an empty `kvs`, a lease's `TTL` of 0 once it expired), so
//! each field has a default and integers read from either form.

use serde::{Deserialize, Deserializer};

#[derive(Debug, Default, Deserialize)]
pub struct Header {
    #[serde(default, deserialize_with = "int")]
    pub revision: i64,
}

/// `/v3/kv/put`.
#[derive(Debug, Default, Deserialize)]
pub struct PutResponse {
    #[serde(default)]
    pub header: Header,
}

/// `/v3/kv/range`, and a transaction's range.
#[derive(Debug, Default, Deserialize)]
pub struct RangeResponse {
    #[serde(default)]
    pub kvs: Vec<WireKv>,
    #[serde(default, deserialize_with = "int")]
    pub count: i64,
}

/// A key-value pair as the gateway sends it: key and value in base64.
#[derive(Debug, Default, Deserialize)]
pub struct WireKv {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value: String,
    #[serde(default, deserialize_with = "int")]
    pub create_revision: i64,
}

/// `/v3/kv/txn`: whether the compare held, and each operation's answer.
#[derive(Debug, Default, Deserialize)]
pub struct TxnResponse {
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ResponseOp {
    /// Absent for a put.
    #[serde(default)]
    pub response_range: RangeResponse,
}

/// `/v3/lease/grant`.
#[derive(Debug, Default, Deserialize)]
pub struct LeaseGrantResponse {
    #[serde(rename = "ID", default, deserialize_with = "int")]
    pub id: i64,
}

/// `/v3/lease/keepalive` (one message of the stream).
#[derive(Debug, Default, Deserialize)]
pub struct KeepAliveResponse {
    #[serde(default)]
    pub result: KeepAliveResult,
}

#[derive(Debug, Default, Deserialize)]
pub struct KeepAliveResult {
    #[serde(rename = "TTL", default, deserialize_with = "int")]
    pub ttl: i64,
}

/// An int64 as the gateway writes it (a string), or as a number.
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Text(String),
        Number(i64),
    }
    match Int::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_with_the_gateways_strings_and_left_out_zeros() {
        // As etcd 3.4's gateway answered a failed compare_set and a granted lease.
        let txn: TxnResponse = serde_json::from_str(
            r#"{"header":{"revision":"7"},"responses":[{"response_range":{"header":{},"kvs":[{"key":"YQ==","create_revision":"5","mod_revision":"5","version":"1","value":"eA=="}],"count":"1"}}]}"#,
        )
        .unwrap();
        assert!(!txn.succeeded, "left out when false");
        let range = &txn.responses[0].response_range;
        assert_eq!((range.count, range.kvs[0].create_revision), (1, 5));
        assert_eq!(range.kvs[0].value, "eA==");
        let grant: LeaseGrantResponse =
            serde_json::from_str(r#"{"header":{},"ID":"7587883","TTL":"10"}"#).unwrap();
        assert_eq!(grant.id, 7587883);
        let expired: KeepAliveResponse =
            serde_json::from_str(r#"{"result":{"header":{},"ID":"7587883"}}"#).unwrap();
        assert_eq!(expired.result.ttl, 0);
        let put: PutResponse = serde_json::from_str(r#"{"header":{"revision":9}}"#).unwrap();
        assert_eq!(put.header.revision, 9);
        assert!(serde_json::from_str::<PutResponse>(r#"{"header":{"revision":"x"}}"#).is_err());
    }
}

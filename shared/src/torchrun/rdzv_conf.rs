//! `--rdzv-conf key=value,...`, parsed and range-checked once, with torchrun's
//! defaults. Keys toporun does not use are kept (torchrun ignores what its backend
//! does not read).

use super::values::{seconds, OptionsError};
use crate::flags::torch_bool;
use std::collections::BTreeMap;
use std::time::Duration;

/// How etcd is reached (`protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EtcdProtocol {
    #[default]
    Http,
    Https,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RdzvConf {
    pub join_timeout: Duration,
    pub last_call_timeout: Duration,
    pub close_timeout: Duration,
    pub read_timeout: Duration,
    pub keep_alive_interval: Duration,
    pub keep_alive_max_attempt: u32,
    /// c10d: host the store (or not) whatever the endpoint names.
    pub is_host: Option<bool>,
    pub protocol: EtcdProtocol,
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    /// The shared secret that moves the rendezvous keys (`token`).
    pub token: Option<String>,
    /// Every key as given, toporun's own and the rest.
    pub raw: BTreeMap<String, String>,
}

impl Default for RdzvConf {
    fn default() -> RdzvConf {
        RdzvConf {
            join_timeout: Duration::from_secs(600),
            last_call_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(60),
            read_timeout: Duration::from_secs(60),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_max_attempt: 3,
            is_host: None,
            protocol: EtcdProtocol::Http,
            cacert: None,
            cert: None,
            key: None,
            token: None,
            raw: BTreeMap::new(),
        }
    }
}

fn usage(msg: String) -> OptionsError {
    OptionsError::usage(msg)
}

impl RdzvConf {
    /// Parses `k=v,k=v`; every value toporun uses is checked here, before anything
    /// starts.
    pub fn parse(text: &str) -> Result<RdzvConf, OptionsError> {
        let mut c = RdzvConf::default();
        for kv in text.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| usage(format!("--rdzv-conf '{kv}' is not key=value")))?;
            c.set(k, v)?;
            c.raw.insert(k.to_string(), v.to_string());
        }
        Ok(c)
    }

    fn set(&mut self, k: &str, v: &str) -> Result<(), OptionsError> {
        let secs = |v: &str| seconds(&format!("--rdzv-conf {k}"), v);
        let text = |v: &str| (!v.is_empty()).then(|| v.to_string());
        match k {
            "join_timeout" => self.join_timeout = secs(v)?,
            "last_call_timeout" => self.last_call_timeout = secs(v)?,
            "close_timeout" => self.close_timeout = secs(v)?,
            "read_timeout" => self.read_timeout = secs(v)?,
            "keep_alive_interval" => self.keep_alive_interval = secs(v)?,
            "keep_alive_max_attempt" => {
                self.keep_alive_max_attempt = v.parse().map_err(|_| {
                    usage(format!(
                        "--rdzv-conf keep_alive_max_attempt={v}: expected an integer from 0 to {}",
                        u32::MAX
                    ))
                })?
            }
            "is_host" => {
                self.is_host = Some(torch_bool(v).ok_or_else(|| {
                    usage(format!("--rdzv-conf is_host={v}: expected a boolean (1/true/yes or 0/false/no), as torchrun does"))
                })?)
            }
            "protocol" => {
                self.protocol = match v {
                    "" | "http" => EtcdProtocol::Http,
                    "https" => EtcdProtocol::Https,
                    _ => {
                        return Err(usage(format!(
                            "--rdzv-conf protocol={v}: expected http or https"
                        )))
                    }
                }
            }
            "cacert" => self.cacert = text(v),
            "cert" => self.cert = text(v),
            "key" => self.key = text(v),
            "token" => self.token = text(v),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_torchruns() {
        let c = RdzvConf::parse("").unwrap();
        assert_eq!(c.join_timeout, Duration::from_secs(600));
        assert_eq!(c.last_call_timeout, Duration::from_secs(30));
        assert_eq!(c.keep_alive_max_attempt, 3);
        assert_eq!(c.is_host, None);
    }

    #[test]
    fn values_are_typed_and_unknown_keys_kept() {
        let c = RdzvConf::parse("join_timeout=10, is_host=False,protocol=https,timeout=5").unwrap();
        assert_eq!(c.join_timeout, Duration::from_secs(10));
        assert_eq!(c.is_host, Some(false));
        assert_eq!(c.protocol, EtcdProtocol::Https);
        assert_eq!(c.raw["timeout"], "5");
    }

    #[test]
    fn bad_values_are_usage_errors_naming_the_key() {
        for (conf, needle) in [
            ("join_timeout=soon", "join_timeout=soon"),
            ("is_host=maybe", "is_host=maybe"),
            ("protocol=ftp", "protocol=ftp"),
            ("keep_alive_max_attempt=-1", "keep_alive_max_attempt=-1"),
            ("novalue", "'novalue' is not key=value"),
        ] {
            let e = RdzvConf::parse(conf).unwrap_err();
            assert!(
                e.usage && e.message.contains(needle),
                "{conf}: {}",
                e.message
            );
        }
    }
}

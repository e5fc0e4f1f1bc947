//! `host[:port]` endpoints, IPv6 as `[::1]:port` (torch elastic/rendezvous/utils.py).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: Option<u16>,
}

/// Why an endpoint cannot be read; each says the text it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("the endpoint is empty")]
    Empty,
    #[error("'{0}': an IPv6 endpoint needs a closing ']'")]
    Unclosed(String),
    #[error("'{text}': the port '{port}' is not a number from 0 to 65535")]
    Port { text: String, port: String },
    #[error("'{0}': the host is empty")]
    NoHost(String),
}

pub fn parse(text: &str) -> Result<Endpoint, EndpointError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(EndpointError::Empty);
    }
    let (host, port) = if let Some(rest) = t.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| EndpointError::Unclosed(t.to_string()))?;
        (h.to_string(), after.strip_prefix(':'))
    } else if t.matches(':').count() > 1 {
        // A bare IPv6 address: no port can be given without brackets.
        (t.to_string(), None)
    } else {
        match t.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (t.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().map_err(|_| EndpointError::Port {
            text: t.to_string(),
            port: p.to_string(),
        })?),
        None => None,
    };
    if host.is_empty() {
        return Err(EndpointError::NoHost(t.to_string()));
    }
    Ok(Endpoint { host, port })
}

/// Joins host and port, bracketing IPv6 hosts.
pub fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_torch_accepts() {
        assert_eq!(
            parse("node0:29400").unwrap(),
            Endpoint {
                host: "node0".into(),
                port: Some(29400)
            }
        );
        assert_eq!(parse("node0").unwrap().port, None);
        assert_eq!(
            parse("[::1]:29400").unwrap(),
            Endpoint {
                host: "::1".into(),
                port: Some(29400)
            }
        );
        assert_eq!(parse("::1").unwrap().host, "::1");
        assert!(parse("host:http")
            .unwrap_err()
            .to_string()
            .contains("not a number"));
        assert!(parse("[::1:5").is_err());
        assert_eq!(join("::1", 5), "[::1]:5");
    }
}

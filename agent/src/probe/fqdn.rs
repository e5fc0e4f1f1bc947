//! The host name torch's failure summary prints: Python's `socket.getfqdn()`, i.e. the
//! name the host's first address maps back to (`localhost` where the hostname resolves
//! to 127.0.0.1), else the hostname itself. Looked up only when a summary is printed,
//! so a slow resolver never delays a start.

/// `socket.getfqdn(hostname)`.
pub fn fqdn(hostname: &str) -> String {
    let Some(addr) = dns_lookup::lookup_host(hostname)
        .ok()
        .and_then(|mut a| a.next())
    else {
        return hostname.to_string();
    };
    dns_lookup::lookup_addr(&addr).unwrap_or_else(|_| hostname.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unresolvable_name_is_returned_as_is() {
        assert_eq!(fqdn("no-such-host.invalid"), "no-such-host.invalid");
    }
}

//! Which hosts one dispatch may reach: its `allowed_hosts` entries (a name
//! or `*.suffix`, with the port an entry names), and which TLS SNI a
//! tunnel to an allowed host may carry.

use std::net::IpAddr;
use std::sync::OnceLock;

use super::parse::{self, parse_authority};
use super::refusal::Refusal;

/// Ports a `CONNECT` or plain request may use unless an entry names another.
const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// One `allowed_hosts` entry: a name or `*.suffix`, and the port it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pattern: String,
    port: Option<u16>,
}

impl Entry {
    pub(crate) fn parse(raw: &str) -> Option<Entry> {
        let raw = raw.trim();
        let (wild, rest) = match raw.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, raw),
        };
        let a = parse_authority(rest).ok()?;
        let pattern = if wild {
            format!("*.{}", a.host)
        } else {
            a.host
        };
        Some(Entry {
            pattern,
            port: a.port,
        })
    }

    pub(crate) fn matches_host(&self, host: &str) -> bool {
        match self.pattern.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => self.pattern == host,
        }
    }

    pub(crate) fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }
}

/// The hosts one dispatch may reach; set once, when `/env` passes the gateway.
#[derive(Debug, Default)]
pub(crate) struct AllowList(OnceLock<Vec<Entry>>);

impl AllowList {
    pub(crate) fn set(&self, hosts: Vec<String>) {
        let entries = hosts.iter().filter_map(|h| Entry::parse(h)).collect();
        let _ = self.0.set(entries);
    }

    /// Whether `host` (normalized) may be reached on `port`.
    pub(super) fn check(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let host = parse::normalize_host(host);
        let matching: Vec<&Entry> = self
            .0
            .get()
            .map(|l| l.iter().filter(|e| e.matches_host(&host)).collect())
            .unwrap_or_default();
        if matching.is_empty() {
            return Err(Refusal::NotAllowed(host));
        }
        if !matching.iter().any(|e| e.allows_port(port)) {
            return Err(Refusal::PortNotAllowed(host, port));
        }
        Ok(())
    }
}

/// A tunnel to `host` may carry the SNI `host` only; an IP-literal target
/// (which TLS can't name) may also carry none.
pub(super) fn sni_allowed(host: &str, sni: Option<&str>) -> bool {
    match sni {
        Some(s) => s == host,
        None => host.parse::<IpAddr>().is_ok(),
    }
}

//! The egress proxy: the only way a sandbox's tools reach the network.
//!
//! An HTTP forward proxy on a Unix socket mounted into the sandbox (the agent
//! relays `HTTP_PROXY`/`HTTPS_PROXY` connections from the sandbox's loopback
//! to it). It speaks `CONNECT host:port` (TLS tunnels) and absolute-form
//! plain HTTP requests. A destination is allowed only when
//! - its host name matches the dispatch's `allowed_hosts` (exact, or
//!   `*.example.com` for any subdomain) and its port is 443 or 80, or the
//!   port the matching entry names as `host:port`;
//! - every address it resolves to is public (see [`is_public`]) and none is
//!   one of this host's own, unless the operator allows that internal range
//!   (`ASBX_ALLOW_INTERNAL`), so an allowed name can't be pointed inside;
//! - a plain request's `Host` header names its target, and a tunnel's TLS
//!   ClientHello names the `CONNECT` host as its SNI (no domain fronting).
//!
//! Policy refusals are `403` problem+json with a stable `code`; an upstream
//! that can't be reached is `502`. Connections get a connect timeout and an
//! idle timeout and end with their session. The list comes from the
//! workspace's `/env` answer as the gateway relays it, never from the sandbox.
//!
//! Secrets bound to hosts ([`inject`]): the proxy sets their headers on
//! requests to those hosts (terminating TLS for them only) and refuses a
//! request that carries their placeholder anywhere else.

pub(crate) mod inject;
mod intercept;
mod note;
pub mod parse;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use asbx_protocol::{Problem, ProblemCode};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;

use self::note::{Note, SNI_REFUSED, content_length};
use self::parse::{ClientHello, client_hello_sni, host_header_matches, parse_authority};

/// Ports a `CONNECT` or plain request may use unless an entry names another.
const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// One `allowed_hosts` entry: a name or `*.suffix`, and the port it names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
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
    fn check(&self, host: &str, port: u16) -> Result<(), Refusal> {
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

/// Name resolution, pluggable so tests can map names to their own servers.
pub(crate) trait Resolve: Send + Sync + std::fmt::Debug {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`getaddrinfo`).
#[derive(Debug)]
pub(crate) struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// An address range, `10.0.0.0/8` or `fd00::/8` (a bare address is `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = a.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max)?,
            None => max,
        };
        Some(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }
}

/// The operator's egress settings, shared by every dispatch.
#[derive(Debug, Clone)]
pub(crate) struct EgressSettings {
    pub(crate) resolver: Arc<dyn Resolve>,
    /// Internal ranges the operator lets sandboxes reach anyway.
    pub(crate) allow_internal: Arc<[Cidr]>,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// The operator's extra CA for upstream TLS (`ASBX_EGRESS_EXTRA_CA`).
    pub(crate) extra_ca: Option<std::path::PathBuf>,
    /// Upstream TLS for bound hosts, loaded on first use.
    tls: Arc<OnceLock<Result<inject::UpstreamTls, String>>>,
}

impl EgressSettings {
    pub(crate) fn new(allow_internal: Vec<Cidr>) -> Self {
        EgressSettings {
            resolver: Arc::new(SystemResolver),
            allow_internal: allow_internal.into(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            extra_ca: None,
            tls: Arc::default(),
        }
    }

    /// With `ASBX_EGRESS_EXTRA_CA`.
    pub(crate) fn with_extra_ca(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.extra_ca = path;
        self.tls = Arc::default();
        self
    }

    /// The TLS the proxy speaks to bound hosts (the host's trust store plus
    /// the operator's extra CA), read once per runner.
    pub(crate) fn upstream_tls(&self) -> Result<&inject::UpstreamTls, String> {
        self.tls
            .get_or_init(|| inject::UpstreamTls::load(self.extra_ca.as_deref()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Refuses an address that is not public or is this host's own, unless
    /// the operator allows its range.
    pub(crate) fn check_addr(&self, host: &str, ip: IpAddr) -> Result<(), Refusal> {
        if self.allow_internal.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        if !is_public(ip) || is_own_address(ip) {
            return Err(Refusal::Internal(host.to_owned(), ip));
        }
        Ok(())
    }

    /// Resolves `host` once and checks every address: a name with one
    /// internal record is refused whole, so a resolver can't be raced into
    /// handing out the internal one. Callers connect to these addresses
    /// only (pinned), never resolve again.
    pub(crate) async fn resolve_checked(
        &self,
        host: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::time::timeout(self.connect_timeout, self.resolver.resolve(host, port))
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| Refusal::Resolve(host.to_owned()))?,
        };
        if addrs.is_empty() {
            return Err(Refusal::Resolve(host.to_owned()));
        }
        for a in &addrs {
            self.check_addr(host, a.ip())?;
        }
        Ok(addrs)
    }
}

/// Whether `ip` is one of this host's interface addresses.
fn is_own_address(ip: IpAddr) -> bool {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        // Can't tell: count it as own, so the check fails closed.
        return true;
    };
    addrs.filter_map(|a| a.address).any(|a| {
        a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())) == Some(ip)
            || a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip())) == Some(ip)
    })
}

/// Whether `ip` is a public unicast address a sandbox may reach.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return is_public_v4(v4); // ::ffff:0:0/96
    }
    let s = v6.segments();
    if s[0] == 0x2002 {
        // 6to4: the embedded v4 decides.
        let o = v6.octets();
        return is_public_v4(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    !(s[..6] == [0; 6] // IPv4-compatible ::/96, with :: and ::1
        || v6.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10
        || (s[0] == 0x64 && s[1] == 0xff9b && s[2] <= 1) // NAT64 64:ff9b::/96, 64:ff9b:1::/48
        || (s[0] == 0x100 && s[1..4] == [0; 3]) // discard 100::/64
        || (s[0] == 0x2001 && s[1] == 0) // Teredo 2001::/32
        || (s[0] == 0x2001 && (s[1] & 0xfff0) == 0x10) // ORCHID 2001:10::/28
        || (s[0] == 0x2001 && s[1] == 2 && s[2] == 0) // benchmarking 2001:2::/48
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || (s[0] & 0xe000) != 0x2000) // outside global unicast 2000::/3
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 192 && o[1] == 0 && o[2] == 2) // TEST-NET-1
        || (o[0] == 198 && o[1] == 51 && o[2] == 100) // TEST-NET-2
        || (o[0] == 203 && o[1] == 0 && o[2] == 113) // TEST-NET-3
        || (o[0] == 192 && o[1] == 88 && o[2] == 99) // 6to4 relay anycast
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18/15
        || o[0] >= 240) // reserved 240/4 and broadcast
}

/// Why the proxy refused a request or could not serve it.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum Refusal {
    #[error("host {0} is not in this sandbox's allowed hosts")]
    NotAllowed(String),
    #[error(
        "port {1} is not allowed for {0}: 443 and 80 only, unless an allowed entry names the port"
    )]
    PortNotAllowed(String, u16),
    #[error("host {0} resolves to an internal address {1}")]
    Internal(String, IpAddr),
    #[error("the Host header {host:?} does not name the request's target {target}")]
    HostMismatch { target: String, host: String },
    #[error("could not resolve {0}")]
    Resolve(String),
    #[error("bad proxy request: {0}")]
    Bad(String),
    #[error("could not connect to {0}: {1}")]
    Connect(String, String),
    #[error("the request carries the placeholder of secret {name}, which is not bound to {host}")]
    SecretPlaceholder { host: String, name: String },
    #[error("TLS to {0} failed: {1}")]
    UpstreamTls(String, String),
}

impl Refusal {
    pub(crate) fn problem(&self) -> Problem {
        let (status, code, title) = match self {
            Refusal::NotAllowed(_) => (403, ProblemCode::EgressHostNotAllowed, "Host not allowed"),
            Refusal::PortNotAllowed(..) => {
                (403, ProblemCode::EgressPortNotAllowed, "Port not allowed")
            }
            Refusal::Internal(..) => (403, ProblemCode::EgressInternalAddress, "Internal address"),
            Refusal::HostMismatch { .. } => {
                (403, ProblemCode::EgressHostMismatch, "Host header mismatch")
            }
            Refusal::Bad(_) => (400, ProblemCode::InvalidRequest, "Bad proxy request"),
            Refusal::Resolve(_) => (
                502,
                ProblemCode::UpstreamUnresolvable,
                "Upstream not resolvable",
            ),
            Refusal::Connect(..) => (
                502,
                ProblemCode::UpstreamUnreachable,
                "Upstream unreachable",
            ),
            Refusal::SecretPlaceholder { .. } => (
                403,
                ProblemCode::SecretPlaceholder,
                "Secret placeholder to another host",
            ),
            Refusal::UpstreamTls(..) => {
                (502, ProblemCode::UpstreamTlsFailed, "Upstream TLS failed")
            }
        };
        Problem::of(status, code, title, self.to_string())
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        tracing::debug!(refusal = %self, "egress refused");
        crate::error::problem_response(&self.problem())
    }
}

/// The TLS alert a tunnel gets when its SNI is refused: fatal, access_denied.
pub(crate) const ALERT_ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// One dispatch's proxy: its allow list and the operator's settings.
#[derive(Debug)]
pub(crate) struct Egress {
    pub(crate) allow: Arc<AllowList>,
    /// The secrets bound to hosts, set with the allow list (none: nothing
    /// is intercepted or scanned).
    pub(crate) inject: Arc<OnceLock<inject::Injections>>,
    pub(crate) settings: EgressSettings,
    pub(crate) stop: CancellationToken,
    /// Where each request is reported (`crate::audit`); `None` when the
    /// dispatch carried no audit token.
    pub(crate) audit: Option<Arc<crate::audit::AuditLog>>,
}

impl Egress {
    /// Reports one request to the audit log, if there is one.
    pub(crate) fn note(&self, n: Note<'_>) {
        let Some(audit) = &self.audit else {
            return;
        };
        audit.push(asbx_protocol::audit::AuditEvent::Egress {
            host: n.host.to_owned(),
            port: n.port,
            method: n.method.map(str::to_owned),
            bytes_out: n.bytes_out,
            bytes_in: n.bytes_in,
            allowed: n.refused.is_none(),
            code: n.refused.map(str::to_owned),
            secret: n.secret.map(str::to_owned),
        });
    }

    async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, Refusal> {
        self.allow.check(host, port)?;
        let addrs = self.settings.resolve_checked(host, port).await?;
        let mut last = String::from("no address");
        for a in addrs {
            match tokio::time::timeout(self.settings.connect_timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "connect timed out".to_owned(),
            }
        }
        Err(Refusal::Connect(host.to_owned(), last))
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response {
        let connect = req.method() == Method::CONNECT;
        // For the audit log: where it went, read before the request is taken.
        let target = self.audit.as_ref().map(|_| {
            let a = req
                .uri()
                .authority()
                .and_then(|a| parse_authority(a.as_str()).ok());
            let host = a
                .as_ref()
                .map(|a| parse::normalize_host(&a.host))
                .unwrap_or_default();
            let port = a.and_then(|a| a.port).unwrap_or(80);
            (
                host,
                port,
                req.method().as_str().to_owned(),
                content_length(req.headers()),
            )
        });
        let res = if connect {
            Arc::clone(&self).tunnel(req).await
        } else {
            Arc::clone(&self).forward_plain(req).await
        };
        // A tunnel is counted allowed once its SNI passes (`splice_tls`).
        if res.is_err() || !connect {
            crate::metrics::METRICS.egress(res.is_ok());
        }
        if let Some((host, port, method, bytes_out)) = &target {
            let refused = res.as_ref().err().map(|r| r.problem().code);
            // An allowed tunnel is reported when it closes.
            if refused.is_some() || !connect {
                let bytes_in = res.as_ref().map_or(0, |r| content_length(r.headers()));
                self.note(Note {
                    host,
                    port: *port,
                    method: Some(method),
                    bytes_out: *bytes_out,
                    bytes_in,
                    refused: refused.as_deref(),
                    secret: None,
                });
            }
        }
        res.unwrap_or_else(IntoResponse::into_response)
    }

    async fn tunnel(self: Arc<Self>, req: Request<Incoming>) -> Result<Response, Refusal> {
        let target = req
            .uri()
            .authority()
            .ok_or_else(|| Refusal::Bad("CONNECT needs host:port".into()))?
            .as_str()
            .to_owned();
        let a = parse_authority(&target).map_err(|e| Refusal::Bad(e.to_string()))?;
        let port = a
            .port
            .ok_or_else(|| Refusal::Bad("CONNECT needs a port".into()))?;
        let upstream = self.connect(&a.host, port).await?;
        let host = parse::normalize_host(&a.host);
        let bound = self.inject.get().is_some_and(|i| i.binds(&host, port));
        tokio::spawn(async move {
            let upgraded = tokio::select! {
                u = hyper::upgrade::on(req) => u,
                _ = self.stop.cancelled() => return,
            };
            match upgraded {
                Ok(upgraded) if bound => {
                    intercept::serve(self, TokioIo::new(upgraded), upstream, host, port).await
                }
                Ok(upgraded) => {
                    self.splice_tls(TokioIo::new(upgraded), upstream, &host)
                        .await
                }
                Err(e) => tracing::debug!(error = %e, "egress upgrade failed"),
            }
        });
        Ok(StatusCode::OK.into_response())
    }

    /// Reads the tunnel's first TLS record, refuses it unless its SNI is the
    /// `CONNECT` host, then relays both ways until idle, closed or stopped.
    async fn splice_tls<C>(&self, mut client: C, mut upstream: TcpStream, host: &str)
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let mut buf = Vec::with_capacity(1024);
        let verdict = loop {
            match client_hello_sni(&buf) {
                Ok(ClientHello::Incomplete { needed }) => {
                    let old = buf.len();
                    buf.resize(needed, 0);
                    let read = tokio::select! {
                        r = tokio::time::timeout(self.settings.connect_timeout, client.read(&mut buf[old..])) => r,
                        _ = self.stop.cancelled() => return,
                    };
                    match read {
                        Ok(Ok(n)) if n > 0 => buf.truncate(old + n),
                        _ => return,
                    }
                }
                Ok(ClientHello::Sni(sni)) => break sni_allowed(host, Some(&sni)),
                Ok(ClientHello::NoSni) => break sni_allowed(host, None),
                Err(e) => {
                    tracing::debug!(error = %e, host, "egress tunnel is not TLS");
                    break false;
                }
            }
        };
        crate::metrics::METRICS.egress(verdict);
        let port = upstream.peer_addr().map_or(0, |a| a.port());
        let mut note = Note {
            host,
            port,
            method: Some("CONNECT"),
            bytes_out: 0,
            bytes_in: 0,
            refused: None,
            secret: None,
        };
        if !verdict {
            tracing::debug!(
                host,
                "egress refused: TLS SNI does not name the CONNECT host"
            );
            let _ = client.write_all(&ALERT_ACCESS_DENIED).await;
            let _ = client.shutdown().await;
            note.refused = Some(SNI_REFUSED);
            self.note(note);
            return;
        }
        if upstream.write_all(&buf).await.is_err() {
            return;
        }
        let (up, down) = relay(client, upstream, self.settings.idle_timeout, &self.stop).await;
        note.bytes_out = up + buf.len() as u64;
        note.bytes_in = down;
        self.note(note);
    }

    async fn forward_plain(self: Arc<Self>, req: Request<Incoming>) -> Result<Response, Refusal> {
        let mut req = req.map(Body::new);
        let uri = req.uri().clone();
        if uri.scheme_str() != Some("http") {
            return Err(Refusal::Bad("only absolute http:// URLs or CONNECT".into()));
        }
        let target = uri
            .authority()
            .ok_or_else(|| Refusal::Bad("no host".into()))?
            .as_str()
            .to_owned();
        let a = parse_authority(&target).map_err(|e| Refusal::Bad(e.to_string()))?;
        if let Some(h) = req.headers().get(hyper::header::HOST) {
            let h = h
                .to_str()
                .map_err(|_| Refusal::Bad("bad Host header".into()))?;
            if !host_header_matches(&target, h, 80).unwrap_or(false) {
                return Err(Refusal::HostMismatch {
                    target,
                    host: h.chars().take(256).collect(),
                });
            }
        }
        let port = a.port.unwrap_or(80);
        if let Some(inj) = self.inject.get() {
            let host = parse::normalize_host(&a.host);
            intercept::check_head(inj, &host, port, req.uri(), req.headers())?;
            let body = std::mem::replace(req.body_mut(), Body::empty());
            *req.body_mut() = intercept::scan_body(inj, &host, port, body).await?;
            for name in inj.apply(&host, port, req.headers_mut()) {
                tracing::debug!(host = %host, secret = name, "egress: secret header set");
            }
        }
        let stream = self.connect(&a.host, port).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Refusal::Connect(a.host.clone(), e.to_string()))?;
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_owned();
        *req.uri_mut() = path.parse().map_err(|_| Refusal::Bad("bad path".into()))?;
        if let Ok(v) = hyper::header::HeaderValue::from_str(&target) {
            req.headers_mut().insert(hyper::header::HOST, v);
        }
        req.headers_mut().remove("proxy-authorization");
        req.headers_mut().remove("proxy-connection");
        let res = tokio::time::timeout(self.settings.idle_timeout, sender.send_request(req))
            .await
            .map_err(|_| Refusal::Connect(a.host.clone(), "no answer".into()))?
            .map_err(|e| Refusal::Connect(a.host, e.to_string()))?;
        Ok(res.map(Body::new))
    }
}

/// A tunnel to `host` may carry the SNI `host` only; an IP-literal target
/// (which TLS can't name) may also carry none.
fn sni_allowed(host: &str, sni: Option<&str>) -> bool {
    match sni {
        Some(s) => s == host,
        None => host.parse::<IpAddr>().is_ok(),
    }
}

/// Copies both ways until either side closes, nothing moves for `idle`, or
/// `stop` is cancelled; the bytes moved each way (client to upstream,
/// upstream to client).
async fn relay<C>(
    client: C,
    upstream: TcpStream,
    idle: Duration,
    stop: &CancellationToken,
) -> (u64, u64)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (sent, received) = (AtomicU64::new(0), AtomicU64::new(0));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let up = copy_noting(&mut cr, &mut uw, &last, start, &sent);
    let down = copy_noting(&mut ur, &mut cw, &last, start, &received);
    let watchdog = async {
        loop {
            tokio::time::sleep(idle / 4).await;
            let since = start
                .elapsed()
                .saturating_sub(Duration::from_millis(last.load(Ordering::Relaxed)));
            if since >= idle {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = watchdog => tracing::debug!("egress tunnel idle, closed"),
        _ = stop.cancelled() => {}
    }
    (
        sent.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
    )
}

/// Copies `r` to `w`, noting when bytes last moved and adding each read's
/// length to `total` (one add per read, not per byte).
async fn copy_noting<R, W>(
    r: &mut R,
    w: &mut W,
    last: &AtomicU64,
    start: Instant,
    total: &AtomicU64,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        total.fetch_add(n as u64, Ordering::Relaxed);
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}

/// Serves the proxy on `listener` until `egress.stop` is cancelled.
pub(crate) fn spawn(listener: UnixListener, egress: Arc<Egress>) {
    let listener = crate::limit::LimitedListener::new(listener, crate::limit::MAX_CONNECTIONS);
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = egress.stop.cancelled() => return,
                accepted = listener.accept_limited() => match accepted {
                    Ok(s) => s,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let egress = Arc::clone(&egress);
            tokio::spawn(async move {
                let stop = egress.stop.clone();
                let idle = egress.settings.idle_timeout;
                let svc = service_fn(move |req| {
                    let egress = Arc::clone(&egress);
                    async move { Ok::<_, Infallible>(egress.handle(req).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .header_read_timeout(idle)
                    .timer(hyper_util::rt::TokioTimer::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades();
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
}

/// One egress proxy outside any dispatch, for `asbx-bench`: the same code
/// a sandbox's proxy runs, with its allow list and bound secrets given.
pub mod standalone {
    use std::path::PathBuf;
    use std::sync::{Arc, OnceLock};

    use asbx_protocol::callback::InjectedSecret;
    use tokio::net::UnixListener;
    use tokio_util::sync::CancellationToken;

    use super::{AllowList, Cidr, Egress, EgressSettings, inject::Injections};

    /// A running proxy; dropping it stops it.
    #[derive(Debug)]
    pub struct Proxy {
        stop: CancellationToken,
        /// The proxy's CA certificate (PEM) when secrets are bound.
        pub ca_pem: Option<String>,
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    /// Serves a proxy on `listener` (inside a Tokio runtime).
    pub fn serve(
        listener: UnixListener,
        allowed_hosts: Vec<String>,
        secrets: &[InjectedSecret],
        allow_internal: Vec<Cidr>,
        extra_ca: Option<PathBuf>,
    ) -> Result<Proxy, String> {
        let allow = Arc::new(AllowList::default());
        let inject = Arc::new(OnceLock::new());
        let mut hosts = allowed_hosts;
        let mut ca_pem = None;
        if let Some(inj) = Injections::new(secrets)? {
            hosts.extend(inj.hosts().map(str::to_owned));
            ca_pem = Some(inj.ca_pem().to_owned());
            let _ = inject.set(inj);
        }
        allow.set(hosts);
        let stop = CancellationToken::new();
        let egress = Arc::new(Egress {
            allow,
            inject,
            settings: EgressSettings::new(allow_internal).with_extra_ca(extra_ca),
            stop: stop.clone(),
            audit: None,
        });
        super::spawn(listener, egress);
        Ok(Proxy { stop, ca_pem })
    }
}

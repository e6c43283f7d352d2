//! The egress proxy: the only way a sandbox's tools reach the network.
//!
//! An HTTP forward proxy on a Unix socket mounted into the sandbox (the agent
//! relays `HTTP_PROXY`/`HTTPS_PROXY` connections from the sandbox's loopback
//! to it). It speaks `CONNECT host:port` (HTTPS and anything tunnelled) and
//! absolute-form plain HTTP requests. A destination is allowed only when
//! - its host name matches the dispatch's `allowed_hosts` (exact, or
//!   `*.example.com` for any subdomain), and
//! - every address it resolves to is public: loopback, private, link-local
//!   (cloud metadata), CGNAT, multicast, reserved and unspecified ranges are
//!   refused, so an allowed name can't be pointed at the host or its network.
//!
//! The list comes from the workspace's `/env` answer as the gateway relays
//! it, never from the sandbox.

pub mod parse;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;

/// The hosts one dispatch may reach; set once, when `/env` passes the gateway.
#[derive(Debug, Default)]
pub(crate) struct AllowList(OnceLock<Vec<String>>);

impl AllowList {
    pub(crate) fn set(&self, hosts: Vec<String>) {
        let hosts = hosts
            .into_iter()
            .map(|h| normalize(&h))
            .filter(|h| !h.is_empty())
            .collect();
        let _ = self.0.set(hosts);
    }

    pub(crate) fn allows(&self, host: &str) -> bool {
        let host = normalize(host);
        self.0.get().is_some_and(|list| {
            list.iter().any(|pat| match pat.strip_prefix("*.") {
                Some(suffix) => {
                    host.len() > suffix.len() + 1
                        && host.ends_with(suffix)
                        && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
                }
                None => *pat == host,
            })
        })
    }
}

fn normalize(h: &str) -> String {
    h.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `ip` is a public unicast address a sandbox may reach.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64
                || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
                || v6 == Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1))
        }
    }
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
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18/15
        || o[0] >= 240) // reserved
}

#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("host {0} is not in this sandbox's allowed hosts")]
    NotAllowed(String),
    #[error("host {0} resolves to a non-public address {1}")]
    Internal(String, IpAddr),
    #[error("could not resolve {0}")]
    Resolve(String),
    #[error("bad proxy request: {0}")]
    Bad(String),
    #[error("could not connect to {0}: {1}")]
    Connect(String, std::io::Error),
}

impl Refusal {
    fn status(&self) -> StatusCode {
        match self {
            Refusal::NotAllowed(_) | Refusal::Internal(..) => StatusCode::FORBIDDEN,
            Refusal::Bad(_) => StatusCode::BAD_REQUEST,
            Refusal::Resolve(_) | Refusal::Connect(..) => StatusCode::BAD_GATEWAY,
        }
    }
}

/// Resolves and connects, refusing names outside the allow list and
/// addresses that are not public.
async fn connect(allow: &AllowList, host: &str, port: u16) -> Result<TcpStream, Refusal> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if !allow.allows(host) {
        return Err(Refusal::NotAllowed(host.to_owned()));
    }
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| Refusal::Resolve(host.to_owned()))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Refusal::Resolve(host.to_owned()));
    }
    // Every address must be public: a name with one internal record is refused
    // whole, so a resolver can't be raced into handing out the internal one.
    if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
        return Err(Refusal::Internal(host.to_owned(), bad.ip()));
    }
    let mut last = None;
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(Refusal::Connect(
        host.to_owned(),
        last.unwrap_or_else(|| std::io::Error::other("no address")),
    ))
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

fn text(status: StatusCode, msg: String) -> Response<ProxyBody> {
    let mut res = Response::new(
        Full::new(Bytes::from(msg + "\n"))
            .map_err(|e| match e {})
            .boxed(),
    );
    *res.status_mut() = status;
    res.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    res
}

async fn handle(
    allow: Arc<AllowList>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, hyper::Error> {
    let res = if req.method() == Method::CONNECT {
        tunnel(allow, req).await
    } else {
        forward_plain(allow, req).await
    };
    Ok(res.unwrap_or_else(|refusal| {
        tracing::debug!(%refusal, "egress refused");
        text(refusal.status(), refusal.to_string())
    }))
}

async fn tunnel(
    allow: Arc<AllowList>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    let authority = req
        .uri()
        .authority()
        .ok_or_else(|| Refusal::Bad("CONNECT needs host:port".into()))?
        .clone();
    let port = authority
        .port_u16()
        .ok_or_else(|| Refusal::Bad("CONNECT needs a port".into()))?;
    let mut upstream = connect(&allow, authority.host(), port).await?;
    tokio::spawn(async move {
        match hyper::upgrade::on(req).await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
            Err(e) => tracing::debug!(error = %e, "egress upgrade failed"),
        }
    });
    Ok(Response::new(
        http_body_util::Empty::new().map_err(|e| match e {}).boxed(),
    ))
}

async fn forward_plain(
    allow: Arc<AllowList>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    let uri = req.uri().clone();
    if uri.scheme_str() != Some("http") {
        return Err(Refusal::Bad("only absolute http:// URLs or CONNECT".into()));
    }
    let host = uri
        .host()
        .ok_or_else(|| Refusal::Bad("no host".into()))?
        .to_owned();
    let port = uri.port_u16().unwrap_or(80);
    let stream = connect(&allow, &host, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| Refusal::Connect(host.clone(), std::io::Error::other(e)))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_owned();
    *req.uri_mut() = path.parse().map_err(|_| Refusal::Bad("bad path".into()))?;
    req.headers_mut().remove("proxy-authorization");
    req.headers_mut().remove("proxy-connection");
    let res = sender
        .send_request(req)
        .await
        .map_err(|e| Refusal::Connect(host, std::io::Error::other(e)))?;
    Ok(res.map(|b| b.boxed()))
}

/// Serves the proxy on `listener` until `stop` is cancelled.
pub(crate) fn spawn(listener: UnixListener, allow: Arc<AllowList>, stop: CancellationToken) {
    let listener = crate::limit::LimitedListener::new(listener, crate::limit::MAX_CONNECTIONS);
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept_limited() => match accepted {
                    Ok(s) => s,
                    Err(_) => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                },
            };
            let allow = Arc::clone(&allow);
            let stop = stop.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(Arc::clone(&allow), req));
                let conn = hyper::server::conn::http1::Builder::new()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_matches_exact_and_subdomains_only() {
        let a = AllowList::default();
        a.set(vec!["PyPI.org.".into(), "*.example.com".into()]);
        assert!(a.allows("pypi.org"));
        assert!(a.allows("files.example.com"));
        assert!(a.allows("a.b.example.com"));
        assert!(!a.allows("example.com"));
        assert!(!a.allows("evilexample.com"));
        assert!(!a.allows("pypi.org.evil.net"));
        assert!(!AllowList::default().allows("pypi.org"), "default: nothing");
    }

    #[test]
    fn internal_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} counted as public");
        }
        for ip in ["1.1.1.1", "151.101.0.223", "2606:4700::1111"] {
            assert!(is_public(ip.parse().unwrap()), "{ip} counted as internal");
        }
    }

    #[tokio::test]
    async fn allowed_names_pointing_inside_are_refused() {
        let a = AllowList::default();
        a.set(vec!["localhost".into(), "127.0.0.1".into()]);
        assert!(matches!(
            connect(&a, "localhost", 80).await,
            Err(Refusal::Internal(..))
        ));
        assert!(matches!(
            connect(&a, "127.0.0.1", 80).await,
            Err(Refusal::Internal(..))
        ));
        assert!(matches!(
            connect(&a, "pypi.org", 443).await,
            Err(Refusal::NotAllowed(_))
        ));
    }
}

//! The egress proxy: the only way a sandbox's tools reach the network.
//!
//! An HTTP forward proxy on a Unix socket mounted into the sandbox (the agent
//! relays `HTTP_PROXY`/`HTTPS_PROXY` connections from the sandbox's loopback
//! to it). It speaks `CONNECT host:port` (TLS tunnels) and absolute-form
//! plain HTTP requests. A destination is allowed only when
//! - its host name matches the dispatch's `allowed_hosts` (exact, or
//!   `*.example.com` for any subdomain) and its port is 443 or 80, or the
//!   port the matching entry names as `host:port`;
//! - every address it resolves to is public (see [`address::is_public`]) and none is
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

mod address;
mod allow;
pub(crate) mod inject;
mod intercept;
mod note;
pub mod parse;
mod refusal;
mod relay;
mod settings;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;

pub use self::address::Cidr;
pub(crate) use self::allow::AllowList;
use self::allow::sni_allowed;
use self::note::{Note, SNI_REFUSED, content_length};
use self::parse::{ClientHello, client_hello_sni, host_header_matches, parse_authority};
pub(crate) use self::refusal::Refusal;
use self::relay::relay;
pub(crate) use self::settings::EgressSettings;

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

impl intercept::Proxy for Egress {
    fn injections(&self) -> Option<&inject::Injections> {
        self.inject.get()
    }

    fn settings(&self) -> &EgressSettings {
        &self.settings
    }

    fn stop(&self) -> &CancellationToken {
        &self.stop
    }

    fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = Result<TcpStream, Refusal>> + Send {
        Egress::connect(self, host, port)
    }

    fn note(&self, n: Note<'_>) {
        Egress::note(self, n)
    }
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

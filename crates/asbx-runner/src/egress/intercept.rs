//! The proxy's side of a tunnel to a host a secret is bound to: it ends the
//! sandbox's TLS with a certificate from the sandbox's CA (the ClientHello's
//! SNI must still name the `CONNECT` host), serves HTTP/1.1 on it, sets the
//! secret's header on each request and sends it on over its own TLS
//! connection to the host, verified as any client would (the host's trust
//! store and the operator's extra CA). Bodies stream both ways; only the
//! first [`BODY_SCAN_BYTES`] of a request body are read ahead, to look for
//! another secret's placeholder.
//!
//! Plain HTTP requests use [`check_head`] and [`scan_body`] too.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{HeaderMap, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;

use tokio_util::sync::CancellationToken;

use super::allow::sni_allowed;
use super::inject::{BODY_SCAN_BYTES, Injections};
use super::note::{Note, SNI_REFUSED, content_length};
use super::parse::{self, host_header_matches};
use super::refusal::Refusal;
use super::settings::EgressSettings;

/// What an intercepted tunnel needs of the proxy that opened it. The proxy
/// (`super::Egress`) implements it, so this half never names the proxy.
pub(super) trait Proxy: Send + Sync + 'static {
    /// The secrets bound to hosts, once the allow list is set.
    fn injections(&self) -> Option<&Injections>;
    /// The operator's settings (timeouts, upstream TLS).
    fn settings(&self) -> &EgressSettings;
    /// Cancelled when the session ends.
    fn stop(&self) -> &CancellationToken;
    /// A connection to an allowed `host:port`, at a checked address.
    fn connect(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = Result<TcpStream, Refusal>> + Send;
    /// Reports one request to the audit log, if there is one.
    fn note(&self, n: Note<'_>);
}

/// Refuses a request whose target or headers carry the placeholder of a
/// secret not bound to `host:port`.
pub(super) fn check_head(
    inj: &Injections,
    host: &str,
    port: u16,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Refusal> {
    match inj.stray_in_head(host, port, uri, headers) {
        Some(name) => Err(Refusal::SecretPlaceholder {
            host: host.to_owned(),
            name: name.to_owned(),
        }),
        None => Ok(()),
    }
}

/// Reads up to [`BODY_SCAN_BYTES`] of `body`, refuses it when they carry
/// the placeholder of a secret not bound to `host:port`, and gives back a
/// body that replays them before the rest (which streams unread).
pub(super) async fn scan_body(
    inj: &Injections,
    host: &str,
    port: u16,
    mut body: Body,
) -> Result<Body, Refusal> {
    use hyper::body::Body as _;
    if body.is_end_stream() {
        return Ok(body);
    }
    let mut frames: Vec<Frame<Bytes>> = Vec::new();
    let mut seen = Vec::new();
    let mut ended = false;
    while seen.len() < BODY_SCAN_BYTES {
        match body.frame().await {
            None => {
                ended = true;
                break;
            }
            Some(Err(e)) => return Err(Refusal::Bad(format!("request body: {e}"))),
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    seen.extend_from_slice(d);
                }
                frames.push(f);
            }
        }
    }
    if let Some(name) = inj.stray(host, port, &seen) {
        return Err(Refusal::SecretPlaceholder {
            host: host.to_owned(),
            name: name.to_owned(),
        });
    }
    if ended && frames.iter().all(Frame::is_data) {
        return Ok(Body::from(seen));
    }
    let head = futures::stream::iter(frames.into_iter().map(Ok::<_, axum::Error>));
    let rest = http_body_util::BodyStream::new(body);
    Ok(Body::new(http_body_util::StreamBody::new(head.chain(rest))))
}

/// The upstream side of one intercepted tunnel: the TLS handshake started
/// beside the sandbox's, then one HTTP/1.1 connection, made again if the
/// host closes it between requests.
enum Upstream {
    Handshake(JoinHandle<Result<TlsStream<TcpStream>, String>>),
    Ready(SendRequest<Body>),
    Failed(String),
}

/// Opens TLS to `host` over `tcp`, verifying its certificate.
async fn connect_tls<P: Proxy>(
    egress: Arc<P>,
    tcp: TcpStream,
    host: String,
) -> Result<TlsStream<TcpStream>, String> {
    let tls = egress.settings().upstream_tls()?;
    let name = rustls_pki_types::ServerName::try_from(host)
        .map_err(|e| format!("bad server name: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&tls.client));
    match tokio::time::timeout(
        egress.settings().connect_timeout,
        connector.connect(name, tcp),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("TLS handshake timed out".to_owned()),
    }
}

impl Upstream {
    /// A sender ready for the next request.
    async fn sender<P: Proxy>(
        &mut self,
        egress: &Arc<P>,
        host: &str,
        port: u16,
    ) -> Result<&mut SendRequest<Body>, Refusal> {
        let fail = |e: String| Refusal::UpstreamTls(host.to_owned(), e);
        let stream = match self {
            Upstream::Failed(e) => return Err(fail(e.clone())),
            Upstream::Handshake(task) => {
                let done = task.await.unwrap_or_else(|e| Err(e.to_string()));
                match done {
                    Ok(s) => Some(s),
                    Err(e) => {
                        *self = Upstream::Failed(e.clone());
                        return Err(fail(e));
                    }
                }
            }
            Upstream::Ready(s) if s.is_closed() => {
                let tcp = egress.connect(host, port).await?;
                Some(
                    connect_tls(Arc::clone(egress), tcp, host.to_owned())
                        .await
                        .map_err(fail)?,
                )
            }
            Upstream::Ready(_) => None,
        };
        if let Some(stream) = stream {
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| Refusal::Connect(host.to_owned(), e.to_string()))?;
            let stop = egress.stop().clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = conn => {}
                    _ = stop.cancelled() => {}
                }
            });
            *self = Upstream::Ready(sender);
        }
        match self {
            Upstream::Ready(s) => {
                s.ready()
                    .await
                    .map_err(|e| Refusal::Connect(host.to_owned(), e.to_string()))?;
                Ok(s)
            }
            Upstream::Handshake(_) | Upstream::Failed(_) => {
                Err(fail("no upstream connection".to_owned()))
            }
        }
    }
}

/// The sandbox's side of an intercepted tunnel: its ClientHello read, its
/// SNI checked against the `CONNECT` host (a refusal is noted), then its
/// TLS ended with a certificate for `host` from the sandbox's CA. `None`:
/// the tunnel ends here.
async fn accept_sandbox<P, C>(
    egress: &Arc<P>,
    client: C,
    host: &str,
    port: u16,
) -> Option<tokio_rustls::server::TlsStream<C>>
where
    P: Proxy,
    C: AsyncRead + AsyncWrite + Unpin,
{
    let timeout = egress.settings().connect_timeout;
    let acceptor =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
    let start = tokio::select! {
        s = tokio::time::timeout(timeout, acceptor) => s,
        _ = egress.stop().cancelled() => return None,
    };
    let Ok(Ok(start)) = start else {
        tracing::debug!(host, "egress: no TLS ClientHello on an intercepted tunnel");
        return None;
    };
    let sni = start
        .client_hello()
        .server_name()
        .map(parse::normalize_host);
    let verdict = sni_allowed(host, sni.as_deref());
    crate::metrics::METRICS.egress(verdict);
    if !verdict {
        tracing::debug!(
            host,
            "egress refused: TLS SNI does not name the CONNECT host"
        );
        egress.note(Note {
            host,
            port,
            method: Some("CONNECT"),
            bytes_out: 0,
            bytes_in: 0,
            refused: Some(SNI_REFUSED),
            secret: None,
        });
        return None;
    }
    let inj = egress.injections()?;
    let config = match inj.server_config(host) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(host, error = %e, "egress: no certificate for a bound host");
            return None;
        }
    };
    let tls = tokio::select! {
        s = tokio::time::timeout(timeout, start.into_stream(config)) => s,
        _ = egress.stop().cancelled() => return None,
    };
    let Ok(Ok(tls)) = tls else {
        tracing::debug!(host, "egress: the sandbox's TLS handshake failed");
        return None;
    };
    Some(tls)
}

/// Serves one tunnel to a bound host until either side closes, it idles
/// out or the session stops: the host's TLS handshake started, the
/// sandbox's [`accept_sandbox`]ed beside it, then one HTTP/1.1 connection
/// whose requests are [`forward`]ed.
pub(super) async fn serve<P, C>(
    egress: Arc<P>,
    client: C,
    upstream: TcpStream,
    host: String,
    port: u16,
) where
    P: Proxy,
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // The host's handshake runs while the sandbox's does.
    let handshake = tokio::spawn(connect_tls(Arc::clone(&egress), upstream, host.clone()));
    let upstream = Upstream::Handshake(handshake);
    let Some(tls) = accept_sandbox(&egress, client, &host, port).await else {
        return;
    };
    let upstream = Arc::new(tokio::sync::Mutex::new(upstream));
    let stop = egress.stop().clone();
    let idle = egress.settings().idle_timeout;
    let svc = service_fn(move |req: Request<Incoming>| {
        let egress = Arc::clone(&egress);
        let upstream = Arc::clone(&upstream);
        let host = host.clone();
        async move {
            let method = req.method().as_str().to_owned();
            let bytes_out = content_length(req.headers());
            let res = forward(&egress, &upstream, &host, port, req).await;
            let (refused, secret, bytes_in) = match &res {
                Ok((r, secret)) => (None, secret.clone(), content_length(r.headers())),
                Err(e) => (Some(e.problem().code), None, 0),
            };
            egress.note(Note {
                host: &host,
                port,
                method: Some(&method),
                bytes_out,
                bytes_in,
                refused: refused.as_deref(),
                secret: secret.as_deref(),
            });
            Ok::<_, Infallible>(res.map_or_else(IntoResponse::into_response, |(r, _)| r))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(idle)
        .timer(hyper_util::rt::TokioTimer::new())
        .serve_connection(TokioIo::new(tls), svc);
    tokio::select! {
        _ = conn => {}
        _ = stop.cancelled() => {}
    }
}

/// One request on an intercepted tunnel: checked, its secret headers set,
/// sent on; bodies stream. With the answer, the name of the (first)
/// secret set on it, for the audit log.
async fn forward<P: Proxy>(
    egress: &Arc<P>,
    upstream: &tokio::sync::Mutex<Upstream>,
    host: &str,
    port: u16,
    req: Request<Incoming>,
) -> Result<(Response, Option<String>), Refusal> {
    let Some(inj) = egress.injections() else {
        return Err(Refusal::Bad("no bound secret".into()));
    };
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    if let Some(h) = req.headers().get(hyper::header::HOST) {
        let h = h
            .to_str()
            .map_err(|_| Refusal::Bad("bad Host header".into()))?;
        if !host_header_matches(&authority, h, 443).unwrap_or(false) {
            return Err(Refusal::HostMismatch {
                target: authority,
                host: h.chars().take(256).collect(),
            });
        }
    }
    if let Some(a) = req.uri().authority()
        && !host_header_matches(&authority, a.as_str(), 443).unwrap_or(false)
    {
        return Err(Refusal::HostMismatch {
            target: authority,
            host: a.as_str().chars().take(256).collect(),
        });
    }
    check_head(inj, host, port, req.uri(), req.headers())?;
    let mut req = req.map(Body::new);
    let body = std::mem::replace(req.body_mut(), Body::empty());
    *req.body_mut() = scan_body(inj, host, port, body).await?;
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_owned();
    *req.uri_mut() = path.parse().map_err(|_| Refusal::Bad("bad path".into()))?;
    let headers = req.headers_mut();
    headers.remove("proxy-authorization");
    headers.remove("proxy-connection");
    if !headers.contains_key(hyper::header::HOST) {
        let default = if port == 443 {
            host.to_owned()
        } else {
            authority.clone()
        };
        if let Ok(v) = hyper::header::HeaderValue::from_str(&default) {
            headers.insert(hyper::header::HOST, v);
        }
    }
    let mut secret = None;
    for name in inj.apply(host, port, headers) {
        tracing::debug!(host, secret = name, "egress: secret header set");
        secret.get_or_insert_with(|| name.to_string());
    }
    let mut up = upstream.lock().await;
    let sender = up.sender(egress, host, port).await?;
    let res = tokio::time::timeout(egress.settings().idle_timeout, sender.send_request(req))
        .await
        .map_err(|_| Refusal::Connect(host.to_owned(), "no answer".into()))?
        .map_err(|e| Refusal::Connect(host.to_owned(), e.to_string()))?;
    Ok((res.map(Body::new), secret))
}

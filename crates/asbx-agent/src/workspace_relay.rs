//! The workspace API for tools and skill scripts: a loopback HTTP relay to
//! the gateway's `/workspace/` route (docs/protocol.md §3, seed 001: skills
//! call back the workspace API).
//!
//! Tools hold no socket to the gateway (it is 0600 to the agent), and the
//! gateway also serves the callbacks, model calls, MCP servers and the
//! usage report, none of which a tool may reach. So the agent listens on
//! `127.0.0.1:<ephemeral>` inside the sandbox's own network namespace
//! (nothing outside the sandbox can connect to it) and serves HTTP/1.1
//! there: a request whose path is under `/workspace/` is forwarded to the
//! gateway on a fresh connection with its method, query, body and only
//! `Authorization`, `Content-Type`, `Content-Length` and `Accept`; every
//! other path is `404` and reaches nothing. The relay adds no credential:
//! a caller must present the session's bearer itself, which tools get as
//! `ASBX_WORKSPACE_TOKEN` beside `ASBX_WORKSPACE_URL`
//! (`http://127.0.0.1:<port>/workspace`). The gateway checks the path
//! segment by segment and the workspace checks the bearer (this session
//! only, refused once it settles), so the variables open this session's
//! workspace API and nothing else.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (a quarter of
//! what the gateway takes from one sandbox, so a tool never starves the
//! agent's own calls); further ones wait in the listen backlog. The relay
//! stops when the run ends.

use std::sync::Arc;
use std::time::Duration;

use asbx_protocol::gateway::WORKSPACE_PREFIX;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::gateway_client::GatewayClient;

/// Most connections served at once.
pub(crate) const MAX_CONNECTIONS: usize = asbx_protocol::rules::limits::MAX_SANDBOX_CONNECTIONS / 4;
/// The variable holding the API's base URL.
pub(crate) const URL_ENV: &str = "ASBX_WORKSPACE_URL";
/// The variable holding the session's bearer.
pub(crate) const TOKEN_ENV: &str = "ASBX_WORKSPACE_TOKEN";
/// Request headers passed to the gateway; nothing else is.
const PASSED: [header::HeaderName; 4] = [
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::ACCEPT,
];
/// Pause after a failed `accept` (descriptors exhausted by a tool, ...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

type Body = BoxBody<Bytes, hyper::Error>;

/// A running relay; aborted when dropped.
#[derive(Debug)]
pub(crate) struct WorkspaceRelay {
    port: u16,
    task: JoinHandle<()>,
}

impl Drop for WorkspaceRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WorkspaceRelay {
    /// Listens on 127.0.0.1 and relays `/workspace/` to `gw`.
    pub(crate) async fn start(gw: GatewayClient) -> std::io::Result<WorkspaceRelay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(serve(listener, gw));
        Ok(WorkspaceRelay { port, task })
    }

    /// `ASBX_WORKSPACE_URL` and `ASBX_WORKSPACE_TOKEN` for tool processes.
    pub(crate) fn env(&self, token: &str) -> Vec<(String, String)> {
        let base = WORKSPACE_PREFIX.trim_end_matches('/');
        vec![
            (
                URL_ENV.to_owned(),
                format!("http://127.0.0.1:{}{base}", self.port),
            ),
            (TOKEN_ENV.to_owned(), token.to_owned()),
        ]
    }
}

async fn serve(listener: TcpListener, gw: GatewayClient) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::debug!("workspace relay: accept failed: {e}");
                drop(permit);
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let gw = gw.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let gw = gw.clone();
                async move { Ok::<_, std::convert::Infallible>(relay(&gw, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// One request: forwarded when under `/workspace/`, else answered here.
async fn relay(gw: &GatewayClient, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if !path.starts_with(WORKSPACE_PREFIX) {
        return problem(
            StatusCode::NOT_FOUND,
            "not_found",
            "only /workspace/ is served here",
        );
    }
    if !matches!(
        *req.method(),
        Method::GET | Method::POST | Method::PUT | Method::DELETE
    ) {
        return problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "GET, POST, PUT or DELETE",
        );
    }
    let target = req
        .uri()
        .path_and_query()
        .map_or(path, |pq| pq.as_str())
        .to_owned();
    let method = req.method().clone();
    let headers: Vec<(String, String)> = PASSED
        .iter()
        .filter_map(|h| {
            let v = req.headers().get(h)?.to_str().ok()?;
            Some((h.as_str().to_owned(), v.to_owned()))
        })
        .collect();
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match gw.send_body(method, &target, &pairs, req.into_body()).await {
        Ok(answer) => {
            let (parts, body) = answer.into_parts();
            let mut out = Response::new(body.boxed());
            *out.status_mut() = parts.status;
            for (name, value) in &parts.headers {
                if *name != header::CONNECTION && *name != header::TRANSFER_ENCODING {
                    out.headers_mut().insert(name.clone(), value.clone());
                }
            }
            out
        }
        Err(e) => problem(
            StatusCode::BAD_GATEWAY,
            "gateway_unreachable",
            &e.to_string(),
        ),
    }
}

/// A problem+json answer of the relay itself.
fn problem(status: StatusCode, code: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": status.as_u16(),
        "code": code,
        "detail": detail,
    });
    let mut out = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *out.status_mut() = status;
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/problem+json"),
    );
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::net::UnixListener;

    use super::*;

    /// A gateway on a Unix socket that records what it got and answers
    /// `200 {"ok": true}`.
    async fn recording_gateway(
        dir: &std::path::Path,
    ) -> (
        GatewayClient,
        Arc<Mutex<Vec<(String, String, Option<String>)>>>,
    ) {
        let path = dir.join("gw.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let s = s.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let s = s.clone();
                        async move {
                            let auth = req
                                .headers()
                                .get(header::AUTHORIZATION)
                                .map(|v| v.to_str().unwrap().to_owned());
                            let cookie = req.headers().get(header::COOKIE).is_some();
                            let pq = req.uri().path_and_query().unwrap().to_string();
                            let m = req.method().to_string();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            s.lock().unwrap().push((
                                format!("{m} {pq} cookie={cookie}"),
                                String::from_utf8_lossy(&body).into_owned(),
                                auth,
                            ));
                            Ok::<_, std::convert::Infallible>(Response::new(Full::new(
                                Bytes::from_static(b"{\"ok\":true}"),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(sock), svc)
                        .await;
                });
            }
        });
        (GatewayClient::new(path), seen)
    }

    async fn send(port: u16, method: &str, target: &str, body: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let req = format!(
            "{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer asbx_ws_t\r\n\
             Cookie: c=1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        (status, out)
    }

    #[tokio::test]
    async fn forwards_the_workspace_prefix_only_with_the_callers_bearer() {
        let dir = tempfile::tempdir().unwrap();
        let (gw, seen) = recording_gateway(dir.path()).await;
        let relay = WorkspaceRelay::start(gw).await.unwrap();
        let env = relay.env("asbx_ws_t");
        assert_eq!(
            env[0],
            (
                URL_ENV.to_owned(),
                format!("http://127.0.0.1:{}/workspace", relay.port)
            )
        );
        assert_eq!(env[1], (TOKEN_ENV.to_owned(), "asbx_ws_t".to_owned()));

        // Positive control: a bag request goes through, query and body kept.
        let (status, out) = send(relay.port, "POST", "/workspace/files?path=a.txt", "hi").await;
        assert_eq!(status, 200, "{out}");
        assert!(out.contains("{\"ok\":true}"), "{out}");
        // Every other route of the gateway is refused here and sent nowhere.
        for target in [
            "/callback/env",
            "/model/openai/v1/chat/completions",
            "/mcp/x",
            "/usage",
            "/client-tool/1",
            "/workspace",
            "http://evil.example/callback/env",
        ] {
            let (status, out) = send(relay.port, "GET", target, "").await;
            assert_eq!(status, 404, "{target}: {out}");
            assert!(out.contains("application/problem+json"), "{out}");
        }
        let (status, _) = send(relay.port, "PATCH", "/workspace/files", "").await;
        assert_eq!(status, 405);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![(
                "POST /workspace/files?path=a.txt cookie=false".to_owned(),
                "hi".to_owned(),
                Some("Bearer asbx_ws_t".to_owned())
            )]
        );
    }
}

//! The browser-facing security posture of every route (docs/protocol.md §8,
//! issue 13 item 4), applied once around the whole router:
//!
//! - **Host** (DNS rebinding): a request whose `Host` is not one this server
//!   answers to is refused with `403` `host_not_allowed`. On loopback it
//!   answers to `localhost`, `127.0.0.1` and `[::1]` on any port (an SSH
//!   tunnel or a forwarded port sends its own; a rebound name is none of
//!   these); it always answers to the configured public URL's host.
//!   `/healthz` and `/readyz` are
//!   exempt (they say nothing; probes address pods by IP), and so is
//!   `/metrics` when `ASBX_METRICS_TOKEN` is set (Prometheus scrapes pods
//!   by IP; a bearer is no ambient credential a rebound page could use).
//! - **Origin** (CSRF): a state-changing request (`POST`, `PUT`, `PATCH`,
//!   `DELETE`) whose `Origin` is present and is neither the request's own
//!   origin (`http://` + its `Host`, so a tunnelled page can post) nor the
//!   public URL's origin is refused with `403` `cross_origin`, before any
//!   handler runs. A WebSocket upgrade (`GET /api/runs/ws`) counts as
//!   state-changing: a page of another origin could otherwise open one
//!   with the user's session cookie.
//! - **Content type**: JSON routes take only `Content-Type:
//!   application/json` (`415`); that check is the [`crate::http::JsonBody`]
//!   extractor, so a refused request never reaches its handler.
//! - **Every error is problem+json**: a `4xx`/`5xx` that is not already
//!   `application/problem+json` (axum's `405`, a body-limit `413`, an
//!   extractor's rejection) is rewritten into one with a stable `code`,
//!   keeping its headers (`Allow`, `Retry-After`); never an empty body.

use std::net::IpAddr;
use std::sync::Arc;

use asbx_protocol::Problem;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::config::WorkspaceConfig;
use crate::error::{ProblemCode, WorkspaceError, problem_response};

/// Most bytes of a non-problem error body kept as the problem's `detail`.
const MAX_DETAIL_BYTES: usize = 1024;

/// The `Host` values and origins this server answers to (all lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authority {
    /// The public URL's `Host` values (with its port; without it too when
    /// the port is the scheme's default).
    public_hosts: Vec<String>,
    /// The public URL's origins, likewise.
    public_origins: Vec<String>,
    /// Listening on loopback: the loopback names are answered on any port
    /// (an SSH tunnel or a forwarded port sends its own).
    loopback: bool,
}

/// The names a loopback listener answers to, on any port.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl Authority {
    /// From the public URL and, when known, the listen address.
    pub(crate) fn from_config(config: &WorkspaceConfig) -> Authority {
        let public = &config.public_url;
        let loopback = match config.listen {
            Some(addr) => addr.ip().is_loopback(),
            None => public.host_str().is_some_and(is_loopback_name),
        };
        let mut a = Authority {
            public_hosts: Vec::new(),
            public_origins: Vec::new(),
            loopback,
        };
        if let Some(host) = public.host_str() {
            a.add_public(public.scheme(), host, public.port_or_known_default());
        }
        a
    }

    fn add_public(&mut self, scheme: &str, host: &str, port: Option<u16>) {
        let host = host.to_ascii_lowercase();
        let default = match scheme {
            "https" => Some(443),
            "http" => Some(80),
            _ => None,
        };
        let mut push = |authority: String| {
            let origin = format!("{scheme}://{authority}");
            if !self.public_hosts.contains(&authority) {
                self.public_hosts.push(authority);
            }
            if !self.public_origins.contains(&origin) {
                self.public_origins.push(origin);
            }
        };
        match port {
            Some(p) => {
                push(format!("{host}:{p}"));
                // A default port may be left out of `Host` and `Origin`.
                if Some(p) == default {
                    push(host);
                }
            }
            None => push(host),
        }
    }

    /// Whether `host` (a `Host` header value) is one this server answers to:
    /// the public URL's, or on loopback a loopback name with any port.
    pub(crate) fn allows_host(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        self.public_hosts.contains(&host) || (self.loopback && is_loopback_authority(&host))
    }

    /// Whether `origin` (an `Origin` header value) may change state in a
    /// request whose `Host` is `host`: the request's own origin
    /// (`http://` + its `Host`, a `Host` this server answers to) or the
    /// public URL's.
    pub(crate) fn allows_origin(&self, origin: &str, host: &str) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        let own = format!("http://{}", host.trim().to_ascii_lowercase());
        (origin == own && self.allows_host(host)) || self.public_origins.contains(&origin)
    }
}

/// Whether `authority` (lowercase `name[:port]`) is a loopback name with no
/// port or a valid one.
fn is_loopback_authority(authority: &str) -> bool {
    let (name, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(i) => authority.split_at(i + 1),
            None => return false,
        }
    } else {
        match authority.find(':') {
            Some(i) => authority.split_at(i),
            None => (authority, ""),
        }
    };
    let port_ok = match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()) && digits.parse::<u16>().is_ok(),
    };
    port_ok && LOOPBACK_NAMES.contains(&name)
}

fn is_loopback_name(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_state_changing(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// A WebSocket upgrade is a `GET` that changes state (its messages start
/// and cancel runs), and browsers let any page open one to any host with
/// the cookies of that host: its `Origin` is checked like a `POST`'s.
fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// The `Host` of a request: the header (HTTP/1.1) or the URI's authority
/// (HTTP/2).
fn request_host(req: &Request) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()))
}

/// Refuses foreign `Host`s and cross-origin state changes (see the module).
pub(crate) async fn host_and_origin(
    State(state): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let exempt = match req.uri().path() {
        "/healthz" | "/readyz" => true,
        "/metrics" => state.config.metrics_token.is_some(),
        _ => false,
    };
    let host = request_host(&req).unwrap_or_default();
    if !exempt && !state.authority.allows_host(&host) {
        return WorkspaceError::HostNotAllowed {
            host: printable(&host),
        }
        .into_response();
    }
    if (is_state_changing(req.method()) || is_websocket_upgrade(req.headers()))
        && let Some(origin) = req.headers().get(header::ORIGIN)
    {
        let origin = origin.to_str().unwrap_or("(not text)");
        if !state.authority.allows_origin(origin, &host) {
            return WorkspaceError::CrossOrigin {
                origin: printable(origin),
            }
            .into_response();
        }
    }
    next.run(req).await
}

/// At most 200 printable characters of a header value, for an error message.
fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect::<String>()
}

/// Rewrites every error response that is not problem+json into one.
pub(crate) async fn problem_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_problem(response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let (code, title) = code_of(status);
    let detail = if text.is_empty() || status.is_server_error() {
        title.to_owned()
    } else {
        printable(&text)
    };
    let mut out = problem_response(&Problem::new(status.as_u16(), code.as_str(), title, detail));
    for name in [header::ALLOW, header::RETRY_AFTER, header::WWW_AUTHENTICATE] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

fn is_problem(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(Problem::CONTENT_TYPE.as_bytes()))
}

fn code_of(status: StatusCode) -> (ProblemCode, &'static str) {
    match status {
        StatusCode::UNAUTHORIZED => (ProblemCode::Unauthorized, "Unauthorized"),
        StatusCode::FORBIDDEN => (ProblemCode::Forbidden, "Forbidden"),
        StatusCode::NOT_FOUND => (ProblemCode::NotFound, "Not found"),
        StatusCode::METHOD_NOT_ALLOWED => (ProblemCode::MethodNotAllowed, "Method not allowed"),
        StatusCode::PAYLOAD_TOO_LARGE => (ProblemCode::BodyTooLarge, "Request body too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            (ProblemCode::UnsupportedMediaType, "Unsupported media type")
        }
        s if s.is_server_error() => (ProblemCode::Internal, "Internal error"),
        _ => (ProblemCode::InvalidRequest, "Invalid request"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn bare(status: StatusCode) -> Response {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = status;
        r
    }

    fn config(public: &str, listen: Option<&str>) -> WorkspaceConfig {
        let mut c = WorkspaceConfig::new("/nonexistent", public.parse().unwrap());
        c.listen = listen.map(|l| l.parse().unwrap());
        c
    }

    #[test]
    fn loopback_listener_answers_to_loopback_names_on_any_port() {
        let a = Authority::from_config(&config("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
            // A tunnel or a forwarded port: `ssh -L 9000:localhost:8080`.
            "localhost:9000",
            "127.0.0.1:1",
            "[::1]:65535",
            "localhost",
            "127.0.0.1",
        ] {
            assert!(a.allows_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "evil.example",
            "localhost.evil.example:8080",
            "127.0.0.2:8080",
            "localhost:65536",
            "localhost:",
            "localhost:80a",
            "[::1",
            "[::1]x",
            "",
        ] {
            assert!(!a.allows_host(bad), "{bad}");
        }
        // The request's own origin, whatever its port, or the public URL's.
        assert!(a.allows_origin("http://localhost:9000", "localhost:9000"));
        assert!(a.allows_origin("http://LOCALHOST:9000/", "localhost:9000"));
        assert!(a.allows_origin("http://127.0.0.1:8080", "localhost:9000"));
        for (bad, host) in [
            ("http://localhost:9000", "localhost:8080"),
            ("http://evil.example", "localhost:8080"),
            ("http://evil.example", "evil.example"),
            ("null", "localhost:8080"),
            ("https://localhost:9000", "localhost:9000"),
            ("http://", ""),
            ("", "localhost:8080"),
        ] {
            assert!(!a.allows_origin(bad, host), "{bad} on {host}");
        }
    }

    #[test]
    fn public_listener_answers_to_the_public_host_only() {
        let a = Authority::from_config(&config("https://asbx.example.com", Some("0.0.0.0:8080")));
        assert!(a.allows_host("asbx.example.com"));
        assert!(a.allows_host("asbx.example.com:443"));
        assert!(!a.allows_host("127.0.0.1:8080"));
        assert!(!a.allows_host("localhost:8080"));
        assert!(!a.allows_host("localhost"));
        assert!(a.allows_origin("https://asbx.example.com", "asbx.example.com"));
        assert!(!a.allows_origin("https://evil.example", "asbx.example.com"));
        assert!(!a.allows_origin("http://localhost:8080", "asbx.example.com"));
    }

    #[tokio::test]
    async fn bare_errors_become_problems_keeping_allow() {
        let mut r = bare(StatusCode::METHOD_NOT_ALLOWED);
        r.headers_mut()
            .insert(header::ALLOW, "GET,HEAD".parse().unwrap());
        let r = problem_errors(r).await;
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[header::ALLOW], "GET,HEAD");
        assert!(is_problem(r.headers()));
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(p["code"], "method_not_allowed");
        // Success passes untouched.
        let ok = problem_errors(bare(StatusCode::OK)).await;
        assert!(!is_problem(ok.headers()));
    }
}

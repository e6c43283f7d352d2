//! The per-sandbox gateway: HTTP on a Unix socket mounted into the sandbox.
//!
//! It is the sandbox's only way out. It forwards
//! - `/callback/{env,config,results}` to this dispatch's `agent_url` and
//!   nowhere else, passing the agent's `Authorization` header through;
//! - `POST /model/{provider}/{path}` to that provider's base URL, adding the
//!   provider's key, so keys never enter the sandbox;
//! - `/mcp/{name}` (GET, POST, DELETE) to the streamable-HTTP MCP server of
//!   that name, learned from the workspace's `/config` answer as it passes;
//! - `GET /client-tool/{callId}` (protocol 2): held open until the client
//!   answers the call through `POST /v1/sessions/{id}/tool-result`.
//!
//! Everything else gets 404.

use std::sync::Arc;

use asbx_protocol::Problem;
use asbx_protocol::gateway::ProviderKind;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::TryStreamExt;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use crate::config::ProviderConfig;
use crate::egress::AllowList;

/// Largest body the agent may send through the gateway (results uploads).
const MAX_GATEWAY_BODY: usize = 96 << 20;

#[derive(Debug)]
struct GatewayState {
    session: Arc<crate::session::Session>,
    agent_url: String,
    providers: Arc<Vec<ProviderConfig>>,
    client: reqwest::Client,
    allow: Arc<AllowList>,
    /// Streamable-HTTP MCP servers by name, from the `/config` answer.
    mcp: std::sync::OnceLock<std::collections::HashMap<String, String>>,
}

/// Largest `/env` answer the gateway reads to learn `allowed_hosts`.
const MAX_ENV_BODY: usize = 4 << 20;
/// Largest `/config` answer the gateway reads (skills travel in it).
const MAX_CONFIG_BODY: usize = 32 << 20;

/// Serves the gateway on `listener` until `stop` is cancelled.
pub(crate) fn spawn(
    listener: UnixListener,
    session: Arc<crate::session::Session>,
    agent_url: &str,
    providers: Arc<Vec<ProviderConfig>>,
    client: reqwest::Client,
    allow: Arc<AllowList>,
    stop: CancellationToken,
) {
    let state = Arc::new(GatewayState {
        session,
        agent_url: agent_url.trim_end_matches('/').to_owned(),
        providers,
        client,
        allow,
        mcp: std::sync::OnceLock::new(),
    });
    let app = Router::new()
        .route("/callback/env", get(callback_env))
        .route("/callback/config", get(callback_config))
        .route("/callback/results", post(callback_results))
        .route("/model/{provider}/{*path}", post(model))
        .route("/mcp/{name}", get(mcp).post(mcp).delete(mcp))
        .route("/client-tool/{call_id}", get(client_tool))
        .route(asbx_protocol::gateway::USAGE, post(usage))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "not_found", "no such gateway route") })
        .with_state(state);
    tokio::spawn(async move {
        let listener = crate::limit::LimitedListener::new(listener, crate::limit::MAX_CONNECTIONS);
        let serve = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
        if let Err(e) = serve.await {
            tracing::warn!(error = %e, "gateway stopped");
        }
    });
}

fn problem(status: StatusCode, code: &str, detail: &str) -> Response {
    let p = Problem::new(
        status.as_u16(),
        code,
        status.canonical_reason().unwrap_or(""),
        detail,
    );
    let mut res = (status, serde_json::to_vec(&p).unwrap_or_default()).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Problem::CONTENT_TYPE),
    );
    res
}

/// Relays `/env` and keeps its `allowed_hosts` for the egress proxy: the list
/// comes from the workspace's answer, never from the sandbox.
async fn callback_env(State(s): State<Arc<GatewayState>>, req: Request) -> Response {
    let res = forward_callback(&s, "env", req).await;
    if !res.status().is_success() {
        return res;
    }
    let (parts, body) = res.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_ENV_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return problem(
                StatusCode::BAD_GATEWAY,
                "upstream_invalid",
                "/env answer too large",
            );
        }
    };
    if let Ok(env) = serde_json::from_slice::<asbx_protocol::callback::EnvResponse>(&bytes) {
        s.allow.set(env.allowed_hosts);
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Relays `/config` and keeps the URLs of its streamable-HTTP MCP servers,
/// which the sandbox then reaches by name only.
async fn callback_config(State(s): State<Arc<GatewayState>>, req: Request) -> Response {
    let res = forward_callback(&s, "config", req).await;
    if !res.status().is_success() {
        return res;
    }
    let (parts, body) = res.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_CONFIG_BODY).await else {
        return problem(
            StatusCode::BAD_GATEWAY,
            "upstream_invalid",
            "/config answer too large",
        );
    };
    if let Ok(cfg) = serde_json::from_slice::<asbx_protocol::callback::ConfigResponse>(&bytes) {
        let servers = cfg
            .mcp_servers
            .into_iter()
            .filter_map(|m| match m {
                asbx_protocol::callback::McpServer::Http { name, url } => Some((name, url)),
                asbx_protocol::callback::McpServer::Stdio { .. } => None,
            })
            .collect();
        let _ = s.mcp.set(servers);
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Protocol 2: the agent waits here for the client's answer to a call it
/// announced with a `tool_call` line.
async fn client_tool(State(s): State<Arc<GatewayState>>, Path(call_id): Path<String>) -> Response {
    use crate::session::ToolAnswer;
    match s.session.wait_call(&call_id).await {
        Some(ToolAnswer::Result(v)) => {
            axum::Json(serde_json::json!({ "result": v })).into_response()
        }
        Some(ToolAnswer::Error(e)) => axum::Json(serde_json::json!({ "error": e })).into_response(),
        None => problem(
            StatusCode::GONE,
            "session_ended",
            "the session ended before an answer",
        ),
    }
}

/// The agent's token counts, kept for the session's stats.
async fn usage(State(s): State<Arc<GatewayState>>, body: axum::body::Bytes) -> Response {
    match serde_json::from_slice::<asbx_protocol::gateway::Usage>(&body) {
        Ok(u) => {
            s.session.set_usage(u);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => problem(StatusCode::BAD_REQUEST, "invalid_request", &e.to_string()),
    }
}

/// Forwards one streamable-HTTP MCP request to the named server.
async fn mcp(
    State(s): State<Arc<GatewayState>>,
    Path(name): Path<String>,
    req: Request,
) -> Response {
    let Some(url) = s.mcp.get().and_then(|m| m.get(&name)).cloned() else {
        return problem(
            StatusCode::NOT_FOUND,
            "unknown_mcp_server",
            "no such MCP server",
        );
    };
    let mut headers = HeaderMap::new();
    for name in [
        header::CONTENT_TYPE.as_str(),
        header::ACCEPT.as_str(),
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    ] {
        if let (Some(v), Ok(n)) = (
            req.headers().get(name),
            header::HeaderName::from_bytes(name.as_bytes()),
        ) {
            headers.insert(n, v.clone());
        }
    }
    forward(&s, req.method().clone(), url, headers, req.into_body()).await
}

async fn callback_results(State(s): State<Arc<GatewayState>>, req: Request) -> Response {
    forward_callback(&s, "results", req).await
}

async fn forward_callback(s: &GatewayState, route: &str, req: Request) -> Response {
    let url = format!("{}/{route}", s.agent_url);
    let mut headers = HeaderMap::new();
    for name in [header::AUTHORIZATION, header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = req.headers().get(&name) {
            headers.insert(name, v.clone());
        }
    }
    forward(s, req.method().clone(), url, headers, req.into_body()).await
}

async fn model(
    State(s): State<Arc<GatewayState>>,
    Path((provider, path)): Path<(String, String)>,
    req: Request,
) -> Response {
    let Some(p) = s.providers.iter().find(|p| p.name == provider) else {
        return problem(
            StatusCode::NOT_FOUND,
            "unknown_provider",
            "no such provider",
        );
    };
    let path_ok = !path.is_empty()
        && path.len() <= 256
        && path
            .split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:".contains(&b));
    if !path_ok {
        return problem(StatusCode::BAD_REQUEST, "invalid_path", "bad provider path");
    }
    let url = format!("{}/{path}", p.base_url.trim_end_matches('/'));
    let mut headers = HeaderMap::new();
    for name in [header::CONTENT_TYPE, header::ACCEPT] {
        if let Some(v) = req.headers().get(&name) {
            headers.insert(name, v.clone());
        }
    }
    // Anthropic's version and beta headers are chosen by the agent; nothing
    // else from the sandbox is passed on, above all no credentials.
    for name in ["anthropic-version", "anthropic-beta"] {
        if let Some(v) = req.headers().get(name) {
            headers.insert(name, v.clone());
        }
    }
    match (p.kind, &p.api_key) {
        (ProviderKind::Openai, Some(key)) => {
            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                headers.insert(header::AUTHORIZATION, v);
            }
        }
        (ProviderKind::Anthropic, Some(key)) => {
            if let Ok(v) = HeaderValue::from_str(key) {
                headers.insert("x-api-key", v);
            }
            headers
                .entry("anthropic-version")
                .or_insert(HeaderValue::from_static("2023-06-01"));
        }
        (_, None) => {}
    }
    forward(&s, Method::POST, url, headers, req.into_body()).await
}

async fn forward(
    s: &GatewayState,
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let limited = http_body_util::Limited::new(body, MAX_GATEWAY_BODY);
    let stream = http_body_util::BodyDataStream::new(limited);
    let upstream = s
        .client
        .request(method, &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await;
    let upstream = match upstream {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%url, error = %e, "gateway upstream failed");
            return problem(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                &e.to_string(),
            );
        }
    };
    let status = upstream.status();
    let mut res = Response::builder().status(status.as_u16());
    if let Some(ct) = upstream.headers().get(header::CONTENT_TYPE) {
        res = res.header(header::CONTENT_TYPE, ct.as_bytes());
    }
    for name in [header::RETRY_AFTER.as_str(), "mcp-session-id"] {
        if let Some(v) = upstream.headers().get(name) {
            res = res.header(name, v.as_bytes());
        }
    }
    let body = Body::from_stream(upstream.bytes_stream().map_err(std::io::Error::other));
    res.body(body).unwrap_or_else(|_| {
        problem(
            StatusCode::BAD_GATEWAY,
            "upstream_invalid",
            "invalid upstream response",
        )
    })
}

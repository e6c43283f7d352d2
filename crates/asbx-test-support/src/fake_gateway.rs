//! A stand-in for the runner's per-sandbox gateway, for the agent's own tests.
//!
//! Serves HTTP on a Unix socket:
//!
//! - `GET /callback/env`, `GET /callback/config`: answer the configured
//!   payloads to `Authorization: Bearer <token>` with the right token, once
//!   each (a second redemption or a wrong token gets `401`).
//! - `POST /callback/results`: the upload token, once; the body is recorded.
//! - `POST /model/{provider}/{path...}`: proxied to that provider's base URL
//!   with its key added (`Authorization: Bearer` for OpenAI,
//!   `x-api-key` for Anthropic); the response is streamed back untouched.
//! - `GET|POST|DELETE /mcp/{name}`: forwarded to the URL of the
//!   streamable-HTTP MCP server `name` of the `/config` answer, like the
//!   runner's gateway: the request passes `content-type`, `accept`,
//!   `mcp-session-id`, `mcp-protocol-version` and `last-event-id`; the answer
//!   keeps its status, `content-type` and `mcp-session-id`, body streamed.
//! - `GET /client-tool/{callId}` (protocol 2 client tools): held open until
//!   the test answers that call ([`FakeGateway::answer_client_tool`]) or the
//!   next one ([`FakeGateway::answer_next_client_tool`]), then `200` with
//!   `{"result": ..}` or `{"error": ".."}`, or the status the test chose
//!   ([`ClientToolAnswer::Status`], e.g. `404` unknown call, `410` session
//!   ending). Each call id is answered at most once; asking again is `404`.
//! - `/workspace/files` (GET, POST), `/workspace/files/{id}`,
//!   `/workspace/history`: the in-sandbox workspace API of
//!   [`GatewayConfig::workspace`], to its bearer only (else `401`): files
//!   served with `content-length` and `x-asbx-sha256`, uploads recorded
//!   ([`FakeGateway::created_files`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use asbx_protocol::callback::{
    ConfigResponse, EnvResponse, McpServer, ResultsRequest, ResultsResponse, StoredFile,
};
use asbx_protocol::gateway::ProviderKind;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::lock;

/// A provider behind the gateway.
#[derive(Debug, Clone)]
pub struct GatewayProvider {
    pub name: String,
    pub kind: ProviderKind,
    /// Base URL, e.g. a [`crate::MockProvider`]'s `base_url`.
    pub base_url: String,
    pub key: String,
}

/// What the gateway answers.
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    pub otp_setup: String,
    pub otp_run: String,
    pub otp_upload: Option<String>,
    pub env: EnvResponse,
    pub config: ConfigResponse,
    pub providers: Vec<GatewayProvider>,
    /// The workspace API behind `/workspace/`, if any.
    pub workspace: Option<FakeWorkspaceApi>,
}

/// The file bag and history the fake gateway's `/workspace/` serves.
#[derive(Debug, Clone, Default)]
pub struct FakeWorkspaceApi {
    /// The bearer it takes.
    pub token: String,
    pub files: Vec<FakeFile>,
    /// `(role, text)`, oldest first.
    pub history: Vec<(String, String)>,
}

/// One file of the bag. `sha256` is sent as `x-asbx-sha256` as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FakeFile {
    pub id: String,
    pub path: String,
    pub mime_type: String,
    pub content: Vec<u8>,
    pub sha256: String,
}

#[derive(Debug, Default)]
struct Counters {
    env_ok: u32,
    config_ok: u32,
    rejected: u32,
    model_calls: u32,
    mcp_calls: u32,
    setup_used: bool,
    run_used: bool,
    upload_used: bool,
}

/// How the fake gateway answers one `GET /client-tool/{callId}`.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientToolAnswer {
    /// `200 {"result": value}`.
    Result(Value),
    /// `200 {"error": message}`.
    Error(String),
    /// That status with a plain-text body (e.g. `404`, `410`).
    Status(u16, String),
}

impl ClientToolAnswer {
    fn into_response(self) -> Response {
        match self {
            ClientToolAnswer::Result(v) => axum::Json(json!({ "result": v })).into_response(),
            ClientToolAnswer::Error(m) => axum::Json(json!({ "error": m })).into_response(),
            ClientToolAnswer::Status(code, body) => (
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body,
            )
                .into_response(),
        }
    }
}

/// Client-tool calls: who is waiting, and answers not yet asked for.
#[derive(Debug, Default)]
struct ClientCalls {
    /// Call ids in the order their `GET` arrived.
    requested: Vec<String>,
    /// Ids already answered (a second `GET` is `404`).
    answered: HashSet<String>,
    /// Requests held open, oldest first.
    waiting: VecDeque<(String, oneshot::Sender<ClientToolAnswer>)>,
    /// Answers for a call id that has not asked yet.
    by_id: HashMap<String, ClientToolAnswer>,
    /// Answers for whichever call asks next.
    next: VecDeque<ClientToolAnswer>,
}

#[derive(Debug)]
struct Shared {
    cfg: GatewayConfig,
    counters: Mutex<Counters>,
    results: Mutex<Vec<ResultsRequest>>,
    client_calls: Mutex<ClientCalls>,
    /// Woken on every `GET /client-tool/...`.
    client_call_arrived: Notify,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Files posted to `/workspace/files`.
    created: Mutex<Vec<FakeFile>>,
    /// Every `/workspace/...` request: method, path and query, status.
    workspace_log: Mutex<Vec<(String, String, u16)>>,
}

/// The running fake gateway; stops when dropped.
#[derive(Debug)]
pub struct FakeGateway {
    pub socket: PathBuf,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGateway {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl FakeGateway {
    /// Starts the gateway on `dir/gateway.sock`.
    pub async fn start(dir: &Path, cfg: GatewayConfig) -> FakeGateway {
        let socket = dir.join("gateway.sock");
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("fake gateway: cannot bind {}: {e}", socket.display()));
        let shared = Arc::new(Shared {
            cfg,
            counters: Mutex::default(),
            results: Mutex::default(),
            client_calls: Mutex::default(),
            client_call_arrived: Notify::new(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            created: Mutex::default(),
            workspace_log: Mutex::default(),
        });
        let app = Router::new()
            .route("/callback/env", get(env))
            .route("/callback/config", get(config))
            .route("/callback/results", post(results))
            .route("/model/{provider}/{*rest}", post(model))
            .route("/mcp/{name}", get(mcp).post(mcp).delete(mcp))
            .route("/client-tool/{call_id}", get(client_tool))
            .route("/workspace/{*rest}", get(workspace).post(workspace))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeGateway {
            socket,
            shared,
            task,
        }
    }

    /// Bodies posted to `/callback/results`.
    pub fn results(&self) -> Vec<ResultsRequest> {
        lock(&self.shared.results).clone()
    }

    /// Successful `/callback/env` redemptions.
    pub fn env_redemptions(&self) -> u32 {
        lock(&self.shared.counters).env_ok
    }

    /// Successful `/callback/config` redemptions.
    pub fn config_redemptions(&self) -> u32 {
        lock(&self.shared.counters).config_ok
    }

    /// Requests answered `401`.
    pub fn rejections(&self) -> u32 {
        lock(&self.shared.counters).rejected
    }

    /// Requests to `/mcp/...`.
    pub fn mcp_calls(&self) -> u32 {
        lock(&self.shared.counters).mcp_calls
    }

    /// Requests to `/model/...`.
    pub fn model_calls(&self) -> u32 {
        lock(&self.shared.counters).model_calls
    }

    /// Answers the client-tool call `call_id`: at once if the agent is
    /// waiting for it, else as soon as it asks.
    pub fn answer_client_tool(&self, call_id: &str, answer: ClientToolAnswer) {
        let mut c = lock(&self.shared.client_calls);
        if let Some(i) = c.waiting.iter().position(|(id, _)| id == call_id) {
            if let Some((id, tx)) = c.waiting.remove(i) {
                c.answered.insert(id);
                let _ = tx.send(answer);
            }
        } else {
            c.by_id.insert(call_id.to_owned(), answer);
        }
    }

    /// Answers the oldest waiting client-tool call, or else the next one to ask.
    pub fn answer_next_client_tool(&self, answer: ClientToolAnswer) {
        let mut c = lock(&self.shared.client_calls);
        match c.waiting.pop_front() {
            Some((id, tx)) => {
                c.answered.insert(id);
                let _ = tx.send(answer);
            }
            None => c.next.push_back(answer),
        }
    }

    /// Files posted to `/workspace/files`, in order.
    pub fn created_files(&self) -> Vec<FakeFile> {
        lock(&self.shared.created).clone()
    }

    /// Every `/workspace/...` request: method, path with query, status.
    pub fn workspace_requests(&self) -> Vec<(String, String, u16)> {
        lock(&self.shared.workspace_log).clone()
    }

    /// Call ids of every `GET /client-tool/{callId}` so far, in order.
    pub fn client_tool_requests(&self) -> Vec<String> {
        lock(&self.shared.client_calls).requested.clone()
    }

    /// Call ids whose `GET` is held open right now, oldest first.
    pub fn client_tools_waiting(&self) -> Vec<String> {
        lock(&self.shared.client_calls)
            .waiting
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Waits until the agent is waiting on `call_id` (its `GET` arrived and
    /// is not answered yet). Returns `false` if it was already answered.
    pub async fn wait_for_client_tool(&self, call_id: &str) -> bool {
        loop {
            let arrived = self.shared.client_call_arrived.notified();
            {
                let c = lock(&self.shared.client_calls);
                if c.waiting.iter().any(|(id, _)| id == call_id) {
                    return true;
                }
                if c.answered.contains(call_id) {
                    return false;
                }
            }
            arrived.await;
        }
    }
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    h.get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Checks a single-use token; `used` selects the flag of that token.
fn redeem(
    s: &Shared,
    h: &HeaderMap,
    token: Option<&str>,
    used: fn(&mut Counters) -> &mut bool,
) -> bool {
    let mut c = lock(&s.counters);
    let ok = matches!((bearer(h), token), (Some(got), Some(want)) if got == want) && !*used(&mut c);
    if ok {
        *used(&mut c) = true;
    } else {
        c.rejected += 1;
    }
    ok
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "token rejected").into_response()
}

async fn env(State(s): State<Arc<Shared>>, h: HeaderMap) -> Response {
    if !redeem(&s, &h, Some(&s.cfg.otp_setup), |c| &mut c.setup_used) {
        return unauthorized();
    }
    lock(&s.counters).env_ok += 1;
    axum::Json(s.cfg.env.clone()).into_response()
}

async fn config(State(s): State<Arc<Shared>>, h: HeaderMap) -> Response {
    if !redeem(&s, &h, Some(&s.cfg.otp_run), |c| &mut c.run_used) {
        return unauthorized();
    }
    lock(&s.counters).config_ok += 1;
    axum::Json(s.cfg.config.clone()).into_response()
}

async fn results(State(s): State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    if !redeem(&s, &h, s.cfg.otp_upload.as_deref(), |c| &mut c.upload_used) {
        return unauthorized();
    }
    let req: ResultsRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let stored = ResultsResponse {
        files: req
            .files
            .iter()
            .enumerate()
            .map(|(i, f)| StoredFile {
                path: f.path.clone(),
                id: format!("file_{i}"),
            })
            .collect(),
    };
    lock(&s.results).push(req);
    axum::Json(stored).into_response()
}

async fn model(
    State(s): State<Arc<Shared>>,
    UrlPath((provider, rest)): UrlPath<(String, String)>,
    req: Request,
) -> Response {
    lock(&s.counters).model_calls += 1;
    let Some(p) = s.cfg.providers.iter().find(|p| p.name == provider) else {
        return (
            StatusCode::NOT_FOUND,
            format!("unknown provider {provider}"),
        )
            .into_response();
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 * 1024 * 1024).await else {
        return (StatusCode::BAD_REQUEST, "body too large").into_response();
    };
    let url = format!("{}/{}", p.base_url.trim_end_matches('/'), rest);
    let mut out = http::Request::builder().method(http::Method::POST).uri(url);
    for name in [
        header::CONTENT_TYPE.as_str(),
        header::ACCEPT.as_str(),
        "anthropic-version",
    ] {
        if let Some(v) = parts.headers.get(name) {
            out = out.header(name, v);
        }
    }
    out = match p.kind {
        ProviderKind::Openai => out.header(header::AUTHORIZATION, format!("Bearer {}", p.key)),
        ProviderKind::Anthropic => out.header("x-api-key", p.key.as_str()),
    };
    let Ok(out) = out.body(Full::new(body)) else {
        return (StatusCode::BAD_GATEWAY, "cannot build upstream request").into_response();
    };
    match s.client.request(out).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}")).into_response(),
    }
}

async fn mcp(
    State(s): State<Arc<Shared>>,
    UrlPath(name): UrlPath<String>,
    req: Request,
) -> Response {
    lock(&s.counters).mcp_calls += 1;
    let url = s.cfg.config.mcp_servers.iter().find_map(|m| match m {
        McpServer::Http { name: n, url } if *n == name => Some(url.clone()),
        McpServer::Http { .. } | McpServer::Stdio { .. } => None,
    });
    let Some(url) = url else {
        return (StatusCode::NOT_FOUND, format!("no MCP server {name}")).into_response();
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 16 * 1024 * 1024).await else {
        return (StatusCode::BAD_REQUEST, "body too large").into_response();
    };
    let mut out = http::Request::builder().method(parts.method).uri(url);
    for name in [
        header::CONTENT_TYPE.as_str(),
        header::ACCEPT.as_str(),
        "mcp-session-id",
        "mcp-protocol-version",
        "last-event-id",
    ] {
        if let Some(v) = parts.headers.get(name) {
            out = out.header(name, v);
        }
    }
    let Ok(out) = out.body(Full::new(body)) else {
        return (StatusCode::BAD_GATEWAY, "cannot build upstream request").into_response();
    };
    match s.client.request(out).await {
        Ok(resp) => {
            let (up, body) = resp.into_parts();
            let mut r = Response::builder().status(up.status);
            for name in [header::CONTENT_TYPE.as_str(), "mcp-session-id"] {
                if let Some(v) = up.headers.get(name) {
                    r = r.header(name, v);
                }
            }
            r.body(Body::new(body))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}")).into_response(),
    }
}

async fn client_tool(State(s): State<Arc<Shared>>, UrlPath(call_id): UrlPath<String>) -> Response {
    let rx = {
        let mut c = lock(&s.client_calls);
        c.requested.push(call_id.clone());
        let ready = if c.answered.contains(&call_id) {
            Some(ClientToolAnswer::Status(
                404,
                format!("call {call_id} already answered"),
            ))
        } else if let Some(a) = c.by_id.remove(&call_id) {
            Some(a)
        } else {
            c.next.pop_front()
        };
        match ready {
            Some(a) => {
                c.answered.insert(call_id);
                drop(c);
                s.client_call_arrived.notify_waiters();
                return a.into_response();
            }
            None => {
                let (tx, rx) = oneshot::channel();
                c.waiting.push_back((call_id, tx));
                rx
            }
        }
    };
    s.client_call_arrived.notify_waiters();
    match rx.await {
        Ok(a) => a.into_response(),
        Err(_) => (StatusCode::GONE, "fake gateway stopped").into_response(),
    }
}

async fn workspace(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().to_string();
    let target = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let res = workspace_answer(&s, req).await;
    lock(&s.workspace_log).push((method, target, res.status().as_u16()));
    res
}

async fn workspace_answer(s: &Shared, req: Request) -> Response {
    let Some(api) = &s.cfg.workspace else {
        return (StatusCode::NOT_FOUND, "no workspace API").into_response();
    };
    if bearer(req.headers()) != Some(api.token.as_str()) {
        return unauthorized();
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let meta = |f: &FakeFile| {
        json!({"id": f.id, "path": f.path, "mimeType": f.mime_type,
               "size": f.content.len(), "sha256": f.sha256, "createdAt": 1})
    };
    match (req.method().as_str(), path.as_str()) {
        ("GET", "/workspace/files") => {
            let mut files: Vec<Value> = api.files.iter().map(meta).collect();
            files.extend(lock(&s.created).iter().map(meta));
            axum::Json(json!({ "files": files })).into_response()
        }
        ("GET", "/workspace/history") => {
            let limit = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("limit="))
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(20);
            let skip = api.history.len().saturating_sub(limit);
            let messages: Vec<Value> = api.history[skip..]
                .iter()
                .map(|(role, text)| json!({"role": role, "text": text, "createdAt": 1}))
                .collect();
            axum::Json(json!({ "messages": messages })).into_response()
        }
        ("POST", "/workspace/files") => {
            let Some(file_path) = query.split('&').find_map(|kv| kv.strip_prefix("path=")) else {
                return (StatusCode::BAD_REQUEST, "no path").into_response();
            };
            let file_path = url::form_urlencoded::parse(format!("p={file_path}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            let mime_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/octet-stream")
                .to_owned();
            let Ok(content) = axum::body::to_bytes(req.into_body(), 17 << 20).await else {
                return (StatusCode::PAYLOAD_TOO_LARGE, "too large").into_response();
            };
            let mut created = lock(&s.created);
            let f = FakeFile {
                id: format!("created_{}", created.len() + 1),
                path: file_path,
                mime_type,
                content: content.to_vec(),
                sha256: String::new(),
            };
            let body = meta(&f);
            created.push(f);
            (StatusCode::CREATED, axum::Json(body)).into_response()
        }
        ("GET", p) => {
            let id = p.strip_prefix("/workspace/files/").unwrap_or("");
            let created = lock(&s.created).clone();
            match api.files.iter().chain(created.iter()).find(|f| f.id == id) {
                Some(f) => Response::builder()
                    .header(header::CONTENT_TYPE, f.mime_type.as_str())
                    .header(header::CONTENT_LENGTH, f.content.len())
                    .header("x-asbx-sha256", f.sha256.as_str())
                    .body(Body::from(f.content.clone()))
                    .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()),
                None => (StatusCode::NOT_FOUND, format!("no file {id}")).into_response(),
            }
        }
        _ => (StatusCode::NOT_FOUND, "no such route").into_response(),
    }
}

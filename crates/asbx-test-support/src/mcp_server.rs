//! Test MCP servers.
//!
//! - [`echo_server_path`]: a stdio MCP server written in Python 3 (standard
//!   library only), `mcp/echo_server.py`, for the agent to start as a child.
//! - [`McpHttpServer`]: the same tools over streamable HTTP (axum on
//!   127.0.0.1:0, `POST /mcp` answering `application/json`, `GET /mcp` 405,
//!   `DELETE /mcp` ends the session). It hands out an `Mcp-Session-Id` at
//!   `initialize` and refuses later requests without it, and records every
//!   request (method, JSON-RPC method, session header).
//!
//! Tools of both: `add {a, b}` (text and structured `{"sum"}`), `fail
//! {message}` (a result with `isError`), `info {}` (working directory,
//! `ECHO_GREETING` and pid; the HTTP server answers its own process's
//! values); the Python server also has `sleep {seconds}`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::lock;

/// The path of the stdio test server (run it with `python3 <path>`; pass
/// `--crash` for a server that exits at once with code 3).
pub fn echo_server_path() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/echo_server.py")
}

/// The source of the stdio test server, for sandboxes that cannot see the
/// repository (write it into the sandbox, e.g. as a skill file).
pub fn echo_server_source() -> &'static str {
    include_str!("../mcp/echo_server.py")
}

/// The session id the HTTP server hands out.
pub const SESSION_ID: &str = "mcp-test-session-1";

/// One request the HTTP server got.
#[derive(Debug, Clone, PartialEq)]
pub struct McpRequest {
    pub http_method: String,
    /// The JSON-RPC method, if the body had one.
    pub rpc_method: Option<String>,
    pub session_id: Option<String>,
    pub protocol_version: Option<String>,
    pub body: Value,
}

#[derive(Debug, Default)]
struct Shared {
    requests: Mutex<Vec<McpRequest>>,
}

/// A streamable-HTTP MCP server on 127.0.0.1; stops when dropped.
#[derive(Debug)]
pub struct McpHttpServer {
    /// `http://127.0.0.1:<port>/mcp`.
    pub url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for McpHttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl McpHttpServer {
    pub async fn start() -> McpHttpServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("mcp test server: cannot bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("mcp test server: no address: {e}"));
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/mcp", post(handle).get(handle).delete(handle))
            .with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        McpHttpServer {
            url: format!("http://{addr}/mcp"),
            shared,
            task,
        }
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<McpRequest> {
        lock(&self.shared.requests).clone()
    }
}

/// The result of `tools/call`, shared with the Python server's behaviour.
pub fn call_tool(name: &str, args: &Value) -> Option<Value> {
    match name {
        "add" => {
            let a = args.get("a").and_then(Value::as_f64).unwrap_or(0.0);
            let b = args.get("b").and_then(Value::as_f64).unwrap_or(0.0);
            let sum = a + b;
            let sum = if sum.fract() == 0.0 && sum.abs() < 1e15 {
                json!(sum as i64)
            } else {
                json!(sum)
            };
            Some(json!({
                "content": [{"type": "text", "text": sum.to_string()}],
                "structuredContent": {"sum": sum},
                "isError": false
            }))
        }
        "fail" => {
            let msg = args
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("deliberate failure");
            Some(json!({"content": [{"type": "text", "text": msg}], "isError": true}))
        }
        "info" => {
            let info = json!({
                "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
                "greeting": Value::Null,
            });
            Some(json!({"content": [{"type": "text", "text": info.to_string()}]}))
        }
        _ => None,
    }
}

fn tools_list() -> Value {
    json!({"tools": [
        {"name": "add", "description": "Add two numbers.", "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]}},
        {"name": "fail", "description": "Always fails with the given message.", "inputSchema": {
            "type": "object", "properties": {"message": {"type": "string"}}}},
        {"name": "info", "description": "Working directory.", "inputSchema": {
            "type": "object", "properties": {}}}
    ]})
}

fn header_str(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

async fn handle(
    State(s): State<Arc<Shared>>,
    method: Method,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let session = header_str(&headers, "mcp-session-id");
    let rpc_method = body
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    lock(&s.requests).push(McpRequest {
        http_method: method.to_string(),
        rpc_method: rpc_method.clone(),
        session_id: session.clone(),
        protocol_version: header_str(&headers, "mcp-protocol-version"),
        body: body.clone(),
    });
    if method == Method::GET {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    if method == Method::DELETE {
        return StatusCode::OK.into_response();
    }
    let is_init = rpc_method.as_deref() == Some("initialize");
    if !is_init && session.as_deref() != Some(SESSION_ID) {
        return (StatusCode::BAD_REQUEST, "missing or unknown Mcp-Session-Id").into_response();
    }
    let Some(id) = body.get("id").cloned() else {
        // A notification or a response.
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match rpc_method.as_deref() {
        Some("initialize") => Some(json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "echo-http-server", "version": "1.0.0"}
        })),
        Some("ping") => Some(json!({})),
        Some("tools/list") => Some(tools_list()),
        Some("tools/call") => {
            let params = body.get("params").cloned().unwrap_or(Value::Null);
            let name = params.get("name").and_then(Value::as_str).unwrap_or("");
            let args = params.get("arguments").cloned().unwrap_or(json!({}));
            call_tool(name, &args)
        }
        Some(_) | None => None,
    };
    let answer = match result {
        Some(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        None => json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32601, "message": "unknown method or tool"}}),
    };
    let mut resp = (
        [(header::CONTENT_TYPE, "application/json")],
        answer.to_string(),
    )
        .into_response();
    if is_init && let Ok(v) = SESSION_ID.parse() {
        resp.headers_mut().insert("mcp-session-id", v);
    }
    resp
}

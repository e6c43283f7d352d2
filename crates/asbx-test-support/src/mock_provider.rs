//! A mock model provider speaking both streaming wire formats.
//!
//! `POST .../chat/completions` answers in the OpenAI chat-completions SSE
//! format, `POST .../messages` in the Anthropic Messages SSE format. Each
//! request takes the next [`Tape`] from the queue (when the queue is empty:
//! `400` with a message saying so). Every request is recorded with its
//! headers and JSON body, so tests can check what the agent sent and what
//! the gateway added (e.g. `authorization`, `x-api-key`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use serde_json::{Value, json};

use crate::lock;

/// A tool call the mock model makes.
#[derive(Debug, Clone, PartialEq)]
pub struct MockToolCall {
    pub id: String,
    pub name: String,
    pub args: Value,
}

/// One scripted response.
#[derive(Debug, Clone, PartialEq)]
pub enum Tape {
    /// A final text answer.
    Text(String),
    /// Optional text, then tool calls (several allowed).
    ToolCalls {
        text: Option<String>,
        calls: Vec<MockToolCall>,
    },
    /// A non-2xx answer with an error body, optionally with `Retry-After`.
    Status {
        status: u16,
        message: String,
        retry_after: Option<String>,
    },
    /// Sends the head and the first text chunk, then nothing, forever.
    Stall { partial: String },
    /// Sends the head and the first text chunk, then drops the connection.
    Disconnect { partial: String },
    /// A final text answer whose body is sent in chunks that split every
    /// multi-byte UTF-8 character (with a short pause between chunks).
    Utf8Split(String),
}

impl Tape {
    pub fn text(s: impl Into<String>) -> Self {
        Tape::Text(s.into())
    }

    pub fn tool_call(name: &str, args: Value) -> Self {
        Tape::tool_calls(vec![(name, args)])
    }

    pub fn tool_calls(calls: Vec<(&str, Value)>) -> Self {
        Tape::ToolCalls {
            text: None,
            calls: calls
                .into_iter()
                .enumerate()
                .map(|(i, (name, args))| MockToolCall {
                    id: format!(
                        "call_mock_{i}_{}",
                        name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
                    ),
                    name: name.to_owned(),
                    args,
                })
                .collect(),
        }
    }

    pub fn status(status: u16, message: impl Into<String>) -> Self {
        Tape::Status {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// `429` with `Retry-After: <secs>`.
    pub fn rate_limited(retry_after_secs: u64) -> Self {
        Tape::Status {
            status: 429,
            message: "rate limited (mock)".into(),
            retry_after: Some(retry_after_secs.to_string()),
        }
    }

    pub fn stall() -> Self {
        Tape::Stall {
            partial: "Thinking".into(),
        }
    }

    pub fn disconnect() -> Self {
        Tape::Disconnect {
            partial: "Half an ans".into(),
        }
    }

    pub fn utf8_split(s: impl Into<String>) -> Self {
        Tape::Utf8Split(s.into())
    }
}

/// One request the mock received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Lower-case header names.
    pub headers: Vec<(String, String)>,
    /// The body as JSON (`Value::Null` if it was not JSON).
    pub body: Value,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Default)]
struct Shared {
    tapes: Mutex<VecDeque<Tape>>,
    requests: Mutex<Vec<RecordedRequest>>,
}

/// The running mock; stops when dropped.
#[derive(Debug)]
pub struct MockProvider {
    /// `http://127.0.0.1:<port>`, no trailing slash.
    pub base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockProvider {
    /// Starts a mock on 127.0.0.1 with an ephemeral port.
    pub async fn start() -> MockProvider {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("mock provider: cannot bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("mock provider: no local addr: {e}"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockProvider {
            base_url: format!("http://{addr}"),
            shared,
            task,
        }
    }

    /// Queues a response.
    pub fn push(&self, tape: Tape) {
        lock(&self.shared.tapes).push_back(tape);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Tapes not used yet.
    pub fn remaining(&self) -> usize {
        lock(&self.shared.tapes).len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi,
    Anthropic,
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let bytes = axum::body::to_bytes(body, 64 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock")
        .to_owned();
    lock(&shared.requests).push(RecordedRequest {
        method: parts.method.to_string(),
        path: path.clone(),
        headers: headers_of(&parts.headers),
        body,
    });
    let format = if path.ends_with("/chat/completions") {
        Format::OpenAi
    } else if path.ends_with("/messages") {
        Format::Anthropic
    } else {
        return (StatusCode::NOT_FOUND, "mock provider: unknown path").into_response();
    };
    let Some(tape) = lock(&shared.tapes).pop_front() else {
        return error_response(format, 400, "mock provider: no tape left", None);
    };
    let input_tokens = (bytes.len() as u64).div_ceil(4);
    respond(format, tape, &model, input_tokens)
}

fn headers_of(h: &HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn error_response(
    format: Format,
    status: u16,
    message: &str,
    retry_after: Option<&str>,
) -> Response {
    let body = match format {
        Format::OpenAi => {
            json!({"error": {"message": message, "type": "mock_error", "code": null}})
        }
        Format::Anthropic => {
            json!({"type": "error", "error": {"type": "mock_error", "message": message}})
        }
    };
    let mut resp = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    if let Some(ra) = retry_after
        && let Ok(v) = ra.parse()
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

fn sse_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Splits text in pieces of a few chars (on char boundaries).
fn pieces(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(5).map(|c| c.iter().collect()).collect()
}

fn respond(format: Format, tape: Tape, model: &str, input_tokens: u64) -> Response {
    let output_tokens = 7;
    match tape {
        Tape::Status {
            status,
            message,
            retry_after,
        } => error_response(format, status, &message, retry_after.as_deref()),
        Tape::Text(t) => {
            let events = render(
                format,
                model,
                Some(&t),
                &[],
                input_tokens,
                output_tokens,
                true,
            );
            sse_response(Body::from_stream(frames(events)))
        }
        Tape::ToolCalls { text, calls } => {
            let events = render(
                format,
                model,
                text.as_deref(),
                &calls,
                input_tokens,
                output_tokens,
                true,
            );
            sse_response(Body::from_stream(frames(events)))
        }
        Tape::Utf8Split(t) => {
            let events = render(
                format,
                model,
                Some(&t),
                &[],
                input_tokens,
                output_tokens,
                true,
            );
            let all: Vec<u8> = events.concat().into_bytes();
            // Cut right after the first byte of every multi-byte character.
            let mut chunks = Vec::new();
            let mut start = 0;
            for i in 1..all.len() {
                if all[i] & 0b1100_0000 == 0b1000_0000 && all[i - 1] >= 0xC0 {
                    chunks.push(Bytes::copy_from_slice(&all[start..i]));
                    start = i;
                }
            }
            chunks.push(Bytes::copy_from_slice(&all[start..]));
            let s = stream::iter(chunks).then(|c| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok::<_, Infallible>(c)
            });
            sse_response(Body::from_stream(s))
        }
        Tape::Stall { partial } => {
            let events = render(format, model, Some(&partial), &[], input_tokens, 0, false);
            let s = frames(events).chain(stream::pending());
            sse_response(Body::from_stream(s))
        }
        Tape::Disconnect { partial } => {
            let events = render(format, model, Some(&partial), &[], input_tokens, 0, false);
            let s = frames(events).chain(stream::once(async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(std::io::Error::other("mock: disconnect mid-stream"))
            }));
            sse_response(Body::from_stream(s))
        }
    }
}

fn frames(events: Vec<String>) -> BoxStream<'static, Result<Bytes, std::io::Error>> {
    stream::iter(events.into_iter().map(|e| Ok(Bytes::from(e)))).boxed()
}

/// Renders a response as SSE events; `complete` adds the closing events.
fn render(
    format: Format,
    model: &str,
    text: Option<&str>,
    calls: &[MockToolCall],
    input_tokens: u64,
    output_tokens: u64,
    complete: bool,
) -> Vec<String> {
    match format {
        Format::OpenAi => render_openai(model, text, calls, input_tokens, output_tokens, complete),
        Format::Anthropic => {
            render_anthropic(model, text, calls, input_tokens, output_tokens, complete)
        }
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn render_openai(
    model: &str,
    text: Option<&str>,
    calls: &[MockToolCall],
    input_tokens: u64,
    output_tokens: u64,
    complete: bool,
) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        data(&json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        }))
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    for p in pieces(text.unwrap_or("")) {
        out.push(chunk(json!({"content": p}), Value::Null));
    }
    for (i, c) in calls.iter().enumerate() {
        let args = c.args.to_string();
        let mid = args
            .char_indices()
            .nth(args.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": ""}}]}),
            Value::Null,
        ));
        for part in [&args[..mid], &args[mid..]] {
            out.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                Value::Null,
            ));
        }
    }
    if complete {
        let finish = if calls.is_empty() {
            "stop"
        } else {
            "tool_calls"
        };
        out.push(chunk(json!({}), json!(finish)));
        out.push(data(&json!({
            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                      "total_tokens": input_tokens + output_tokens}
        })));
        out.push("data: [DONE]\n\n".to_owned());
    }
    out
}

fn render_anthropic(
    model: &str,
    text: Option<&str>,
    calls: &[MockToolCall],
    input_tokens: u64,
    output_tokens: u64,
    complete: bool,
) -> Vec<String> {
    let ev = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
    let mut out = vec![ev(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
    )];
    out.push(ev("ping", json!({"type": "ping"})));
    let mut index = 0;
    if let Some(t) = text.filter(|t| !t.is_empty()) {
        out.push(ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        for p in pieces(t) {
            out.push(ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "text_delta", "text": p}}),
            ));
        }
        if !complete {
            return out;
        }
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for c in calls {
        let args = c.args.to_string();
        let mid = args
            .char_indices()
            .nth(args.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        out.push(ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}}),
        ));
        for part in [&args[..mid], &args[mid..]] {
            out.push(ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": part}}),
            ));
        }
        out.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    if complete {
        let stop = if calls.is_empty() {
            "end_turn"
        } else {
            "tool_use"
        };
        out.push(ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": output_tokens}}),
        ));
        out.push(ev("message_stop", json!({"type": "message_stop"})));
    }
    out
}

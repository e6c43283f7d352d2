//! Protocol 2 session routes: resume a session's lines after a reconnect,
//! and answer the agent's client-tool calls.
//!
//! - `GET /v1/sessions/{id}/events?after=N`: the lines with `seq > N`, then
//!   the live tail until the session ends. `Accept: text/event-stream` gives
//!   SSE with `id: <seq>` and honours `Last-Event-ID`. `410` with the oldest
//!   retained `seq` when lines after `N` were already dropped.
//! - `POST /v1/sessions/{id}/tool-result` `{"callId","result"}` or
//!   `{"callId","error"}`: `404` for a call the agent never made, `409` for
//!   one already answered. An encrypted session takes only
//!   `{"callId","encrypted"}`, opened with the session's key
//!   (`docs/protocol.md` §4); one that does not open is a `400`
//!   `decryption_failed`.
//!
//! A reader counts as an attached client: while one reads, a session whose
//! `/stream` client went away is not cancelled.

use std::collections::VecDeque;
use std::sync::Arc;

use asbx_protocol::{FieldError, Protocol};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::watch;

use crate::Inner;
use crate::apidoc as doc;
use crate::auth::Authorized;
use crate::error::RunnerError;
use crate::session::{AnswerError, Backlog, LoggedLine, Session, SessionGuard, ToolAnswer};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Send the lines with `seq` above this (default 0: all retained). With
    /// SSE, `Last-Event-ID` wins over it.
    after: Option<u64>,
}

pub(crate) fn v2_session(inner: &Inner, id: String) -> Result<Arc<Session>, RunnerError> {
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    if s.protocol != Protocol::V2 {
        return Err(RunnerError::NotProtocol2(s.id.clone()));
    }
    Ok(s)
}

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    tag = "sessions",
    security(("runner_token" = [])),
    params(
        ("id" = String, Path, description = "The session id"),
        EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "SSE only: resume after this `seq`"),
    ),
    responses(
        (status = 200, description = "The retained lines after the cursor, then the live tail until the session ends: NDJSON, or SSE (`id: <seq>`, `event: <type>`, `data: <line>`) with `Accept: text/event-stream`",
            content(
                (doc::Line = "application/x-ndjson"),
                (doc::Line = "text/event-stream"),
            )),
        (status = 400, description = "`invalid_request`: `after` is not a number", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, description = "`not_found`: no such session", body = doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_protocol_2`: the session speaks protocol 1, which has no resume", body = doc::Problem, content_type = "application/problem+json"),
        (status = 410, description = "`events_gone`: lines after the cursor were already dropped; `oldestSeq` is the oldest retained", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn events(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, RunnerError> {
    let Query(q) =
        q.map_err(|e| RunnerError::InvalidRequest(vec![FieldError::new("after", e.body_text())]))?;
    let session = v2_session(&inner, id)?;
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let last_event_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let after = if sse {
        last_event_id.or(q.after)
    } else {
        q.after
    }
    .unwrap_or(0);
    let reader = Reader::open(session, after, sse)?;
    let stream = futures::stream::unfold(reader, |mut r| async move {
        r.next()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), r))
    });
    let mut res = (StatusCode::OK, Body::from_stream(stream)).into_response();
    let ct = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    res.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(res)
}

/// One resuming reader: the backlog first, then the live tail. It counts
/// as an attached client until dropped.
pub(crate) struct Reader {
    session: Arc<Session>,
    cursor: u64,
    pending: VecDeque<LoggedLine>,
    rx: watch::Receiver<u64>,
    sse: bool,
    _guard: SessionGuard,
}

impl Reader {
    /// The lines of `session` after `after` (`410` when some are gone), as
    /// NDJSON lines or SSE events.
    pub(crate) fn open(
        session: Arc<Session>,
        after: u64,
        sse: bool,
    ) -> Result<Reader, RunnerError> {
        // Subscribe before reading the backlog, so no line falls in between.
        let rx = session.subscribe();
        let pending = match session.backlog(after) {
            Backlog::Lines(lines) => VecDeque::from(lines),
            Backlog::Gone { oldest } => return Err(RunnerError::EventsGone { after, oldest }),
        };
        session.attach();
        Ok(Reader {
            session: Arc::clone(&session),
            cursor: after,
            pending,
            rx,
            sse,
            _guard: SessionGuard(Some(session)),
        })
    }

    /// The next line (or event), `None` once the session ended and all was
    /// given.
    pub(crate) async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                self.cursor = line.seq;
                return Some(self.format(&line));
            }
            let ended = *self.rx.borrow_and_update() == u64::MAX;
            match self.session.backlog(self.cursor) {
                Backlog::Lines(lines) if !lines.is_empty() => {
                    self.pending = lines.into();
                    continue;
                }
                // Fell further behind than the log keeps: end, and let the
                // client reconnect to learn what is left (410).
                Backlog::Gone { .. } => return None,
                Backlog::Lines(_) if ended => return None,
                Backlog::Lines(_) => {}
            }
            if self.rx.changed().await.is_err() {
                // The session is gone: whatever was logged has been sent.
                return None;
            }
        }
    }

    fn format(&self, line: &LoggedLine) -> Bytes {
        if !self.sse {
            return line.bytes.clone();
        }
        let data = line.bytes.strip_suffix(b"\n").unwrap_or(&line.bytes);
        let mut out = Vec::with_capacity(data.len() + 48);
        out.extend_from_slice(format!("id: {}\nevent: {}\ndata: ", line.seq, line.kind).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

/// The answer to a client-tool call: exactly one of `result` and `error`,
/// or, in an encrypted session, only `encrypted` (sealing `{result}` or
/// `{error}`, docs/protocol.md §4).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolResultBody {
    /// The `callId` of the `tool_call` line answered.
    #[serde(rename = "callId")]
    call_id: String,
    /// The tool's result, any JSON value.
    #[serde(default)]
    result: Option<serde_json::Value>,
    /// Why the tool failed.
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Sealed>)]
    encrypted: Option<asbx_crypto::Sealed>,
}

/// `"encrypted": {"iv", "ciphertext"}`: base64url (no padding) of a
/// 12-byte nonce and of the AES-256-GCM ciphertext with its tag.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct Sealed {
    iv: String,
    ciphertext: String,
}

/// The answer was handed to the agent.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ToolResultApplied {
    #[serde(rename = "callId")]
    call_id: String,
    /// Always `applied`.
    #[schema(value_type = String, example = "applied")]
    status: &'static str,
}

/// What an encrypted tool result holds once opened.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenedAnswer {
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<String>,
}

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/tool-result",
    tag = "sessions",
    security(("runner_token" = [])),
    params(("id" = String, Path, description = "The session id")),
    request_body(content = ToolResultBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The answer was handed to the agent", body = ToolResultApplied),
        (status = 400, description = "`invalid_request`: not a tool result, both or neither of `result` and `error`, or `encrypted` where the session is (not) encrypted; `decryption_failed`: `encrypted` did not open with the session's key", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, description = "`not_found`: no such session; `unknown_call`: the agent made no such call", body = doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`not_protocol_2`: a protocol 1 session; `already_answered`: the call has its answer; `session_ended`: the session ended before the answer", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn tool_result(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, RunnerError> {
    let session = v2_session(&inner, id)?;
    let applied = answer(&session, &body)?;
    Ok((StatusCode::OK, axum::Json(applied)).into_response())
}

/// Hands a tool-result body (`{"callId", "result" | "error" | "encrypted"}`)
/// to the agent waiting on that call: the one path of
/// `POST /v1/sessions/{id}/tool-result` and of a `tool_result` message on
/// `GET /v1/ws`.
pub(crate) fn answer(session: &Session, body: &[u8]) -> Result<ToolResultApplied, RunnerError> {
    let parsed: ToolResultBody = serde_json::from_slice(body).map_err(|e| {
        RunnerError::InvalidRequest(vec![FieldError::new("", format!("invalid body: {e}"))])
    })?;
    let (result, error) = match (session.crypto(), parsed.encrypted) {
        (None, None) => (parsed.result, parsed.error),
        (Some(crypto), Some(sealed)) if parsed.result.is_none() && parsed.error.is_none() => {
            let plain = crypto
                .open_tool_result(&parsed.call_id, &sealed)
                .map_err(|_| RunnerError::Undecryptable(parsed.call_id.clone()))?;
            let opened: OpenedAnswer = serde_json::from_slice(&plain).map_err(|e| {
                RunnerError::InvalidRequest(vec![FieldError::new(
                    "encrypted",
                    format!("the opened tool result is not {{result}} or {{error}}: {e}"),
                )])
            })?;
            (opened.result, opened.error)
        }
        (Some(_), _) => {
            return Err(RunnerError::InvalidRequest(vec![FieldError::new(
                "encrypted",
                "this session is encrypted: send only callId and encrypted",
            )]));
        }
        (None, Some(_)) => {
            return Err(RunnerError::InvalidRequest(vec![FieldError::new(
                "encrypted",
                "this session is not encrypted",
            )]));
        }
    };
    let answer = match (result, error) {
        (Some(r), None) => ToolAnswer::Result(r),
        (None, Some(e)) => ToolAnswer::Error(e),
        _ => {
            return Err(RunnerError::InvalidRequest(vec![FieldError::new(
                "result",
                "give exactly one of result or error",
            )]));
        }
    };
    match session.answer_call(&parsed.call_id, answer) {
        Ok(()) => Ok(ToolResultApplied {
            call_id: parsed.call_id,
            status: "applied",
        }),
        Err(AnswerError::Unknown) => Err(RunnerError::UnknownCall(parsed.call_id)),
        Err(AnswerError::AlreadyAnswered) => Err(RunnerError::AlreadyAnswered(parsed.call_id)),
        Err(AnswerError::SessionEnded) => Err(RunnerError::CallClosed(parsed.call_id)),
    }
}

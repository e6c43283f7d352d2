//! `GET /v1/ws`: the WebSocket transport (docs/protocol.md §13), a second
//! framing of the NDJSON stream, not a second implementation.
//!
//! - The upgrade is refused like any request (`401` before it, without the
//!   runner's bearer; `400` when it is not a WebSocket upgrade), and with
//!   `403` `cross_origin` when it carries an `Origin`: only browsers send
//!   one, and a page must not drive a loopback runner that has no token.
//! - A `dispatch` message goes through [`crate::routes::open_session`], the
//!   path of `POST /stream` (same validation, session, capacity, crypto);
//!   an `attach` message opens a [`crate::resume::Reader`], the reader of
//!   `GET /v1/sessions/{id}/events`; `tool_result` is
//!   [`crate::resume::answer`]; `cancel` is `DELETE /v1/sessions/{id}`.
//! - Each line of the stream is one text message. The socket holds the
//!   session attached as the NDJSON body does: a dropped socket is a dropped
//!   client (detach grace, then cancel), and the client resumes with
//!   `attach`.
//! - One session per socket; a message the socket can't go on from (a
//!   refused dispatch or attach, a message over [`MAX_MESSAGE`]) gets an
//!   `error` line and a close ([`asbx_protocol::ws`]); other bad messages get
//!   the `error` line only.

use std::sync::Arc;

use asbx_protocol::ws::{self as wire, AttachKey, ClientMessage};
use asbx_protocol::{FieldError, Protocol};
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt as _;

use crate::Inner;
use crate::apidoc as doc;
use crate::auth::Authorized;
use crate::error::RunnerError;
use crate::session::{CancelCause, Session};

/// Largest client message: the largest `POST /stream` body.
pub(crate) const MAX_MESSAGE: usize = crate::routes::MAX_BODY;

#[utoipa::path(
    get,
    path = "/v1/ws",
    tag = "dispatch",
    security(("runner_token" = [])),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol. Client text messages: `{\"type\":\"dispatch\", ...body of POST /stream}` (protocol 2; `protocol` may be left out), `{\"type\":\"attach\",\"sessionId\",\"after\"}`, `{\"type\":\"tool_result\",\"callId\",\"result\"|\"error\"|\"encrypted\"}`, `{\"type\":\"cancel\"}`, each at most 2 MiB. Server text messages: one protocol 2 line each, as NDJSON carries it; a bad message gets an `error` line with `seq` 0 and a stable `code` (then a close with 1008 when the socket can't go on); the socket closes with 1000 after `session_ended`"),
        (status = 400, description = "`invalid_request`: not a WebSocket upgrade", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: the runner token is missing or wrong (checked before the upgrade)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`cross_origin`: the upgrade carries an `Origin` (a web page's); the runner serves servers and SDKs", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn upgrade(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, RunnerError> {
    // Browsers let any page open a socket to any host, loopback included,
    // and always say where from; the runner's clients (a workspace, the
    // SDKs) are no web pages. Without this, a page could drive a runner
    // that listens on loopback with no token.
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("(not text)");
        return Err(RunnerError::CrossOrigin(origin.chars().take(128).collect()));
    }
    let ws = ws.map_err(|e| {
        RunnerError::InvalidRequest(vec![FieldError::new(
            "",
            format!("not a WebSocket upgrade: {}", e.body_text()),
        )])
    })?;
    Ok(ws
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| serve(inner, socket)))
}

/// What the socket carries: nothing yet, a session it dispatched, or one
/// it attached to. Either holds the session attached until dropped.
enum Source {
    Idle,
    Dispatched(Arc<Session>, crate::dispatch::Lines),
    Attached(Arc<Session>, crate::resume::Reader),
}

impl Source {
    fn session(&self) -> Option<&Arc<Session>> {
        match self {
            Source::Idle => None,
            Source::Dispatched(s, _) | Source::Attached(s, _) => Some(s),
        }
    }

    /// The next chunk of whole lines; `None` once the session's stream
    /// ended.
    async fn next(&mut self) -> Option<Bytes> {
        match self {
            Source::Idle => std::future::pending().await,
            Source::Dispatched(_, lines) => lines.next().await.map(|c| match c {
                Ok(b) => b,
                Err(never) => match never {},
            }),
            Source::Attached(_, reader) => reader.next().await,
        }
    }
}

/// A bad message's answer: its `error` line, and whether the socket closes.
struct Refusal {
    code: String,
    message: String,
    close: bool,
}

impl Refusal {
    fn new(e: &RunnerError, close: bool) -> Refusal {
        let message = match e {
            RunnerError::InvalidRequest(errors) => errors
                .iter()
                .map(|f| match f.field.as_str() {
                    "" => f.message.clone(),
                    name => format!("{name}: {}", f.message),
                })
                .collect::<Vec<_>>()
                .join("; "),
            other => other.to_string(),
        };
        Refusal {
            code: e.code(),
            message,
            close,
        }
    }

    fn coded(code: &str, message: impl Into<String>) -> Refusal {
        Refusal {
            code: code.to_owned(),
            message: message.into(),
            close: false,
        }
    }
}

async fn serve(inner: Arc<Inner>, mut socket: WebSocket) {
    let mut source = Source::Idle;
    loop {
        tokio::select! {
            msg = socket.recv() => {
                let refusal = match msg {
                    None | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => None,
                    Some(Ok(Message::Binary(_))) => Some(Refusal::new(
                        &invalid("", "send text messages (one JSON object each)"),
                        false,
                    )),
                    Some(Ok(Message::Text(text))) => {
                        handle(&inner, &mut source, text.as_str()).await.err()
                    }
                    Some(Err(e)) => {
                        // Over the size cap (or a broken frame): the
                        // socket can't go on.
                        let e = e.into_inner();
                        let too_large = matches!(
                            e.downcast_ref::<tokio_tungstenite::tungstenite::Error>(),
                            Some(tokio_tungstenite::tungstenite::Error::Capacity(_))
                        );
                        let e = if too_large {
                            RunnerError::TooLarge(MAX_MESSAGE)
                        } else {
                            invalid("", format!("a broken WebSocket message: {e}"))
                        };
                        Some(Refusal::new(&e, true))
                    }
                };
                if let Some(r) = refusal {
                    let sid = source.session().map(|s| s.id.clone()).unwrap_or_default();
                    let line = wire::message_error(&sid, &r.code, &r.message);
                    if socket.send(Message::Text(line.into())).await.is_err() {
                        return;
                    }
                    if r.close {
                        close(&mut socket, wire::CLOSE_POLICY, &r.code).await;
                        return;
                    }
                }
            }
            chunk = source.next() => match chunk {
                Some(chunk) => {
                    for line in wire::lines(&chunk) {
                        let Ok(text) = Utf8Bytes::try_from(chunk.slice_ref(line)) else {
                            continue;
                        };
                        if socket.send(Message::Text(text)).await.is_err() {
                            return;
                        }
                    }
                }
                None => {
                    close(&mut socket, wire::CLOSE_NORMAL, "session ended").await;
                    return;
                }
            },
        }
    }
}

async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

fn invalid(field: &str, message: impl Into<String>) -> RunnerError {
    RunnerError::InvalidRequest(vec![FieldError::new(field, message)])
}

/// Carries out one client message.
async fn handle(inner: &Arc<Inner>, source: &mut Source, text: &str) -> Result<(), Refusal> {
    let msg = ClientMessage::parse(text, AttachKey::SessionId)
        .map_err(|f| Refusal::new(&RunnerError::InvalidRequest(vec![f]), false))?;
    match msg {
        ClientMessage::Dispatch(mut body) => {
            if let Some(s) = source.session() {
                return Err(already(s));
            }
            // A socket carries protocol 2 lines: it is the default here.
            let protocol = body.entry("protocol").or_insert(serde_json::Value::from(2));
            if protocol.as_u64() != Some(2) {
                return Err(Refusal::new(
                    &invalid("protocol", "a WebSocket carries protocol 2 only"),
                    true,
                ));
            }
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            match crate::routes::open_session(inner, &bytes, None).await {
                Ok((session, lines)) => {
                    *source = Source::Dispatched(session, lines);
                    Ok(())
                }
                Err(e) => {
                    crate::metrics::METRICS.dispatch_refused(e.code());
                    Err(Refusal::new(&e, true))
                }
            }
        }
        ClientMessage::Attach { id, after } => {
            if let Some(s) = source.session() {
                return Err(already(s));
            }
            let session =
                crate::resume::v2_session(inner, id).map_err(|e| Refusal::new(&e, true))?;
            let reader = crate::resume::Reader::open(Arc::clone(&session), after, false)
                .map_err(|e| Refusal::new(&e, true))?;
            *source = Source::Attached(session, reader);
            Ok(())
        }
        ClientMessage::ToolResult(body) => {
            let session = source.session().ok_or_else(not_attached)?;
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            crate::resume::answer(session, &bytes)
                .map(|_| ())
                .map_err(|e| Refusal::new(&e, false))
        }
        ClientMessage::Cancel => {
            let session = source.session().ok_or_else(not_attached)?;
            debug_assert_eq!(session.protocol, Protocol::V2);
            session.cancel(CancelCause::Deleted);
            Ok(())
        }
    }
}

fn already(s: &Session) -> Refusal {
    Refusal::coded(
        wire::ALREADY_ATTACHED,
        format!("this socket carries session {} already", s.id),
    )
}

fn not_attached() -> Refusal {
    Refusal::coded(
        wire::NOT_ATTACHED,
        "send dispatch or attach first: this socket carries no session yet",
    )
}

//! `GET /api/runs/ws`: the WebSocket transport of the API for runs
//! (docs/protocol.md §13), a second framing of the NDJSON routes, not a
//! second implementation: each message is carried out by the route it
//! stands for, with the socket's caller, and the lines of that route's
//! NDJSON answer become one text message each.
//!
//! - `dispatch` is `POST /api/runs` (the same validation, run row, relay
//!   and storage; protocol 2 unless it says otherwise, and only 2);
//!   `attach` (`runId`, `after`) is `GET /api/runs/{id}/events?after=N`;
//!   `tool_result` is `POST /api/runs/{id}/tool-result`; `cancel` is
//!   `DELETE /api/runs/{id}`.
//! - The upgrade is refused like any request: Host, Origin (an upgrade is
//!   state-changing, `crate::guard`), API key or session.
//! - A refusal of one of those routes becomes an `error` line (`seq` 0, the
//!   problem's `code`); a refused `dispatch` or `attach` then closes the
//!   socket (1008), since it carries nothing to go on with.
//! - As with NDJSON, the run is relayed by a task of its own: a dropped
//!   socket loses nothing, and the client resumes with `attach`.

use std::sync::Arc;

use asbx_protocol::ws::{self as wire, AttachKey, ClientMessage};
use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::wire::{CreateRunRequest, EventsQuery, RUN_ID_HEADER, ToolResultRequest};

/// Largest client message: the largest `POST /api/runs` body.
pub(crate) const MAX_MESSAGE: usize = MAX_DEFINITION_BODY;

#[utoipa::path(
    get,
    path = "/api/runs/ws",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol. Client text messages: `{\"type\":\"dispatch\", ...body of POST /api/runs}` (protocol 2; `protocol` may be left out), `{\"type\":\"attach\",\"runId\",\"after\"}`, `{\"type\":\"tool_result\",\"callId\",\"result\"|\"error\"|\"encrypted\"}`, `{\"type\":\"cancel\"}`. Server text messages: one protocol 2 line each, as the NDJSON routes carry it; a refused message gets an `error` line with `seq` 0 and the route's problem `code` (then a close with 1008 for a refused dispatch or attach); the socket closes with 1000 once the run has ended"),
        (status = 400, description = "`invalid_request`: not a WebSocket upgrade", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: a wrong API key, or none where the workspace requires one", body = doc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`host_not_allowed` or `cross_origin`: the upgrade's `Host` or `Origin` is not this workspace's", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn upgrade(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, WorkspaceError> {
    let ws = ws.map_err(|e| {
        WorkspaceError::invalid(format!("not a WebSocket upgrade: {}", e.body_text()))
    })?;
    Ok(ws
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| serve(state, caller, socket)))
}

type Chunks = futures::stream::BoxStream<'static, Result<Bytes, axum::Error>>;

/// The run a socket carries and the NDJSON body it reads.
struct Following {
    run_id: String,
    body: Chunks,
    /// A line not yet complete.
    partial: BytesMut,
}

/// A refused message: its `error` line, and whether the socket closes.
struct Refusal {
    code: String,
    message: String,
    close: bool,
}

impl Refusal {
    /// The refusal a route answered with: its problem's `code` and `detail`
    /// (a runner's refusal passed through keeps the runner's code).
    async fn of(res: Response, close: bool) -> Refusal {
        let status = res.status().as_u16();
        let bytes = axum::body::to_bytes(res.into_body(), 64 * 1024)
            .await
            .unwrap_or_default();
        #[derive(serde::Deserialize)]
        struct Probe {
            code: Option<String>,
            detail: Option<String>,
        }
        let probe: Option<Probe> = serde_json::from_slice(&bytes).ok();
        let (code, detail) = match probe {
            Some(p) => (p.code, p.detail),
            None => (None, None),
        };
        Refusal {
            code: code.unwrap_or_else(|| "upstream_failed".to_owned()),
            message: detail.unwrap_or_else(|| format!("refused with {status}")),
            close,
        }
    }

    async fn error(e: WorkspaceError, close: bool) -> Refusal {
        Refusal::of(e.into_response(), close).await
    }
}

async fn serve(state: Arc<AppState>, caller: Caller, mut socket: WebSocket) {
    let mut following: Option<Following> = None;
    loop {
        tokio::select! {
            msg = socket.recv() => {
                let refusal = match msg {
                    None | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => None,
                    Some(Ok(Message::Binary(_))) => Some(Refusal::error(
                        WorkspaceError::invalid("send text messages (one JSON object each)"),
                        false,
                    ).await),
                    Some(Ok(Message::Text(text))) => {
                        handle(&state, &caller, &mut following, text.as_str()).await.err()
                    }
                    Some(Err(e)) => {
                        let e = e.into_inner();
                        let too_large = matches!(
                            e.downcast_ref::<tokio_tungstenite::tungstenite::Error>(),
                            Some(tokio_tungstenite::tungstenite::Error::Capacity(_))
                        );
                        let e = if too_large {
                            WorkspaceError::BodyTooLarge { limit: MAX_MESSAGE }
                        } else {
                            WorkspaceError::invalid(format!("a broken WebSocket message: {e}"))
                        };
                        Some(Refusal::error(e, true).await)
                    }
                };
                if let Some(r) = refusal {
                    let id = following.as_ref().map(|f| f.run_id.as_str()).unwrap_or("");
                    let line = wire::message_error(id, &r.code, r.message);
                    if socket.send(Message::Text(line.into())).await.is_err() {
                        return;
                    }
                    if r.close {
                        close(&mut socket, wire::CLOSE_POLICY, &r.code).await;
                        return;
                    }
                }
            }
            chunk = next_chunk(&mut following) => match chunk {
                Some(Ok(chunk)) => {
                    let Some(f) = following.as_mut() else { continue };
                    f.partial.extend_from_slice(&chunk);
                    let Some(end) = f.partial.iter().rposition(|b| *b == b'\n') else {
                        continue;
                    };
                    let whole = f.partial.split_to(end + 1).freeze();
                    for line in wire::lines(&whole) {
                        let Ok(text) = Utf8Bytes::try_from(whole.slice_ref(line)) else {
                            continue;
                        };
                        if socket.send(Message::Text(text)).await.is_err() {
                            return;
                        }
                    }
                }
                Some(Err(e)) => {
                    // The follow failed (the store, or lines pruned past
                    // this reader): the client attaches again from its
                    // last line and learns which.
                    let id = following.as_ref().map(|f| f.run_id.as_str()).unwrap_or("");
                    let line = wire::message_error(id, asbx_protocol::codes::INTERNAL, e.to_string());
                    let _ = socket.send(Message::Text(line.into())).await;
                    close(&mut socket, 1011, asbx_protocol::codes::INTERNAL).await;
                    return;
                }
                None => {
                    close(&mut socket, wire::CLOSE_NORMAL, "run ended").await;
                    return;
                }
            },
        }
    }
}

async fn next_chunk(following: &mut Option<Following>) -> Option<Result<Bytes, axum::Error>> {
    match following {
        Some(f) => f.body.next().await,
        None => std::future::pending().await,
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

/// Carries out one client message through its route.
async fn handle(
    state: &Arc<AppState>,
    caller: &Caller,
    following: &mut Option<Following>,
    text: &str,
) -> Result<(), Refusal> {
    let msg = match ClientMessage::parse(text, AttachKey::RunId) {
        Ok(m) => m,
        Err(f) => return Err(Refusal::error(WorkspaceError::invalid_fields(vec![f]), false).await),
    };
    match msg {
        ClientMessage::Dispatch(mut body) => {
            if let Some(f) = following {
                return Err(already(&f.run_id));
            }
            let protocol = body.entry("protocol").or_insert(serde_json::Value::from(2));
            if protocol.as_u64() != Some(2) {
                let e = WorkspaceError::invalid("a WebSocket carries protocol 2 only");
                return Err(Refusal::error(e, true).await);
            }
            let request: CreateRunRequest =
                match serde_json::from_value(serde_json::Value::Object(body)) {
                    Ok(r) => r,
                    Err(e) => {
                        let e = WorkspaceError::invalid(format!("invalid JSON body: {e}"));
                        return Err(Refusal::error(e, true).await);
                    }
                };
            // No queue notice on a socket (yet): its dispatch answers once
            // admitted, as without `Prefer: queued-notice`.
            let res = crate::runs::api::create(
                State(Arc::clone(state)),
                caller.clone(),
                axum::http::HeaderMap::new(),
                JsonBody(request),
            )
            .await;
            let res = accepted(res, true).await?;
            let run_id = res
                .headers()
                .get(RUN_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            *following = Some(follow(run_id, res.into_body()));
            Ok(())
        }
        ClientMessage::Attach { id, after } => {
            if let Some(f) = following {
                return Err(already(&f.run_id));
            }
            let res = crate::runs::api::events(
                State(Arc::clone(state)),
                caller.clone(),
                Path(id.clone()),
                Query(EventsQuery { after: Some(after) }),
                HeaderMap::new(),
            )
            .await;
            let res = accepted(res, true).await?;
            *following = Some(follow(id, res.into_body()));
            Ok(())
        }
        ClientMessage::ToolResult(body) => {
            let run_id = attached(following)?;
            let request: ToolResultRequest =
                match serde_json::from_value(serde_json::Value::Object(body)) {
                    Ok(r) => r,
                    Err(e) => {
                        let e = WorkspaceError::invalid(format!("invalid JSON body: {e}"));
                        return Err(Refusal::error(e, false).await);
                    }
                };
            let res = crate::runs::api::tool_result(
                State(Arc::clone(state)),
                caller.clone(),
                Path(run_id),
                JsonBody(request),
            )
            .await;
            accepted(res, false).await.map(drop)
        }
        ClientMessage::Cancel => {
            let run_id = attached(following)?;
            let res =
                crate::runs::api::cancel(State(Arc::clone(state)), caller.clone(), Path(run_id))
                    .await
                    .map(IntoResponse::into_response);
            accepted(res, false).await.map(drop)
        }
    }
}

fn follow(run_id: String, body: Body) -> Following {
    Following {
        run_id,
        body: body.into_data_stream().boxed(),
        partial: BytesMut::new(),
    }
}

/// A route's answer when it succeeded, else its refusal.
async fn accepted(res: Result<Response, WorkspaceError>, close: bool) -> Result<Response, Refusal> {
    let res = res.unwrap_or_else(IntoResponse::into_response);
    if res.status().is_success() {
        return Ok(res);
    }
    Err(Refusal::of(res, close).await)
}

fn attached(following: &Option<Following>) -> Result<String, Refusal> {
    following
        .as_ref()
        .map(|f| f.run_id.clone())
        .ok_or_else(|| Refusal {
            code: wire::NOT_ATTACHED.to_owned(),
            message: "send dispatch or attach first: this socket carries no run yet".to_owned(),
            close: false,
        })
}

fn already(run_id: &str) -> Refusal {
    Refusal {
        code: wire::ALREADY_ATTACHED.to_owned(),
        message: format!("this socket carries run {run_id} already"),
        close: false,
    }
}

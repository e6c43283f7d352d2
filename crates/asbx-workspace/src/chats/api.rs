//! Chat routes: the turn (`POST /api/assistant/chat/stream`, SSE), resume,
//! cancel, list, thread, soft delete, bag uploads.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::chats::live::{self as turns, KEEP_ALIVE, LiveTurn};
use crate::chats::remote;
use crate::chats::store as chats;
use crate::chats::turn::{self as chat, TurnStart};
use crate::chats::view::{self as chat_view, MAX_UPLOAD_BYTES};
use crate::error::WorkspaceError;
use crate::http::JsonBody;
use crate::quota::notice;
use crate::wire::{
    CHAT_ID_HEADER, CancelAccepted, ChatDetail, ChatPageQuery, ChatSummary, FileInfo,
    TURN_ID_HEADER, TurnRequest,
};

#[utoipa::path(
    post,
    path = "/api/assistant/chat/stream",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    request_body(content = TurnRequest, content_type = "application/json"),
    params(("Prefer" = Option<String>, Header, description = "`queued-notice`: when the turn must wait for its fair share of the runners, answer `200` at once, the stream opening with `event: queued` (`{\"quota\",\"waitS\"}`, no id), then the turn's events, or one `event: refused` (`{\"status\",\"retryAfter\"?,\"problem\"}`) (docs/api-usage.md)")),
    responses(
        (status = 200, description = "The turn as SSE: `turn` (TurnInfo) first, the run's lines by type, `done` (Done) last", body = crate::wire::TurnEvent, content_type = "text/event-stream"),
        (status = 400, response = inline(doc::BadFieldsOrModel)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 409, description = "`turn_in_flight`: the chat has a turn running (`activeTurnId`); `conflict`: its environment was deleted", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
        (status = 429, response = inline(doc::QuotaExceeded)),
        (status = 502, response = inline(doc::UpstreamFailed)),
        (status = 503, description = "`sandbox_url_missing`: no runner is configured", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn turn(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(request): JsonBody<TurnRequest>,
) -> Result<Response, WorkspaceError> {
    let wanted = notice::wanted(&headers);
    notice::answer(wanted, notice::Framing::Sse, move |notify| async move {
        let start = chat::start_turn(&state, &caller.workspace_id, request, notify).await?;
        Ok(turn_response(start))
    })
    .await
}

/// A started turn's answer: its live SSE, or the runner's refusal passed
/// through, the ids in the headers.
fn turn_response(start: TurnStart) -> Response {
    match start {
        TurnStart::Live(turn) => sse_response(turn, 0),
        TurnStart::Rejected {
            chat_id,
            turn_id,
            status,
            content_type,
            body,
        } => {
            crate::metrics::METRICS.chat_turn("rejected");
            let mut r = (status, Body::from(body)).into_response();
            let h = r.headers_mut();
            if let Some(ct) = content_type {
                h.insert(header::CONTENT_TYPE, ct);
            }
            insert_ids(h, &chat_id, &turn_id);
            r
        }
    }
}

/// `GET /api/assistant/chats/{id}/stream`: re-attach to the turn in flight,
/// after `Last-Event-ID` (or `?after=N`).
#[utoipa::path(
    get,
    path = "/api/assistant/chats/{id}/stream",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id"), ("after" = Option<u64>, Query, description = "Events after this id"), ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event id")),
    responses(
        (status = 200, description = "The turn in flight as SSE, from after the cursor (as the turn's own stream)", body = crate::wire::TurnEvent, content_type = "text/event-stream"),
        (status = 400, description = "`invalid_request`: `after` or `Last-Event-ID` is not a number", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::NoTurnInFlight)),
    ),
)]
pub(crate) async fn resume(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    let cursor = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .or(query.get("after").map(String::as_str))
        .map(|v| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| WorkspaceError::invalid("Last-Event-ID must be a line seq"))
        })
        .transpose()?
        .unwrap_or(0);
    let live = state.turns.for_chat(&chat_id, &caller.workspace_id);
    if let Some(turn) = live.as_ref().filter(|t| !t.is_done()) {
        return Ok(sse_response(Arc::clone(turn), cursor));
    }
    // Another node drives (or just drove) it: replay its stored lines. A
    // turn this node finished is kept a while for late readers, but a newer
    // one (another node's, since) comes first.
    let info = remote::find(&state, &caller.workspace_id, &chat_id).await?;
    let info = match (live, info) {
        (Some(turn), info) if info.as_ref().is_none_or(|i| i.turn_id == turn.id) => {
            return Ok(sse_response(turn, cursor));
        }
        (_, info) => info,
    }
    .ok_or_else(|| WorkspaceError::NotFound(format!("turn in flight in chat {chat_id}")))?;
    let (chat_id, turn_id) = (info.chat_id.clone(), info.turn_id.clone());
    let stream = remote::subscribe(Arc::clone(&state), info, cursor);
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    let h = r.headers_mut();
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    insert_ids(h, &chat_id, &turn_id);
    Ok(r)
}

#[utoipa::path(
    post,
    path = "/api/assistant/chats/{id}/cancel",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id")),
    responses(
        (status = 202, description = "Cancellation started", body = CancelAccepted),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::NoTurnInFlight)),
        (status = 502, response = inline(doc::UpstreamFailed)),
    ),
)]
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
) -> Result<(StatusCode, Json<CancelAccepted>), WorkspaceError> {
    let turn = state
        .turns
        .for_chat(&chat_id, &caller.workspace_id)
        .filter(|t| !t.is_done())
        .ok_or_else(|| WorkspaceError::NotFound(format!("turn in flight in chat {chat_id}")))?;
    turn.cancel();
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelAccepted {
            chat_id,
            turn_id: turn.id.clone(),
        }),
    ))
}

#[utoipa::path(
    get,
    path = "/api/assistant/chats",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The chats, newest first", body = Vec<ChatSummary>),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Vec<ChatSummary>>, WorkspaceError> {
    Ok(Json(chat_view::list(&state, &caller.workspace_id).await?))
}

/// `GET /api/assistant/chats/{id}`: the thread a page at a time (newest
/// first, `?limit=N&before=C`), the bag and the settings.
#[utoipa::path(
    get,
    path = "/api/assistant/chats/{id}",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id"), ("limit" = Option<u32>, Query, description = "Messages in the page (default 100, at most 500)"), ("before" = Option<i64>, Query, description = "A previous page's `before` cursor")),
    responses(
        (status = 200, description = "The chat and a page of its messages", body = ChatDetail),
        (status = 400, description = "`invalid_request`: a bad `limit` or `before`", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
    ),
)]
pub(crate) async fn detail(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
    Query(page): Query<HashMap<String, String>>,
) -> Result<Json<ChatDetail>, WorkspaceError> {
    if let Some(k) = page
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "before"))
    {
        return Err(WorkspaceError::invalid(format!(
            "unknown query parameter {k}"
        )));
    }
    let page = ChatPageQuery {
        limit: page.get("limit").cloned(),
        before: page.get("before").cloned(),
    };
    Ok(Json(
        chat_view::detail(&state, &caller.workspace_id, &chat_id, &page).await?,
    ))
}

/// Soft delete: the chat and its bag disappear; a turn in flight is cancelled.
#[utoipa::path(
    delete,
    path = "/api/assistant/chats/{id}",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 409, description = "`turn_in_flight`: the chat has a turn running", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    if !chats::soft_delete(
        state.store.pool(),
        &chat_id,
        &caller.workspace_id,
        state.now_ms(),
    )
    .await?
    {
        return Err(WorkspaceError::NotFound(format!("chat {chat_id}")));
    }
    if let Some(turn) = state.turns.for_chat(&chat_id, &caller.workspace_id) {
        turn.cancel();
    }
    state
        .chat_events
        .emit(&caller.workspace_id, &chat_id, None, "deleted");
    // Its files' rows are deleted with it; now their bytes (a crash here
    // leaks them until a sweep).
    let blobs =
        crate::files::store::blobs_of_chat(state.store.pool(), &chat_id, &caller.workspace_id)
            .await?;
    state.blobs.free_all(blobs).await;
    // And its kept working directories (CONTRACT §11).
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let kept = crate::workdir::store::delete_chat(&mut tx, &chat_id).await?;
    tx.commit().await?;
    state.blobs.free_all(kept).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/assistant/files?name=report.pdf[&chatId=...]`, the raw bytes as
/// the body and their type as `Content-Type`.
#[utoipa::path(
    post,
    path = "/api/assistant/files",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("name" = String, Query, description = "The file name"), ("chatId" = Option<String>, Query, description = "The chat the file belongs to")),
    request_body(content = Vec<u8>, content_type = "*/*", description = "The file's bytes (any content type)"),
    responses(
        (status = 201, description = "The stored file", body = FileInfo),
        (status = 400, description = "`invalid_request`: a bad name or chat", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 413, description = "`body_too_large`: the file is over the upload limit", body = doc::Problem, content_type = "application/problem+json"),
        (status = 429, response = inline(doc::QuotaExceeded)),
    ),
)]
pub(crate) async fn upload(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<FileInfo>), WorkspaceError> {
    let bytes = crate::http::body_bytes(body, MAX_UPLOAD_BYTES)?;
    let name = query
        .get("name")
        .ok_or_else(|| WorkspaceError::invalid("the name query parameter is required"))?;
    let mime = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let info = chat_view::upload(
        &state,
        &caller.workspace_id,
        name,
        query.get("chatId").map(String::as_str),
        mime,
        &bytes,
    )
    .await?;
    let event = crate::audit::AuditEvent::FileWrite {
        path: info.path.clone(),
        size: u64::try_from(info.size).unwrap_or(0),
        via: "upload".to_owned(),
    };
    crate::audit::record(
        &state,
        &caller.workspace_id,
        Default::default(),
        vec![event],
    )
    .await;
    Ok((StatusCode::CREATED, Json(info)))
}

fn sse_response(turn: Arc<LiveTurn>, cursor: u64) -> Response {
    let (chat_id, turn_id) = (turn.chat_id.clone(), turn.id.clone());
    let stream = turns::subscribe(turn, cursor);
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    let h = r.headers_mut();
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    insert_ids(h, &chat_id, &turn_id);
    r
}

fn insert_ids(h: &mut HeaderMap, chat_id: &str, turn_id: &str) {
    if let Ok(v) = HeaderValue::from_str(chat_id) {
        h.insert(CHAT_ID_HEADER, v);
    }
    if let Ok(v) = HeaderValue::from_str(turn_id) {
        h.insert(TURN_ID_HEADER, v);
    }
}

//! A chat's kept working directories (CONTRACT §11) as its owner sees
//! them: the list of what each turn kept or why not, and forks: a new
//! chat with the history up to one assistant message and the directory as
//! that turn left it.

use std::sync::Arc;

use std::collections::HashMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sqlx::Row as _;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::chats::store as chats;
use crate::error::WorkspaceError;
use crate::http::JsonBody;
use crate::workdir::source::{self, at_message};
use crate::workdir::store as kept;

/// `POST /api/assistant/chats/{id}/fork`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ForkRequest {
    /// An assistant message of the chat: the fork's history ends with it.
    pub after_message_id: String,
}

/// The new chat (`201`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Forked {
    pub id: String,
}

/// One turn's kept working directory, or why it was not kept.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeptDir {
    pub id: String,
    /// The turn (run) that left it; none for a fork's copy.
    pub run_id: Option<String>,
    /// `kept` or `refused`.
    pub status: String,
    /// Why it was refused.
    pub error: Option<String>,
    pub entries: i64,
    pub bytes: i64,
    /// Whether its bytes are still kept (older turns keep their list only).
    pub restorable: bool,
    pub created_at: i64,
}

/// `GET /api/assistant/chats/{id}/workdir`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct KeptDirs {
    /// Oldest first.
    pub snapshots: Vec<KeptDir>,
}

#[utoipa::path(
    get,
    path = "/api/assistant/chats/{id}/workdir",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id")),
    responses(
        (status = 200, description = "What each turn's working directory kept, or why not", body = KeptDirs),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
    ),
)]
pub(crate) async fn workdir(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
) -> Result<Json<KeptDirs>, WorkspaceError> {
    chats::get(state.store.pool(), &chat_id, &caller.workspace_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    let snapshots = kept::list(state.store.pool(), &chat_id)
        .await?
        .into_iter()
        .map(|s| KeptDir {
            status: if s.manifest.is_some() {
                "kept"
            } else {
                "refused"
            }
            .to_owned(),
            id: s.id,
            run_id: s.run_id,
            error: s.error,
            entries: s.entries,
            bytes: s.bytes,
            restorable: s.restorable,
            created_at: s.created_at,
        })
        .collect();
    Ok(Json(KeptDirs { snapshots }))
}

#[utoipa::path(
    post,
    path = "/api/assistant/chats/{id}/fork",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id")),
    request_body(content = ForkRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "The new chat", body = Forked),
        (status = 400, description = "`invalid_request`: not an assistant message of the chat", body = doc::Problem, content_type = "application/problem+json"),
        (status = 415, response = inline(crate::apidoc::NotJson)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 410, description = "`workdir_gone`: that turn's directory's bytes are no longer kept (past `ASBX_WORKDIR_KEEP_TURNS`)", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn fork(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> Result<(StatusCode, Json<Forked>), WorkspaceError> {
    let now = state.now_ms();
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    let chat = chats::get(&mut *tx, &chat_id, &caller.workspace_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    let (position, from) = at_message(&mut tx, &chat_id, &req.after_message_id).await?;
    let id = crate::tokens::random_id();
    sqlx::query(
        "INSERT INTO chats (id, workspace_id, title, created_at, updated_at, forked_from, \
         forked_after) VALUES ($1, $2, $3, $4, $4, $5, $6)",
    )
    .bind(&id)
    .bind(&caller.workspace_id)
    .bind(&chat.title)
    .bind(now)
    .bind(&chat_id)
    .bind(&req.after_message_id)
    .execute(&mut *tx)
    .await?;
    if let Some(from) = &from {
        // A directory no longer kept: no fork that would lack it.
        if let Some(s) = kept::get(&mut *tx, from).await? {
            source::restorable(s, &chat_id, Some(&req.after_message_id))?;
        }
    }
    copy_messages(&mut tx, &chat_id, &id, position).await?;
    if let Some(from) = from {
        kept::copy(&mut tx, &from, &crate::tokens::random_id(), &id, now).await?;
    }
    tx.commit().await?;
    state
        .chat_events
        .emit(&caller.workspace_id, &id, None, "updated");
    Ok((StatusCode::CREATED, Json(Forked { id })))
}

#[utoipa::path(
    get,
    path = "/api/assistant/chats/{id}/workdir.tar",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(
        ("id" = String, Path, description = "The chat id"),
        ("afterMessageId" = Option<String>, Query, description = "The directory as that assistant message's turn left it (default: the latest)"),
    ),
    responses(
        (status = 200, description = "The kept working directory as a tar archive, streamed", body = Vec<u8>, content_type = "application/x-tar"),
        (status = 400, description = "`invalid_request`: not an assistant message of the chat", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 410, description = "`workdir_gone`: that directory's bytes are no longer kept (past `ASBX_WORKDIR_KEEP_TURNS`)", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn workdir_tar(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, WorkspaceError> {
    if let Some(k) = query.keys().find(|k| k.as_str() != "afterMessageId") {
        return Err(WorkspaceError::invalid(format!(
            "unknown query parameter {k}"
        )));
    }
    let mut conn = state.store.pool().acquire().await?;
    chats::get(&mut *conn, &chat_id, &caller.workspace_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("chat {chat_id}")))?;
    let snapshot = match query.get("afterMessageId") {
        Some(m) => match at_message(&mut conn, &chat_id, m).await?.1 {
            Some(id) => kept::get(&mut *conn, &id).await?,
            None => None,
        },
        None => kept::latest(&mut *conn, &chat_id).await?,
    };
    drop(conn);
    let manifest = match snapshot {
        None => Default::default(),
        Some(s) => {
            let after = query.get("afterMessageId").map(String::as_str);
            source::restorable(s, &chat_id, after)?
                .manifest
                .unwrap_or_default()
        }
    };
    let body = Body::from_stream(crate::workdir::tar::archive(state.blobs.clone(), manifest));
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"workdir.tar\"",
            ),
        ],
        body,
    )
        .into_response())
}

/// Copies the messages of `from` up to `position` into `to`, each with a
/// fresh id.
async fn copy_messages(
    conn: &mut sqlx::AnyConnection,
    from: &str,
    to: &str,
    position: i64,
) -> Result<(), WorkspaceError> {
    let rows = sqlx::query(
        "SELECT position, role, content, attachments, turn_id, created_at FROM messages \
         WHERE chat_id = $1 AND position <= $2 ORDER BY position",
    )
    .bind(from)
    .bind(position)
    .fetch_all(&mut *conn)
    .await?;
    for r in rows {
        sqlx::query(
            "INSERT INTO messages (id, chat_id, position, role, content, attachments, turn_id, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(crate::tokens::random_id())
        .bind(to)
        .bind(r.try_get::<i64, _>("position")?)
        .bind(r.try_get::<String, _>("role")?)
        .bind(r.try_get::<String, _>("content")?)
        .bind(r.try_get::<String, _>("attachments")?)
        .bind(r.try_get::<Option<String>, _>("turn_id")?)
        .bind(r.try_get::<i64, _>("created_at")?)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

//! The runner's routes of a kept working directory (CONTRACT §11), below
//! a dispatch's `agent_url`, behind its `workdir` token (which the runner
//! never hands to the sandbox): which blobs are missing, storing and
//! reading one, and the snapshot a turn ended with. A run that starts from
//! a chat's directory (`POST /api/runs` with `workdir.from`) may read that
//! chat's blobs and nothing more.

use std::sync::Arc;

use asbx_protocol::workdir::{self, MissingRequest, MissingResponse, SnapshotReport, is_sha256};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio_util::io::ReaderStream;

use crate::AppState;
use crate::error::WorkspaceError;
use crate::tokens::{self, bearer, store as token_store};
use crate::workdir::store;

/// Largest blob a capture sends.
pub(crate) const MAX_BLOB_BYTES: usize = workdir::DEFAULT_MAX_BYTES as usize;

/// What a run's `workdir` token opens.
enum Access {
    /// A chat turn: its workspace and chat, whose directory it keeps.
    Turn {
        workspace_id: String,
        chat_id: String,
    },
    /// A run starting from the chat's kept directory: it reads only.
    Reads { chat_id: String },
}

/// What the bearer opens, when it is the run's `workdir` token.
async fn access(
    state: &AppState,
    session_id: &str,
    headers: &HeaderMap,
) -> Result<Access, WorkspaceError> {
    let token = bearer(headers).ok_or(WorkspaceError::Unauthorized)?;
    let found = token_store::workdir_bearer(
        state.store.pool(),
        &tokens::hash(token),
        session_id,
        state.now_ms(),
    )
    .await?;
    match found {
        Some((workspace_id, Some(chat_id), _)) => Ok(Access::Turn {
            workspace_id,
            chat_id,
        }),
        Some((_, None, Some(chat_id))) => Ok(Access::Reads { chat_id }),
        Some((_, None, None)) | None => Err(WorkspaceError::Unauthorized),
    }
}

/// The run's workspace and chat, when the bearer is a chat turn's
/// `workdir` token (a run that only reads keeps nothing: `403`).
async fn authorize(
    state: &AppState,
    session_id: &str,
    headers: &HeaderMap,
) -> Result<(String, String), WorkspaceError> {
    match access(state, session_id, headers).await? {
        Access::Turn {
            workspace_id,
            chat_id,
        } => Ok((workspace_id, chat_id)),
        Access::Reads { .. } => Err(WorkspaceError::Forbidden(
            "a run started from a chat's working directory keeps nothing".into(),
        )),
    }
}

fn bad(field: &str, message: impl Into<String>) -> WorkspaceError {
    WorkspaceError::invalid_fields(vec![asbx_protocol::FieldError::new(field, message)])
}

fn bad_hash(sha: &str) -> WorkspaceError {
    bad("sha256", format!("{sha:?} is not a lowercase hex SHA-256"))
}

#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/workdir/missing",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The run id")),
    request_body(content = Object, content_type = "application/json", description = "`{\"hashes\": [sha256, ..]}`"),
    responses(
        (status = 200, description = "`{\"missing\": [..]}`: the hashes the workspace lacks", body = Object),
        (status = 415, response = inline(crate::apidoc::NotJson)),
        (status = 422, description = "`invalid_request`: a JSON body of the wrong shape", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "Not the run's workdir token", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a run started from a chat's directory keeps nothing", body = crate::apidoc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn missing(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    Json(req): Json<MissingRequest>,
) -> Result<Json<MissingResponse>, WorkspaceError> {
    authorize(&state, &session_id, &headers).await?;
    if req.hashes.len() > workdir::DEFAULT_MAX_ENTRIES {
        return Err(bad("hashes", "too many"));
    }
    let mut missing = Vec::new();
    for sha in req.hashes {
        if !is_sha256(&sha) {
            return Err(bad_hash(&sha));
        }
        if !state.blobs.has(&sha).await? {
            missing.push(sha);
        }
    }
    Ok(Json(MissingResponse { missing }))
}

#[utoipa::path(
    put,
    path = "/api/assistant/sandbox/{session_id}/workdir/blobs/{sha256}",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(
        ("session_id" = String, Path, description = "The run id"),
        ("sha256" = String, Path, description = "The bytes' SHA-256, checked"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Stored"),
        (status = 400, description = "The bytes' SHA-256 is another", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "Not the run's workdir token", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a run started from a chat's directory keeps nothing", body = crate::apidoc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn put_blob(
    State(state): State<Arc<AppState>>,
    Path((session_id, sha)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, WorkspaceError> {
    authorize(&state, &session_id, &headers).await?;
    if !is_sha256(&sha) {
        return Err(bad_hash(&sha));
    }
    let stored = state
        .blobs
        .put_stream_as(
            body.into_data_stream(),
            MAX_BLOB_BYTES,
            crate::files::blobs::BlobStore::workdir_pin(&session_id),
        )
        .await?;
    if stored.sha256 != sha {
        let other = stored.sha256.clone();
        state.blobs.release(stored).await;
        return Err(bad("sha256", format!("the bytes' SHA-256 is {other}")));
    }
    // Its pin stays until the snapshot row names it
    // ([`BlobStore::release_workdir`] then) or expires.
    drop(stored);
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/workdir/blobs/{sha256}",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(
        ("session_id" = String, Path, description = "The run id"),
        ("sha256" = String, Path, description = "A blob the chat's kept directories name"),
    ),
    responses(
        (status = 200, description = "The bytes", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 401, description = "Not the run's workdir token", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No kept directory of the chat names it", body = crate::apidoc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn get_blob(
    State(state): State<Arc<AppState>>,
    Path((session_id, sha)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    let chat_id = match access(&state, &session_id, &headers).await? {
        Access::Turn { chat_id, .. } | Access::Reads { chat_id } => chat_id,
    };
    if !is_sha256(&sha) || !store::chat_names_blob(state.store.pool(), &chat_id, &sha).await? {
        return Err(WorkspaceError::NotFound(format!("blob {sha}")));
    }
    let blob = state.blobs.open_blob(&sha).await?;
    Ok(Body::from_stream(ReaderStream::new(blob)).into_response())
}

#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/workdir/snapshot",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The run id")),
    request_body(content = Object, content_type = "application/json", description = "`{\"manifest\": {..}}` or `{\"error\": \"..\"}`"),
    responses(
        (status = 204, description = "Kept"),
        (status = 400, description = "A bad manifest, or a blob it names is not stored", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 415, response = inline(crate::apidoc::NotJson)),
        (status = 422, description = "`invalid_request`: a JSON body of the wrong shape", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "Not the run's workdir token", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 403, description = "`forbidden`: a run started from a chat's directory keeps nothing", body = crate::apidoc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn snapshot(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    Json(report): Json<SnapshotReport>,
) -> Result<StatusCode, WorkspaceError> {
    let (workspace_id, chat_id) = authorize(&state, &session_id, &headers).await?;
    if let Some(m) = &report.manifest {
        m.check(workdir::DEFAULT_MAX_ENTRIES)
            .map_err(|e| bad("manifest", e))?;
        for sha in m.hashes() {
            if !state.blobs.has(&sha).await? {
                return Err(bad("manifest", format!("blob {sha} is not stored")));
            }
        }
    }
    let owner = store::Owner {
        workspace_id: &workspace_id,
        chat_id: &chat_id,
        run_id: Some(&session_id),
    };
    let now = state.now_ms();
    let keep = state.config.workdir_keep_turns;
    let mut tx = crate::store::begin_write(state.store.pool()).await?;
    store::insert(&mut tx, &session_id, &owner, &report, now).await?;
    let retired = store::retire_old(&mut tx, &chat_id, keep, now).await?;
    tx.commit().await?;
    state.blobs.release_workdir(&session_id).await;
    state.blobs.free_all(retired).await;
    Ok(StatusCode::NO_CONTENT)
}

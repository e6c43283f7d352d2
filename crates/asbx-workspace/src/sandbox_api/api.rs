//! Handlers of the in-sandbox workspace API, under
//! `/api/assistant/sandbox/{session_id}/workspace/` (docs/protocol.md §3).
//! The bearer is checked first, before a byte of a body is read.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::io::ReaderStream;

use crate::AppState;
use crate::apidoc as doc;
use crate::error::WorkspaceError;
use crate::sandbox_api::{self as sandbox, BagFile, DEFAULT_HISTORY, MAX_FILE_BYTES, MAX_HISTORY};

/// `GET files`: the bag.
#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/workspace/files",
    tag = "sandbox",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    responses(
        (status = 200, description = "The chat's files", body = Object),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
    ),
)]
pub(crate) async fn list_files(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, WorkspaceError> {
    let s = sandbox::authorize(&state, &session_id, &headers).await?;
    let files: Vec<BagFile> = sandbox::list(&state, &s)
        .await?
        .iter()
        .map(BagFile::from)
        .collect();
    Ok(Json(json!({ "files": files })))
}

/// `GET files/{id}`: the bytes, streamed from the blob store.
#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/workspace/files/{id}",
    tag = "sandbox",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)"), ("id" = String, Path, description = "The file id")),
    responses(
        (status = 200, description = "The file's bytes", body = Vec<u8>, content_type = "*/*"),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
        (status = 404, response = inline(doc::FileNotFound)),
    ),
)]
pub(crate) async fn read_file(
    State(state): State<Arc<AppState>>,
    Path((session_id, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    let s = sandbox::authorize(&state, &session_id, &headers).await?;
    let file = sandbox::file(&state, &s, &id).await?;
    let blob = state.blobs.open_blob(&file.sha256).await?;
    crate::audit::file(&state, seen(&file), false, "sandbox").await;
    let mut response = Response::new(Body::from_stream(ReaderStream::new(blob)));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&file.mime_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(u64::try_from(file.size).unwrap_or(0)),
    );
    if let Ok(v) = HeaderValue::from_str(&file.sha256) {
        h.insert("x-asbx-sha256", v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}

/// `POST files?path=<relative path>`: the raw body joins the bag.
#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/workspace/files",
    tag = "sandbox",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)"), ("path" = String, Query, description = "The new file's path")),
    request_body(content = Vec<u8>, content_type = "*/*"),
    responses(
        (status = 201, description = "The stored file", body = Object),
        (status = 400, description = "`invalid_request`: a bad path or content type", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
        (status = 413, description = "`body_too_large`: the file is over the limit", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn create_file(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, WorkspaceError> {
    let s = sandbox::authorize(&state, &session_id, &headers).await?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| {
            v.to_str()
                .map_err(|_| WorkspaceError::invalid("content-type is not ASCII"))
        })
        .transpose()?;
    let (path, mime) =
        sandbox::check_new_file(query.get("path").map(String::as_str), content_type)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_FILE_BYTES as u64) {
        return Err(WorkspaceError::BodyTooLarge {
            limit: MAX_FILE_BYTES,
        });
    }
    let row = sandbox::create(&state, &s, path, mime, body.into_data_stream()).await?;
    crate::audit::file(&state, seen(&row), true, "sandbox").await;
    Ok((StatusCode::CREATED, Json(BagFile::from(&row))).into_response())
}

/// `GET history?limit=N` (1..=100, default 20): the chat's newest messages,
/// oldest first.
#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/workspace/history",
    tag = "sandbox",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)"), ("limit" = Option<u32>, Query, description = "Most messages")),
    responses(
        (status = 200, description = "The chat's history", body = Object),
        (status = 400, description = "`invalid_request`: a bad `limit`", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
    ),
)]
pub(crate) async fn history(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Json<Value>, WorkspaceError> {
    let s = sandbox::authorize(&state, &session_id, &headers).await?;
    let limit = match query.get("limit") {
        None => DEFAULT_HISTORY,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_HISTORY).contains(n))
            .ok_or_else(|| {
                WorkspaceError::invalid_fields(vec![asbx_protocol::FieldError::new(
                    "limit",
                    format!("must be a whole number from 1 to {MAX_HISTORY}"),
                )])
            })?,
    };
    let messages = sandbox::history(&state, &s, limit).await?;
    Ok(Json(json!({ "messages": messages })))
}

/// A bag file as the audit log sees it.
fn seen(file: &crate::files::store::FileRow) -> crate::audit::FileSeen<'_> {
    crate::files::audit_seen(file)
}

//! `GET /api/files/{id}` (download a stored file) and `DELETE /api/files/{id}`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use tokio_util::io::ReaderStream;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::files::ascii_file_name;
use crate::files::store as files;

#[utoipa::path(
    get,
    path = "/api/files/{id}",
    tag = "files",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The file id")),
    responses(
        (status = 200, description = "The file's bytes, with its stored content type", body = Vec<u8>, content_type = "*/*"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::FileNotFound)),
    ),
)]
pub(crate) async fn download(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, WorkspaceError> {
    let file = files::get_in(state.store.pool(), &id, &caller.workspace_id)
        .await?
        .ok_or_else(|| WorkspaceError::NotFound(format!("file {id}")))?;
    let blob = state.blobs.open_blob(&file.sha256).await?;
    crate::audit::file(&state, crate::files::audit_seen(&file), false, "download").await;
    let mut response = Response::new(Body::from_stream(ReaderStream::new(blob)));
    let h = response.headers_mut();
    let content_type = HeaderValue::from_str(&file.mime_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_TYPE, content_type);
    h.insert(
        header::CONTENT_LENGTH,
        HeaderValue::from(file.size.max(0) as u64),
    );
    // Files come from sandboxes: never let a browser render one as a page of
    // this origin.
    let disposition = format!("attachment; filename=\"{}\"", ascii_file_name(&file.path));
    if let Ok(v) = HeaderValue::from_str(&disposition) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    Ok(response)
}

/// Deletes a file and frees its bytes, unless another file has the same.
#[utoipa::path(
    delete,
    path = "/api/files/{id}",
    tag = "files",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The file id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::FileNotFound)),
    ),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    let gone = files::soft_delete(
        state.store.pool(),
        &id,
        &caller.workspace_id,
        state.now_ms(),
    )
    .await?
    .ok_or_else(|| WorkspaceError::NotFound(format!("file {id}")))?;
    // The row first: a crash here leaks the bytes until a sweep.
    state.blobs.free_all([gone]).await;
    Ok(StatusCode::NO_CONTENT)
}

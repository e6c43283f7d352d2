//! `GET /`, `GET /healthz`, and the 404 fallback.

use axum::Json;
use axum::response::Html;

use crate::error::WorkspaceError;

const INDEX_HTML: &str = include_str!("../../assets/index.html");

pub(super) async fn index() -> Html<&'static str> {
    Html(INDEX_HTML)
}

pub(super) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

pub(super) async fn not_found(uri: axum::http::Uri) -> WorkspaceError {
    WorkspaceError::NotFound(format!("route {}", uri.path()))
}

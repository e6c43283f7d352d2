//! HTTP routes: the router and the small helpers handlers share.
//!
//! Handlers stay thin: extract, call one function of a service module,
//! answer. Every error is a [`WorkspaceError`].

mod agents;
mod callback;
mod chats;
mod files;
mod pages;
mod runs;
mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::routing::{get, post};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::error::WorkspaceError;
use crate::state::AppState;
use crate::writeback::MAX_RESULTS_BODY;

/// Largest JSON body of the ordinary API routes.
pub(crate) const MAX_JSON_BODY: usize = 8 * 1024 * 1024;

pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/assets/app.js", get(pages::app_js))
        .route("/assets/app.css", get(pages::app_css))
        .route("/healthz", get(pages::healthz))
        .route("/api/runs", post(runs::create))
        .route("/api/agents", get(agents::list).post(agents::create))
        .route(
            "/api/agents/{id}",
            get(agents::get).put(agents::update).delete(agents::delete),
        )
        .route("/api/agents/{id}/runs", post(agents::run))
        .route("/api/runs/{id}", get(runs::get))
        .route(
            "/api/files/{id}",
            get(files::download).delete(chats::delete_file),
        )
        .route(
            "/api/session",
            get(session::current)
                .post(session::sign_in)
                .delete(session::sign_out),
        )
        .route("/api/assistant/chat/stream", post(chats::turn))
        .route("/api/assistant/chats", get(chats::list))
        .route(
            "/api/assistant/chats/{id}",
            get(chats::detail).delete(chats::delete),
        )
        .route("/api/assistant/chats/{id}/stream", get(chats::resume))
        .route("/api/assistant/chats/{id}/cancel", post(chats::cancel))
        .route(
            "/api/assistant/files",
            post(chats::upload).layer(DefaultBodyLimit::max(crate::chat_view::MAX_UPLOAD_BYTES)),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/env",
            get(callback::env),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/config",
            get(callback::config),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/results",
            post(callback::results).layer(DefaultBodyLimit::max(MAX_RESULTS_BODY)),
        )
        .fallback(pages::not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// The body bytes, or 413 / 400 as problem+json.
pub(crate) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, WorkspaceError> {
    body.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            WorkspaceError::PayloadTooLarge { limit }
        } else {
            WorkspaceError::invalid(format!("could not read the body: {rejection}"))
        }
    })
}

/// Parses a JSON body, naming the problem on failure.
pub(crate) fn parse_json<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, WorkspaceError> {
    let bytes = body_bytes(body, MAX_JSON_BODY)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| WorkspaceError::invalid(format!("invalid JSON body: {e}")))
}

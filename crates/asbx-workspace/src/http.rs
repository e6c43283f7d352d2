//! The HTTP surface: the router over every feature's handlers, and the
//! small helpers handlers share.
//!
//! Handlers (in each feature's `api` module) stay thin: extract, call one
//! function of the feature, answer. Every error is a [`WorkspaceError`].

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::{HeaderMap, header};
use axum::middleware;
use axum::routing::{get, post};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::callbacks::writeback::MAX_RESULTS_BODY;
use crate::error::WorkspaceError;
use crate::state::AppState;
use crate::{agents, auth, callbacks, chats, files, guard, pages, runs};

/// Largest JSON body of the ordinary API routes.
pub(crate) const MAX_JSON_BODY: usize = 8 * 1024 * 1024;

pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/assets/app.js", get(pages::app_js))
        .route("/assets/app.css", get(pages::app_css))
        .route("/healthz", get(pages::healthz))
        .route("/api/runs", post(runs::api::create))
        .route(
            "/api/agents",
            get(agents::api::list).post(agents::api::create),
        )
        .route(
            "/api/agents/{id}",
            get(agents::api::get)
                .put(agents::api::update)
                .delete(agents::api::delete),
        )
        .route("/api/agents/{id}/runs", post(agents::api::run))
        .route("/api/runs/{id}", get(runs::api::get))
        .route(
            "/api/files/{id}",
            get(files::api::download).delete(files::api::delete),
        )
        .route(
            "/api/session",
            get(auth::api::current)
                .post(auth::api::sign_in)
                .delete(auth::api::sign_out),
        )
        .route("/api/assistant/chat/stream", post(chats::api::turn))
        .route("/api/assistant/chats", get(chats::api::list))
        .route(
            "/api/assistant/chats/{id}",
            get(chats::api::detail).delete(chats::api::delete),
        )
        .route("/api/assistant/chats/{id}/stream", get(chats::api::resume))
        .route("/api/assistant/chats/{id}/cancel", post(chats::api::cancel))
        .route(
            "/api/assistant/files",
            post(chats::api::upload).layer(DefaultBodyLimit::max(chats::view::MAX_UPLOAD_BYTES)),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/env",
            get(callbacks::api::env),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/config",
            get(callbacks::api::config),
        )
        .route(
            "/api/assistant/sandbox/{session_id}/results",
            post(callbacks::api::results).layer(DefaultBodyLimit::max(MAX_RESULTS_BODY)),
        )
        .fallback(pages::not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::host_and_origin,
        ))
        .layer(middleware::map_response(guard::problem_errors))
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

/// A JSON request body: `Content-Type: application/json` (else `415`,
/// before the body is read), at most the route's body limit (else `413`),
/// parsed into `T` (else `400` naming the problem).
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = WorkspaceError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json(req.headers())?;
        let body = Bytes::from_request(req, state).await;
        let bytes = body_bytes(body, MAX_JSON_BODY)?;
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| WorkspaceError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// `415` unless the request says its body is `application/json` (with
/// parameters such as `charset` allowed).
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), WorkspaceError> {
    let found = match headers.get(header::CONTENT_TYPE) {
        None => "no content type".to_owned(),
        Some(v) => {
            let text = v.to_str().unwrap_or("(not text)");
            let essence = text.split(';').next().unwrap_or("").trim();
            if essence.eq_ignore_ascii_case("application/json") {
                return Ok(());
            }
            text.chars().filter(|c| !c.is_control()).take(100).collect()
        }
    };
    Err(WorkspaceError::UnsupportedMediaType { found })
}

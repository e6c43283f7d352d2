//! HTTP handlers of the runner: thin, each delegating to `dispatch`,
//! `session` or `resume`. Auth is the [`Authorized`] extractor.

use std::sync::Arc;

use asbx_protocol::DispatchRequest;
use asbx_protocol::session::SessionInfo;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::Inner;
use crate::auth::Authorized;
use crate::error::RunnerError;
use crate::session::CancelCause;

/// Largest `POST /stream` body.
const MAX_BODY: usize = 2 << 20;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/stream", post(stream))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/events", get(crate::resume::events))
        .route(
            "/v1/sessions/{id}/tool-result",
            post(crate::resume::tool_result),
        )
        .with_state(inner)
}

/// `GET /healthz`: up, and how much room is left, which a workspace with a
/// runner fleet ranks runners by: `sessions` live, `warm` sandboxes booted
/// ahead, `capacity` (the most sandboxes at once) and `free` (how many more
/// dispatches fit now).
async fn healthz(State(inner): State<Arc<Inner>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "profile": inner.sandbox.profile().as_str(),
        "sessions": inner.sessions.running(),
        "warm": inner.pool.warm(),
        "capacity": inner.config.max_sandboxes,
        "free": inner.capacity.available_permits(),
    }))
}

/// `GET /metrics`: the Prometheus exposition, behind the runner's bearer
/// like every route but `/healthz`.
async fn metrics(_: Authorized, State(inner): State<Arc<Inner>>) -> Response {
    let body = crate::metrics::METRICS.render(inner.sessions.running(), inner.pool.warm());
    Response::builder()
        .header(
            axum::http::header::CONTENT_TYPE,
            asbx_protocol::exposition::CONTENT_TYPE,
        )
        .body(Body::from(body))
        .unwrap_or_default()
}

async fn list_sessions(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
) -> Result<Json<Vec<SessionInfo>>, RunnerError> {
    Ok(Json(inner.sessions.list()))
}

async fn get_session(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, RunnerError> {
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    Ok(Json(s.info()))
}

async fn delete_session(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<StatusCode, RunnerError> {
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    s.cancel(CancelCause::Deleted);
    Ok(StatusCode::ACCEPTED)
}

async fn stream(
    auth: Authorized,
    State(inner): State<Arc<Inner>>,
    body: Body,
) -> Result<Response, RunnerError> {
    let res = start_stream(auth, inner, body).await;
    if let Err(e) = &res {
        crate::metrics::METRICS.dispatch_refused(e.code());
    }
    res
}

async fn start_stream(
    _: Authorized,
    inner: Arc<Inner>,
    body: Body,
) -> Result<Response, RunnerError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            RunnerError::TooLarge(MAX_BODY)
        } else {
            RunnerError::InvalidRequest(vec![asbx_protocol::FieldError::new(
                "",
                format!("could not read the body: {e}"),
            )])
        }
    })?;
    let req = DispatchRequest::parse(&bytes).map_err(RunnerError::InvalidRequest)?;
    inner
        .config
        .check_agent_url(&req.agent_url)
        .map_err(|e| RunnerError::InvalidRequest(vec![e]))?;
    let session_id = req
        .session_id
        .clone()
        .unwrap_or_else(crate::dispatch::random_id);
    // The key is agreed before the session exists: a K that is not a point
    // on P-256 is a 400 like any other bad field (docs/protocol.md §4).
    let crypto = match &req.encryption {
        Some(e) => Some(
            asbx_crypto::ServerSession::new(&e.client_public_key, &session_id).map_err(|e| {
                RunnerError::InvalidRequest(vec![asbx_protocol::FieldError::new(
                    "encryption.client_public_key",
                    e.to_string(),
                )])
            })?,
        ),
        None => None,
    };
    let session = inner.sessions.insert(
        &session_id,
        req.protocol,
        std::time::Duration::from_millis(req.detach_grace_ms()),
    )?;
    if let Some(c) = crypto {
        session.set_crypto(c);
    }
    match crate::dispatch::start(&inner, &session, &req).await {
        Ok(res) => Ok(res),
        Err(e) => {
            inner.sessions.remove(&session_id);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests;

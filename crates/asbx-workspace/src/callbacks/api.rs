//! The sandbox callback routes (CONTRACT section 3): `/env`, `/config`,
//! `/results`, each redeeming its one-time token.

use std::sync::Arc;

use asbx_protocol::callback::{ConfigResponse, EnvResponse, ResultsResponse};
use axum::Json;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use bytes::Bytes;

use crate::callbacks;
use crate::callbacks::writeback::{self, MAX_RESULTS_BODY};
use crate::error::WorkspaceError;
use crate::state::AppState;
use crate::tokens::{TokenKind, bearer};

pub(crate) async fn env(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let env = callbacks::redeem_payload(&state, &session_id, token, TokenKind::Setup).await?;
    Ok(Json(env))
}

pub(crate) async fn config(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<ConfigResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let config = callbacks::redeem_payload(&state, &session_id, token, TokenKind::Run).await?;
    Ok(Json(config))
}

pub(crate) async fn results(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ResultsResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let body = crate::http::body_bytes(body, MAX_RESULTS_BODY)?;
    let stored = writeback::store_results(&state, &session_id, token, &body).await?;
    Ok(Json(stored))
}

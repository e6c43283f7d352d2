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
use crate::error::WorkspaceError;
use crate::state::AppState;
use crate::token::{TokenKind, bearer};
use crate::writeback::{self, MAX_RESULTS_BODY};

pub(super) async fn env(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let env = callbacks::redeem_payload(&state, &session_id, token, TokenKind::Setup).await?;
    Ok(Json(env))
}

pub(super) async fn config(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<ConfigResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let config = callbacks::redeem_payload(&state, &session_id, token, TokenKind::Run).await?;
    Ok(Json(config))
}

pub(super) async fn results(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<ResultsResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let body = super::body_bytes(body, MAX_RESULTS_BODY)?;
    let stored = writeback::store_results(&state, &session_id, token, &body).await?;
    Ok(Json(stored))
}

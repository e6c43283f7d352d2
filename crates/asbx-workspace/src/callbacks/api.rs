//! The sandbox callback routes (docs/protocol.md §3): `/env`, `/config`,
//! `/results`, each redeeming its one-time token.

use std::sync::Arc;

use asbx_protocol::callback::{ConfigResponse, EnvResponse, ResultsResponse};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};

use crate::AppState;
use crate::callbacks;
use crate::callbacks::writeback::{self, MAX_RESULTS_BODY};
use crate::error::WorkspaceError;
use crate::http::require_json;
use crate::tokens::{TokenKind, bearer};

pub(crate) async fn env(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let env = callbacks::redeem_env(&state, &session_id, token).await?;
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

/// The upload token is checked before a byte of the (up to 64 MiB) body is
/// read (issue 13, item 11): a wrong token is answered `401` at once and the
/// body is never buffered. The body is read only for a redeemable token.
pub(crate) async fn results(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ResultsResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    writeback::check_upload_token(&state, &session_id, token).await?;
    require_json(&headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_RESULTS_BODY as u64) {
        return Err(WorkspaceError::PayloadTooLarge {
            limit: MAX_RESULTS_BODY,
        });
    }
    let body = axum::body::to_bytes(body, MAX_RESULTS_BODY)
        .await
        .map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            {
                WorkspaceError::PayloadTooLarge {
                    limit: MAX_RESULTS_BODY,
                }
            } else {
                WorkspaceError::invalid(format!("could not read the body: {e}"))
            }
        })?;
    let stored = writeback::store_results(&state, &session_id, token, &body).await?;
    Ok(Json(stored))
}

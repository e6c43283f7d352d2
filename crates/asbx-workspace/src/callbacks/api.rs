//! The sandbox callback routes (docs/protocol.md §3): `/env`, `/config`,
//! `/results` (also under the seed's path, `/assets/writeback`), each
//! redeeming its one-time token.

use std::sync::Arc;

use asbx_protocol::callback::{ConfigResponse, EnvResponse, ResultsResponse};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};

use crate::AppState;
use crate::apidoc as doc;
use crate::callbacks;
use crate::callbacks::writeback::{self, MAX_RESULTS_BODY};
use crate::error::WorkspaceError;
use crate::http::require_json;
use crate::tokens::{TokenKind, bearer};

#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/env",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    responses(
        (status = 200, description = "The sandbox's environment", body = doc::EnvResponse),
        (status = 401, description = "`unauthorized`: no bearer token; `otp_rejected`: the one-time token is unknown, expired, used or not this session's", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn env(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let strips = headers.contains_key(asbx_protocol::gateway::STRIPS_INJECTED_SECRETS);
    let env = callbacks::redeem_env(&state, &session_id, token, strips).await?;
    Ok(Json(env))
}

#[utoipa::path(
    get,
    path = "/api/assistant/sandbox/{session_id}/config",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    responses(
        (status = 200, description = "The agent's configuration", body = doc::ConfigResponse),
        (status = 401, description = "`unauthorized`: no bearer token; `otp_rejected`: the one-time token is unknown, expired, used or not this session's", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn config(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<ConfigResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let config = callbacks::redeem_payload(&state, &session_id, token, TokenKind::Run).await?;
    Ok(Json(config))
}

/// The seed's name of [`results`] (`POST {agentUrl}/assets/writeback`):
/// the same route, under the path a sandbox built for the seed calls.
#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/assets/writeback",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    request_body(content = doc::ResultsRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The stored result files", body = doc::ResultsResponse),
        (status = 400, description = "`invalid_request`: the body or a field is wrong (`errors` names each)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no bearer token; `otp_rejected`: the one-time token is unknown, expired, used or not this session's", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, description = "`body_too_large`: the results are over the limit", body = doc::Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn assets_writeback(
    state: State<Arc<AppState>>,
    session_id: Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ResultsResponse>, WorkspaceError> {
    results(state, session_id, headers, body).await
}

/// The upload token is checked before a byte of the (up to 64 MiB) body is
/// read (issue 13, item 11): a wrong token is answered `401` at once and the
/// body is never buffered. The body is read only for a redeemable token.
#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/results",
    tag = "callbacks",
    security(("sandbox_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    request_body(content = doc::ResultsRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The stored result files", body = doc::ResultsResponse),
        (status = 400, description = "`invalid_request`: the body or a field is wrong (`errors` names each)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: no bearer token; `otp_rejected`: the one-time token is unknown, expired, used or not this session's", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, description = "`body_too_large`: the results are over the limit", body = doc::Problem, content_type = "application/problem+json"),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json`", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
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
        return Err(WorkspaceError::BodyTooLarge {
            limit: MAX_RESULTS_BODY,
        });
    }
    let body = axum::body::to_bytes(body, MAX_RESULTS_BODY)
        .await
        .map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            {
                WorkspaceError::BodyTooLarge {
                    limit: MAX_RESULTS_BODY,
                }
            } else {
                WorkspaceError::invalid(format!("could not read the body: {e}"))
            }
        })?;
    let stored = writeback::store_results(&state, &session_id, token, &body).await?;
    Ok(Json(stored))
}

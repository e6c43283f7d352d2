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
use crate::callbacks::replay::RequestId;
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
        (status = 401, response = inline(doc::SandboxTokenRejected)),
    ),
)]
pub(crate) async fn env(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<EnvResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let request = RequestId::from_headers(&headers)?;
    let strips = headers.contains_key(asbx_protocol::gateway::STRIPS_INJECTED_SECRETS);
    let env = callbacks::redeem_env(&state, &session_id, token, request.as_ref(), strips).await?;
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
        (status = 401, response = inline(doc::SandboxTokenRejected)),
    ),
)]
pub(crate) async fn config(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<ConfigResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let request = RequestId::from_headers(&headers)?;
    let config =
        callbacks::redeem_payload(&state, &session_id, token, TokenKind::Run, request.as_ref())
            .await?;
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
        (status = 400, response = inline(doc::BadFields)),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
        (status = 413, response = inline(doc::ResultsTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
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
        (status = 400, response = inline(doc::BadFields)),
        (status = 401, response = inline(doc::SandboxTokenRejected)),
        (status = 413, response = inline(doc::ResultsTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn results(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ResultsResponse>, WorkspaceError> {
    let token = bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let request = RequestId::from_headers(&headers)?;
    if let Some(answer) =
        writeback::check_upload_token(&state, &session_id, token, request.as_ref()).await?
    {
        // The retry of a redemption whose answer was lost: the files it
        // stored, once more; its body is not read.
        return Ok(Json(answer));
    }
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
    let stored =
        writeback::store_results(&state, &session_id, token, request.as_ref(), &body).await?;
    Ok(Json(stored))
}

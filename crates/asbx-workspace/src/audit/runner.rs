//! The runner's reports: each dispatch to one of the operator's runners
//! carries a fresh audit token in a header (`x-asbx-audit-token`, never in
//! the body the agent sees); the runner posts its session's egress and
//! model-call events to `POST /api/assistant/sandbox/{session_id}/audit`
//! with it. Only the token's hash is stored (`audit_tokens`).

use std::sync::Arc;

use asbx_protocol::audit::{AUDIT_VERSION, AUDIT_VERSION_HEADER, AuditEvent, RunnerAuditBatch};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use sqlx::Row as _;

use crate::AppState;
use crate::apidoc as doc;
use crate::audit::store;
use crate::error::WorkspaceError;
use crate::http::JsonBody;
use crate::tokens;

/// Prefix of runner audit tokens.
const AUDIT_PREFIX: &str = "asbx_aud_";

/// How long after its runtime cap a token still takes reports.
const GRACE_MS: i64 = 10 * 60 * 1000;

/// Mints the audit token of run `run_id` (good for `cap_ms` and a grace);
/// the plaintext, for the dispatch's header.
pub(crate) async fn mint(
    state: &AppState,
    run_id: &str,
    cap_ms: u64,
) -> Result<String, WorkspaceError> {
    let token = tokens::mint(AUDIT_PREFIX);
    let expires = state
        .now_ms()
        .saturating_add(i64::try_from(cap_ms).unwrap_or(i64::MAX / 2))
        .saturating_add(GRACE_MS);
    sqlx::query(
        "INSERT INTO audit_tokens (run_id, token_hash, expires_at) VALUES ($1, $2, $3) \
         ON CONFLICT (run_id) DO UPDATE SET token_hash = $2, expires_at = $3",
    )
    .bind(run_id)
    .bind(&token.hash)
    .bind(expires)
    .execute(state.store.pool())
    .await?;
    Ok(token.plaintext)
}

#[utoipa::path(
    post,
    path = "/api/assistant/sandbox/{session_id}/audit",
    tag = "audit",
    security(("runner_audit_token" = [])),
    params(("session_id" = String, Path, description = "The sandbox session id (the run id)")),
    request_body(content = doc::RunnerAuditBatch, content_type = "application/json"),
    responses(
        (status = 204, description = "The events are appended to the run's workspace's audit chain"),
        (status = 400, description = "`invalid_request`: not a report, an event the runner may not report, or an unknown `x-asbx-audit-version`", body = doc::Problem, content_type = "application/problem+json"),
        (status = 415, response = inline(crate::apidoc::NotJson)),
        (status = 422, description = "`invalid_request`: a JSON body of the wrong shape", body = crate::apidoc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: not this run's audit token, or it expired", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn report(
    State(state): State<Arc<AppState>>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    JsonBody(batch): JsonBody<RunnerAuditBatch>,
) -> Result<StatusCode, WorkspaceError> {
    let token = tokens::bearer(&headers).ok_or(WorkspaceError::Unauthorized)?;
    let version = headers
        .get(AUDIT_VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u32>().ok());
    if version != Some(AUDIT_VERSION) {
        return Err(WorkspaceError::invalid(format!(
            "{AUDIT_VERSION_HEADER} must be {AUDIT_VERSION}"
        )));
    }
    if batch.events.len() > asbx_protocol::audit::MAX_BATCH_EVENTS {
        return Err(WorkspaceError::invalid("too many events in one report"));
    }
    if let Some(e) = batch.events.iter().find(|e| !e.is_runner_kind()) {
        return Err(WorkspaceError::invalid(format!(
            "a runner may not report {:?} events",
            serde_json::to_value(e)
                .ok()
                .and_then(|v| v.get("kind").cloned())
                .unwrap_or_default()
        )));
    }
    let row = sqlx::query(
        "SELECT r.workspace_id FROM audit_tokens a JOIN runs r ON r.id = a.run_id \
         WHERE a.run_id = $1 AND a.token_hash = $2 AND a.expires_at > $3",
    )
    .bind(&session_id)
    .bind(tokens::hash(token))
    .bind(state.now_ms())
    .fetch_optional(state.store.pool())
    .await?
    .ok_or(WorkspaceError::Unauthorized)?;
    let workspace: String = row.try_get(0)?;
    let ts = state.now_ms();
    let tokens = batch.events.iter().fold(0u64, |sum, e| match e {
        AuditEvent::ModelCall {
            input_tokens,
            output_tokens,
            ..
        } => sum
            .saturating_add(input_tokens.unwrap_or(0))
            .saturating_add(output_tokens.unwrap_or(0)),
        _ => sum,
    });
    let pending = super::Scope::run(&session_id).pending(&workspace, ts, batch.events);
    store::append(state.store.pool(), &workspace, &pending).await?;
    // The model calls' tokens count against `tokens-per-day` as they come.
    // The report is stored: a failure here must not make the runner send
    // it again (twice in the chain); the run's `session_ended` counts them.
    if let Err(e) =
        crate::quota::enforce::tokens_used(&state, &workspace, &session_id, tokens).await
    {
        tracing::warn!(run = %session_id, error = %crate::error::error_chain(&e), "counting a report's tokens failed");
    }
    Ok(StatusCode::NO_CONTENT)
}

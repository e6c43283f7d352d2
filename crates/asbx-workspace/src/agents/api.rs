//! `/api/agents`: stored agents (CRUD) and `POST /api/agents/{id}/runs`,
//! which streams the runner's NDJSON straight through, like `/api/runs`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

use crate::AppState;
use crate::agents;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::wire::{AGENT_ID_HEADER, AgentDefinition, AgentList, AgentRecord, AgentRunRequest};

#[utoipa::path(
    post,
    path = "/api/agents",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    request_body(content = AgentDefinition, content_type = "application/json"),
    responses(
        (status = 201, description = "The stored agent", body = AgentRecord),
        (status = 400, response = inline(doc::BadRunSettings)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 409, response = inline(doc::NamedEnvironmentMissing)),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(definition): JsonBody<AgentDefinition, MAX_DEFINITION_BODY>,
) -> Result<(StatusCode, Json<AgentRecord>), WorkspaceError> {
    let agent = agents::create(&state, &caller.workspace_id, definition).await?;
    Ok((StatusCode::CREATED, Json(agent)))
}

#[utoipa::path(
    get,
    path = "/api/agents",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The stored agents", body = AgentList),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<AgentList>, WorkspaceError> {
    let agents = agents::list(&state, &caller.workspace_id).await?;
    Ok(Json(AgentList { agents }))
}

#[utoipa::path(
    get,
    path = "/api/agents/{id}",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The agent id")),
    responses(
        (status = 200, description = "The agent", body = AgentRecord),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::AgentNotFound)),
    ),
)]
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<AgentRecord>, WorkspaceError> {
    Ok(Json(agents::get(&state, &caller.workspace_id, &id).await?))
}

#[utoipa::path(
    put,
    path = "/api/agents/{id}",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The agent id")),
    request_body(content = AgentDefinition, content_type = "application/json"),
    responses(
        (status = 200, description = "The agent as stored now", body = AgentRecord),
        (status = 400, response = inline(doc::BadRunSettings)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::AgentNotFound)),
        (status = 409, response = inline(doc::NamedEnvironmentMissing)),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(definition): JsonBody<AgentDefinition, MAX_DEFINITION_BODY>,
) -> Result<Json<AgentRecord>, WorkspaceError> {
    let agent = agents::update(&state, &caller.workspace_id, &id, definition).await?;
    Ok(Json(agent))
}

#[utoipa::path(
    delete,
    path = "/api/agents/{id}",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The agent id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::AgentNotFound)),
    ),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    agents::delete(&state, &caller.workspace_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(
    post,
    path = "/api/agents/{id}/runs",
    tag = "agents",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The agent id")),
    request_body(content = AgentRunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The run's lines as the runner streams them", body = doc::Line, content_type = "application/x-ndjson", headers(("x-asbx-run-id" = String, description = "The run id"))),
        (status = 400, response = inline(doc::BadRunSettings)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::AgentNotFound)),
        (status = 409, description = "`conflict`: the agent's environment was deleted", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
        (status = 429, response = inline(doc::QuotaExceeded)),
        (status = 502, response = inline(doc::UpstreamFailed)),
        (status = 503, response = inline(doc::RunnerUnavailable)),
    ),
)]
pub(crate) async fn run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<AgentRunRequest>,
) -> Result<Response, WorkspaceError> {
    let mut errors = Vec::new();
    let stream = crate::runs::request::options(
        request.protocol.as_ref(),
        request.filter.as_ref(),
        request.client_tools.as_ref(),
        request.encryption.as_ref(),
        &mut errors,
    );
    if !errors.is_empty() {
        errors.extend(crate::validate::agent_run_request(&request));
        return Err(WorkspaceError::invalid_fields(errors));
    }
    let spec = agents::run_spec(&state, &caller.workspace_id, &id, request).await?;
    let agent_id = HeaderValue::from_str(spec.agent_id.as_deref().unwrap_or_default())
        .map_err(|_| WorkspaceError::Corrupt("agent id".into()))?;
    let mut response = crate::runs::api::stream_response(state, &spec, &stream, None).await?;
    response.headers_mut().insert(AGENT_ID_HEADER, agent_id);
    Ok(response)
}

//! `/api/agents`: stored agents (CRUD) and `POST /api/agents/{id}/runs`,
//! which streams the runner's NDJSON straight through, like `/api/runs`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

use crate::AppState;
use crate::agents;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::wire::{AGENT_ID_HEADER, AgentDefinition, AgentList, AgentRecord, AgentRunRequest};

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(definition): JsonBody<AgentDefinition, MAX_DEFINITION_BODY>,
) -> Result<(StatusCode, Json<AgentRecord>), WorkspaceError> {
    let agent = agents::create(&state, &caller.workspace_id, definition).await?;
    Ok((StatusCode::CREATED, Json(agent)))
}

pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<AgentList>, WorkspaceError> {
    let agents = agents::list(&state, &caller.workspace_id).await?;
    Ok(Json(AgentList { agents }))
}

pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<AgentRecord>, WorkspaceError> {
    Ok(Json(agents::get(&state, &caller.workspace_id, &id).await?))
}

pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(definition): JsonBody<AgentDefinition, MAX_DEFINITION_BODY>,
) -> Result<Json<AgentRecord>, WorkspaceError> {
    let agent = agents::update(&state, &caller.workspace_id, &id, definition).await?;
    Ok(Json(agent))
}

pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    agents::delete(&state, &caller.workspace_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

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
    let mut response = crate::runs::api::stream_response(state, &spec, &stream).await?;
    response.headers_mut().insert(AGENT_ID_HEADER, agent_id);
    Ok(response)
}

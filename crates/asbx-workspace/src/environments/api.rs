//! `/api/environments` (CRUD of named environments), `GET /api/models` and
//! `PUT /api/assistant/chats/{id}/settings`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use crate::AppState;
use crate::auth::Caller;
use crate::environments;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::wire::{
    ChatSettings, ChatSettingsView, EnvironmentBody, EnvironmentList, EnvironmentRecord, ModelList,
};

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody<EnvironmentBody>,
) -> Result<(StatusCode, Json<EnvironmentRecord>), WorkspaceError> {
    let env = environments::create(&state, &caller.workspace_id, body).await?;
    Ok((StatusCode::CREATED, Json(env)))
}

pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<EnvironmentList>, WorkspaceError> {
    let environments = environments::list(&state, &caller.workspace_id).await?;
    Ok(Json(EnvironmentList { environments }))
}

pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EnvironmentRecord>, WorkspaceError> {
    Ok(Json(
        environments::get(&state, &caller.workspace_id, &id).await?,
    ))
}

pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<EnvironmentBody>,
) -> Result<Json<EnvironmentRecord>, WorkspaceError> {
    let env = environments::update(&state, &caller.workspace_id, &id, body).await?;
    Ok(Json(env))
}

pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    environments::delete(&state, &caller.workspace_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/models`: any caller of the workspace may list them.
pub(crate) async fn models(State(state): State<Arc<AppState>>, _caller: Caller) -> Json<ModelList> {
    Json(environments::models(&state))
}

/// `PUT /api/assistant/chats/{id}/settings`.
pub(crate) async fn put_chat_settings(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(chat_id): Path<String>,
    JsonBody(settings): JsonBody<ChatSettings, MAX_DEFINITION_BODY>,
) -> Result<Json<ChatSettingsView>, WorkspaceError> {
    let view =
        environments::put_chat_settings(&state, &caller.workspace_id, &chat_id, settings).await?;
    state
        .chat_events
        .emit(&caller.workspace_id, &chat_id, None, "updated");
    Ok(Json(view))
}

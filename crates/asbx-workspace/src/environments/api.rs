//! `/api/environments` (CRUD of named environments), `GET /api/models` and
//! `PUT /api/assistant/chats/{id}/settings`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::environments;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::wire::{
    ChatSettings, ChatSettingsView, EnvironmentBody, EnvironmentList, EnvironmentRecord, ModelList,
};

#[utoipa::path(
    post,
    path = "/api/environments",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    request_body(content = EnvironmentBody, content_type = "application/json"),
    responses(
        (status = 201, description = "The environment (secrets by name only)", body = EnvironmentRecord),
        (status = 400, response = inline(doc::BadEnvironment)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 409, response = inline(doc::NameTaken)),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody<EnvironmentBody>,
) -> Result<(StatusCode, Json<EnvironmentRecord>), WorkspaceError> {
    let env = environments::create(&state, &caller.workspace_id, body).await?;
    Ok((StatusCode::CREATED, Json(env)))
}

#[utoipa::path(
    get,
    path = "/api/environments",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The environments", body = EnvironmentList),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<EnvironmentList>, WorkspaceError> {
    let environments = environments::list(&state, &caller.workspace_id).await?;
    Ok(Json(EnvironmentList { environments }))
}

#[utoipa::path(
    get,
    path = "/api/environments/{id}",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The environment id")),
    responses(
        (status = 200, description = "The environment", body = EnvironmentRecord),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::EnvironmentNotFound)),
    ),
)]
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<EnvironmentRecord>, WorkspaceError> {
    Ok(Json(
        environments::get(&state, &caller.workspace_id, &id).await?,
    ))
}

#[utoipa::path(
    put,
    path = "/api/environments/{id}",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The environment id")),
    request_body(content = EnvironmentBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The environment as stored now", body = EnvironmentRecord),
        (status = 400, response = inline(doc::BadEnvironment)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::EnvironmentNotFound)),
        (status = 409, response = inline(doc::NameTaken)),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<EnvironmentBody>,
) -> Result<Json<EnvironmentRecord>, WorkspaceError> {
    let env = environments::update(&state, &caller.workspace_id, &id, body).await?;
    Ok(Json(env))
}

#[utoipa::path(
    delete,
    path = "/api/environments/{id}",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The environment id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::EnvironmentNotFound)),
        (status = 409, description = "`conflict`: an agent or chat still names it", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    environments::delete(&state, &caller.workspace_id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/models`: any caller of the workspace may list them.
#[utoipa::path(
    get,
    path = "/api/models",
    tag = "environments",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The models a chat may choose, the default first", body = ModelList),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn models(State(state): State<Arc<AppState>>, _caller: Caller) -> Json<ModelList> {
    Json(environments::models(&state))
}

/// `PUT /api/assistant/chats/{id}/settings`.
#[utoipa::path(
    put,
    path = "/api/assistant/chats/{id}/settings",
    tag = "chats",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The chat id")),
    request_body(content = ChatSettings, content_type = "application/json"),
    responses(
        (status = 200, description = "The chat's settings as stored now, with the effective model and prompt", body = ChatSettingsView),
        (status = 400, response = inline(doc::BadFieldsOrModel)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::ChatNotFound)),
        (status = 409, description = "`conflict`: the environment does not exist", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
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

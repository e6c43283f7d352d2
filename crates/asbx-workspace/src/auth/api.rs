//! `/api/session`: browser sign-in (trade an API key for an HttpOnly
//! session cookie), sign-out, and who is signed in.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::store as keys;
use crate::auth::{self, Caller};
use crate::error::WorkspaceError;
use crate::http::JsonBody;
use crate::tokens;
use crate::wire::{SessionInfo, SignIn};

#[utoipa::path(
    post,
    path = "/api/session",
    tag = "session",
    request_body(content = SignIn, content_type = "application/json"),
    responses(
        (status = 200, description = "Signed in: `Set-Cookie` carries the session", body = SessionInfo,
            headers(("Set-Cookie" = String, description = "The `asbx_session` cookie"))),
        (status = 400, description = "`invalid_request`: not a sign-in body", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, description = "`unauthorized`: the API key is wrong", body = doc::Problem, content_type = "application/problem+json"),
        (status = 415, response = inline(doc::NotJson)),
    ),
)]
pub(crate) async fn sign_in(
    State(state): State<Arc<AppState>>,
    JsonBody(request): JsonBody<SignIn>,
) -> Result<Response, WorkspaceError> {
    let (session, workspace_id) = auth::sign_in(&state, &request.api_key).await?;
    let info = info(&state, workspace_id).await?;
    let secure = state.config.public_url.scheme() == "https";
    let mut r = (StatusCode::OK, Json(info)).into_response();
    let cookie = HeaderValue::from_str(&auth::cookie_header(&session, secure))
        .map_err(|_| WorkspaceError::Corrupt("session cookie".into()))?;
    r.headers_mut().insert(header::SET_COOKIE, cookie);
    Ok(r)
}

#[utoipa::path(
    delete,
    path = "/api/session",
    tag = "session",
    responses((status = 204, description = "Signed out: the cookie is cleared")),
)]
pub(crate) async fn sign_out(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    if let Some(session) = auth::session_cookie(&headers) {
        keys::delete_session(state.store.pool(), &tokens::hash(session)).await?;
    }
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let Ok(v) = HeaderValue::from_str(&auth::cookie_header("", false)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

#[utoipa::path(
    get,
    path = "/api/session",
    tag = "session",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The workspace the caller acts in", body = SessionInfo),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn current(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<SessionInfo>, WorkspaceError> {
    Ok(Json(info(&state, caller.workspace_id).await?))
}

async fn info(state: &AppState, workspace_id: String) -> Result<SessionInfo, WorkspaceError> {
    let workspace_name = keys::workspace_name(state.store.pool(), &workspace_id)
        .await?
        .unwrap_or_default();
    Ok(SessionInfo {
        workspace_id,
        workspace_name,
    })
}

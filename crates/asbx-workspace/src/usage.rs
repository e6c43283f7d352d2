//! `GET /api/usage`: the caller's workspace's quotas and usage
//! (CONTRACT.md §10). Apart from `quota`, which `auth` uses to count
//! requests: this handler needs the caller (`auth`).

use std::sync::Arc;

use axum::Json;
use axum::extract::State;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::wire::Usage;

#[utoipa::path(
    get,
    path = "/api/usage",
    tag = "usage",
    security((), ("api_key" = []), ("session_cookie" = [])),
    responses(
        (status = 200, description = "The workspace's quotas (`null`: unlimited) and usage, by quota name", body = Usage),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 429, response = inline(doc::QuotaExceeded)),
    ),
)]
pub(crate) async fn usage(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Usage>, WorkspaceError> {
    Ok(Json(
        crate::quota::report::of(&state, &caller.workspace_id, &caller.subject).await?,
    ))
}

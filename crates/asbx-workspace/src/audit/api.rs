//! Reading the audit log: `GET /api/audit?after=&limit=` (the caller's
//! workspace) and `GET /api/runs/{id}/audit` (one run's records), both
//! NDJSON, one stored record a line, oldest first.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde::Deserialize;

use crate::AppState;
use crate::apidoc as doc;
use crate::audit::store;
use crate::auth::Caller;
use crate::error::WorkspaceError;

/// Records a page holds by default and at most.
pub(crate) const DEFAULT_LIMIT: i64 = 1_000;
pub(crate) const MAX_LIMIT: i64 = 10_000;

/// `?after=ID&limit=N`: records with `id` above `after` (default 0), at
/// most `limit` (default 1,000, at most 10,000).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Records with `id` above this.
    #[serde(default)]
    after: Option<i64>,
    /// At most this many (1 to 10,000; default 1,000).
    #[serde(default)]
    limit: Option<i64>,
}

impl AuditQuery {
    fn bounds(&self) -> Result<(i64, i64), WorkspaceError> {
        let after = self.after.unwrap_or(0);
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if after < 0 || !(1..=MAX_LIMIT).contains(&limit) {
            return Err(WorkspaceError::invalid(
                "after must be 0 or more and limit 1 to 10000",
            ));
        }
        Ok((after, limit))
    }
}

#[utoipa::path(
    get,
    path = "/api/audit",
    tag = "audit",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "The workspace's audit records after `after`, oldest first, one JSON record a line: `id`, `ts`, `workspace`, `runId`?, `sessionId`?, `kind` and its fields, `prevHash`, `hash`", body = doc::AuditEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "`invalid_request`: `after` or `limit` out of range", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Query(query): Query<AuditQuery>,
) -> Result<Response, WorkspaceError> {
    let (after, limit) = query.bounds()?;
    let rows = store::page(state.store.pool(), &caller.workspace_id, None, after, limit).await?;
    Ok(ndjson(rows))
}

#[utoipa::path(
    get,
    path = "/api/runs/{id}/audit",
    tag = "audit",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The run id"), AuditQuery),
    responses(
        (status = 200, description = "The run's audit records, oldest first, one JSON record a line", body = doc::AuditEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "`invalid_request`: `after` or `limit` out of range", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::RunNotFound)),
    ),
)]
pub(crate) async fn of_run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<AuditQuery>,
) -> Result<Response, WorkspaceError> {
    let (after, limit) = query.bounds()?;
    // Another workspace's run is not found, as everywhere.
    let owner = store::run_workspace(state.store.pool(), &id).await?;
    if owner.as_deref() != Some(caller.workspace_id.as_str()) {
        return Err(WorkspaceError::NotFound(format!("run {id}")));
    }
    let rows = store::page(
        state.store.pool(),
        &caller.workspace_id,
        Some(&id),
        after,
        limit,
    )
    .await?;
    Ok(ndjson(rows))
}

fn ndjson(rows: Vec<(i64, String)>) -> Response {
    let mut out = String::with_capacity(rows.iter().map(|r| r.1.len() + 1).sum());
    for (_, text) in rows {
        out.push_str(&text);
        out.push('\n');
    }
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

//! `POST /api/runs` (dispatch and relay NDJSON) and `GET /api/runs/{id}`.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::AppState;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::runs::dispatch::{self, RunSpec, Started};
use crate::runs::{relay, request as run_request, view as runs_view};
use crate::wire::{CreateRunRequest, RUN_ID_HEADER, RunRecord};

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(request): JsonBody<CreateRunRequest, MAX_DEFINITION_BODY>,
) -> Result<Response, WorkspaceError> {
    let spec = run_request::to_spec(
        request,
        &caller.workspace_id,
        &state.config.default_model,
        state.config.sandbox_url.as_ref(),
    )?;
    stream_response(state, &spec).await
}

/// Dispatches `spec` and answers with the runner's NDJSON relayed unchanged
/// (or its rejection passed through), the run id in `x-asbx-run-id`.
pub(crate) async fn stream_response(
    state: Arc<AppState>,
    spec: &RunSpec,
) -> Result<Response, WorkspaceError> {
    let started = dispatch::start(&state, spec).await?;
    let run_id =
        HeaderValue::from_str(&spec.id).map_err(|_| WorkspaceError::Corrupt("run id".into()))?;
    let mut response = match started {
        Started::Streaming { response } => {
            let body = relay::ndjson_body(Arc::clone(&state), spec.id.clone(), response);
            let mut r = Response::new(body);
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            );
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            r
        }
        Started::Rejected {
            status,
            content_type,
            body,
        } => {
            let mut r = (status, Body::from(body)).into_response();
            if let Some(ct) = content_type {
                r.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            r
        }
    };
    response.headers_mut().insert(RUN_ID_HEADER, run_id);
    Ok(response)
}

pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<RunRecord>), WorkspaceError> {
    let record = runs_view::load(&state, &caller.workspace_id, &id).await?;
    Ok((StatusCode::OK, Json(record)))
}

//! The API for runs (docs/protocol.md §7, docs/api-runs.md): `POST /api/runs`
//! (dispatch and relay NDJSON), `GET /api/runs/{id}`, its `events` (replay
//! and live tail), `tool-result` (a client tool's answer, forwarded to the
//! runner) and `DELETE` (cancel). Every route sees only the caller's
//! workspace: another workspace's run is not found.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;

use crate::AppState;
use crate::apidoc as doc;
use crate::auth::Caller;
use crate::error::WorkspaceError;
use crate::http::{JsonBody, MAX_DEFINITION_BODY};
use crate::quota::notice;
use crate::runs::dispatch::{self, RunSpec, Started};
use crate::runs::request::Stream;
use crate::runs::store::{self as runs, Outcome, RunRow};
use crate::runs::{events, relay, request as run_request, view as runs_view};
use crate::wire::{
    CreateRunRequest, EventsQuery, RUN_ID_HEADER, RunRecord, RunStatus, ToolResultRequest,
};

#[utoipa::path(
    post,
    path = "/api/runs",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    request_body(content = CreateRunRequest, content_type = "application/json"),
    params(("Prefer" = Option<String>, Header, description = "`queued-notice` (protocol 2): when the run must wait for its fair share of the runners, answer `200` at once, the body opening with `{\"type\":\"queued\",\"quota\",\"waitS\"}` lines (no `seq`), then the run's lines, or one `{\"type\":\"refused\",\"status\",\"retryAfter\"?,\"problem\"}` line (docs/api-usage.md)")),
    responses(
        (status = 200, description = "The run's lines as the runner streams them", body = doc::Line, content_type = "application/x-ndjson", headers(("x-asbx-run-id" = String, description = "The run id"))),
        (status = 400, response = inline(doc::BadRunSettings)),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
        (status = 404, description = "`not_found`: no chat `workdir.from` in this workspace", body = doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "`conflict`: a named environment was deleted meanwhile; `workdir_not_kept`: the chat `workdir.from` kept no working directory (at that message)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 410, description = "`workdir_gone`: that working directory's bytes are no longer kept (past `ASBX_WORKDIR_KEEP_TURNS`)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 429, response = inline(doc::QuotaExceeded)),
        (status = 502, response = inline(doc::UpstreamFailed)),
        (status = 503, response = inline(doc::RunnerUnavailable)),
    ),
)]
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    JsonBody(request): JsonBody<CreateRunRequest, MAX_DEFINITION_BODY>,
) -> Result<Response, WorkspaceError> {
    let (spec, stream) = run_request::to_spec(&state, request, &caller.workspace_id).await?;
    // Protocol 2 only: protocol 1's consumers know no line but its four.
    let wanted = stream.protocol2 && notice::wanted(&headers);
    let run_id =
        HeaderValue::from_str(&spec.id).map_err(|_| WorkspaceError::Corrupt("run id".into()))?;
    let mut r = notice::answer(wanted, notice::Framing::Ndjson, move |notify| async move {
        stream_response(state, &spec, &stream, notify).await
    })
    .await?;
    // Answered while queued too: the id the run has once admitted.
    r.headers_mut().entry(RUN_ID_HEADER).or_insert(run_id);
    Ok(r)
}

fn ndjson_headers(r: &mut Response) {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
}

/// Dispatches `spec` and answers with its lines (protocol 2 as they are,
/// or protocol 1's, see [`relay::protocol1_body`]) or the runner's
/// rejection passed through, the run id in `x-asbx-run-id`. The run is
/// relayed by a task of its own: a protocol 2 caller that goes away can
/// resume with `GET /api/runs/{id}/events`. `notify` is told if the
/// dispatch waits for its fair share ([`notice`]).
pub(crate) async fn stream_response(
    state: Arc<AppState>,
    spec: &RunSpec,
    stream: &Stream,
    notify: notice::Notify,
) -> Result<Response, WorkspaceError> {
    let started = dispatch::start_with(&state, spec, &stream.options, notify).await?;
    let run_id =
        HeaderValue::from_str(&spec.id).map_err(|_| WorkspaceError::Corrupt("run id".into()))?;
    let mut response = match started {
        Started::Streaming { response } => {
            // Open the broadcast, subscribe, then start relaying: the
            // caller misses no line.
            let live = state.run_hub.open(&spec.id);
            let body = if stream.protocol2 {
                relay::protocol2_body(Arc::clone(&state), spec.id.clone())
            } else {
                relay::protocol1_body(Arc::clone(&state), spec.id.clone(), &live)
            };
            relay::spawn(Arc::clone(&state), spec.id.clone(), live, response);
            let mut r = Response::new(body);
            ndjson_headers(&mut r);
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

#[utoipa::path(
    get,
    path = "/api/runs/{id}",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The run id")),
    responses(
        (status = 200, description = "The run", body = RunRecord),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::RunNotFound)),
    ),
)]
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<RunRecord>), WorkspaceError> {
    let run = own_run(&state, &caller.workspace_id, &id).await?;
    crate::runs::lost::settle_if_lost(&state, &run).await;
    let record = runs_view::load(&state, &caller.workspace_id, &id).await?;
    Ok((StatusCode::OK, Json(record)))
}

/// A run of the caller's workspace, or not found.
async fn own_run(state: &AppState, workspace_id: &str, id: &str) -> Result<RunRow, WorkspaceError> {
    runs::get(state.store.pool(), id)
        .await?
        .filter(|r| r.workspace_id == workspace_id)
        .ok_or_else(|| WorkspaceError::NotFound(format!("run {id}")))
}

/// `GET /api/runs/{id}/events?after=N`: the lines after `N`, then the live
/// tail until the run ends. `Accept: text/event-stream` gives SSE with
/// `id: <seq>`, event names the line types, and honours `Last-Event-ID`.
#[utoipa::path(
    get,
    path = "/api/runs/{id}/events",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The run id"), ("after" = Option<u64>, Query, description = "Lines with `seq` above this"), ("Last-Event-ID" = Option<u64>, Header, description = "SSE: resume after this `seq`")),
    responses(
        (status = 200, description = "The stored lines after the cursor, then the live tail: NDJSON, or SSE with `Accept: text/event-stream`", content((doc::Line = "application/x-ndjson"), (doc::Line = "text/event-stream"))),
        (status = 400, description = "`invalid_request`: an unknown query parameter, `after` or `Last-Event-ID` not a number", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::RunNotFound)),
        (status = 410, description = "`events_gone`: the lines after the cursor are no longer kept (`oldestSeq`)", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn events(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, WorkspaceError> {
    let run = own_run(&state, &caller.workspace_id, &id).await?;
    let sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| WorkspaceError::invalid("Last-Event-ID must be a seq"))?,
        ),
    };
    let after = last_event_id.or(query.after).unwrap_or(0);
    let from = events::check_kept(&run, after)?;
    // One buffer per batch of lines (a page of the table, or what the relay
    // stored at once), not one per line.
    let batches = events::follow_batches(Arc::clone(&state), id, from);
    let mut response = if sse {
        let body = batches.map(|b| {
            let lines = b.map_err(|e| std::io::Error::other(e.to_string()))?;
            let len = lines.iter().map(|k| k.raw.len() + 48).sum();
            let mut out = Vec::with_capacity(len);
            for k in &lines {
                let kind = match k.kind {
                    Some(kind) => kind.as_str(),
                    None => type_of(&k.raw),
                };
                asbx_protocol::sse::write_event(&mut out, Some(k.seq), kind, &k.raw)
                    .map_err(std::io::Error::other)?;
            }
            Ok::<_, std::io::Error>(bytes::Bytes::from(out))
        });
        let mut r = Response::new(Body::from_stream(body));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        r
    } else {
        let body = batches.map(|b| {
            let lines = b.map_err(|e| std::io::Error::other(e.to_string()))?;
            let len = lines.iter().map(|k| k.raw.len() + 1).sum();
            let mut out = Vec::with_capacity(len);
            for k in &lines {
                out.extend_from_slice(&k.raw);
                out.push(b'\n');
            }
            Ok::<_, std::io::Error>(bytes::Bytes::from(out))
        });
        let mut r = Response::new(Body::from_stream(body));
        ndjson_headers(&mut r);
        r
    };
    response.headers_mut().insert(
        RUN_ID_HEADER,
        HeaderValue::from_str(&run.id).map_err(|_| WorkspaceError::Corrupt("run id".into()))?,
    );
    Ok(response)
}

/// The `type` of a stored line (always present: the relay keeps only lines
/// it could read).
fn type_of(raw: &[u8]) -> &'static str {
    #[derive(serde::Deserialize)]
    struct Probe<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    serde_json::from_slice::<Probe<'_>>(raw)
        .ok()
        .and_then(|p| asbx_protocol::EventKind::parse(&p.kind))
        .map_or("message", asbx_protocol::EventKind::as_str)
}

/// `POST /api/runs/{id}/tool-result`: forwarded to the runner's
/// `/v1/sessions/{id}/tool-result`; its `404` (unknown call) and `409`
/// (already answered) come back as they are.
#[utoipa::path(
    post,
    path = "/api/runs/{id}/tool-result",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The run id")),
    request_body(content = ToolResultRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The runner's answer, relayed as it is: `{callId, status: applied}`", body = Object),
        (status = 400, description = "`invalid_request`: the body or a field is wrong (`errors` names each); the runner's `decryption_failed`, passed through", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, description = "`not_found`: no such run in the caller's workspace, or it has no client tools; the runner's `unknown_call`, passed through", body = doc::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The runner's `not_protocol_2`, `already_answered` or `session_ended`, passed through", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, response = inline(doc::BodyTooLarge)),
        (status = 415, response = inline(doc::NotJson)),
        (status = 502, response = inline(doc::UpstreamFailed)),
    ),
)]
pub(crate) async fn tool_result(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ToolResultRequest>,
) -> Result<Response, WorkspaceError> {
    let run = own_run(&state, &caller.workspace_id, &id).await?;
    let answers = [
        body.result.is_some(),
        body.error.is_some(),
        body.encrypted.is_some(),
    ];
    if answers.iter().filter(|a| **a).count() != 1 {
        return Err(WorkspaceError::invalid_fields(vec![
            asbx_protocol::dispatch::FieldError::new(
                "result",
                "give exactly one of result, error or encrypted",
            ),
        ]));
    }
    let Some(sandbox_url) = run.sandbox_url.as_deref() else {
        return Err(WorkspaceError::NotFound(format!(
            "run {id} (no client tools)"
        )));
    };
    let answer = dispatch::runner_request(
        &state,
        reqwest::Method::POST,
        sandbox_url,
        &["v1", "sessions", &id, "tool-result"],
    )?
    .json(&body)
    .send()
    .await
    .map_err(|e| WorkspaceError::Upstream(crate::error::error_chain(&e)))?;
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if status.is_server_error() {
        return Err(WorkspaceError::Upstream(format!(
            "the runner answered {status}"
        )));
    }
    if status.is_redirection() {
        // Never followed, never passed on.
        return Err(WorkspaceError::Upstream(format!(
            "the runner answered {status} (a redirect)"
        )));
    }
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        // The workspace's own credentials, not the caller's.
        return Err(WorkspaceError::Upstream(format!(
            "the runner answered {status}"
        )));
    }
    let content_type = answer.headers().get(header::CONTENT_TYPE).cloned();
    let bytes = crate::runner_url::read_bounded(answer, crate::runner_url::MAX_ANSWER_BYTES).await;
    let mut r = (status, Body::from(bytes)).into_response();
    if let Some(ct) = content_type.and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok()) {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    Ok(r)
}

/// `DELETE /api/runs/{id}`: asks the runner to cancel the session (it ends
/// with `terminated` by `daemon`, docs/protocol.md §4); when the runner no
/// longer has it, the relay here is cancelled, or the run settled as
/// cancelled. `202` while it ends, `204` when it had already ended.
#[utoipa::path(
    delete,
    path = "/api/runs/{id}",
    tag = "runs",
    security((), ("api_key" = []), ("session_cookie" = [])),
    params(("id" = String, Path, description = "The run id")),
    responses(
        (status = 202, description = "Cancellation sent to the runner"),
        (status = 204, description = "The run had already ended"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, response = inline(doc::RunNotFound)),
        (status = 502, response = inline(doc::UpstreamFailed)),
    ),
)]
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, WorkspaceError> {
    let run = own_run(&state, &caller.workspace_id, &id).await?;
    if run.status != RunStatus::Running {
        return Ok(StatusCode::NO_CONTENT);
    }
    let asked = match run.sandbox_url.as_deref() {
        Some(url) => {
            match dispatch::runner_request(
                &state,
                reqwest::Method::DELETE,
                url,
                &["v1", "sessions", &id],
            )?
            .send()
            .await
            {
                Ok(r) => r.status().is_success(),
                Err(e) => {
                    tracing::warn!(run = %id, error = %crate::error::error_chain(&e), "asking the runner to cancel failed");
                    false
                }
            }
        }
        None => false,
    };
    if !asked && !state.run_hub.cancel(&id) {
        // Nobody relays it any more: settle it here.
        let outcome = Outcome::Failed {
            code: asbx_protocol::codes::CANCELLED.to_owned(),
            message: "the run was cancelled".to_owned(),
        };
        dispatch::settle(&state, &id, &outcome).await;
    }
    Ok(StatusCode::ACCEPTED)
}

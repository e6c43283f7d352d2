//! HTTP handlers of the runner: thin, each delegating to `dispatch`,
//! `session` or `resume`. Auth is the [`Authorized`] extractor.

use std::sync::Arc;

use asbx_protocol::DispatchRequest;
use asbx_protocol::session::SessionInfo;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;

use crate::Inner;
use crate::apidoc as doc;
use crate::auth::Authorized;
use crate::error::RunnerError;
use crate::session::CancelCause;

/// Largest `POST /stream` body.
pub(crate) const MAX_BODY: usize = 2 << 20;

/// Longest part of a request's path or method an error message repeats.
const MAX_ECHO: usize = 128;

/// Any path no route has: `404 not_found`, problem+json like every error.
pub(crate) async fn no_route(uri: axum::http::Uri) -> RunnerError {
    RunnerError::NoRoute(uri.path().chars().take(MAX_ECHO).collect())
}

/// A method the route does not serve: `405 method_not_allowed` (the router
/// adds `Allow`).
pub(crate) async fn method_not_allowed(method: axum::http::Method) -> RunnerError {
    RunnerError::MethodNotAllowed(method.as_str().chars().take(MAX_ECHO).collect())
}

/// `GET /healthz`: up, and how much room is left, which a workspace with a
/// runner fleet ranks runners by: `sessions` live, `warm` sandboxes booted
/// ahead, `capacity` (the most sandboxes at once) and `free` (how many more
/// dispatches fit now), `max_duration_ms` (the longest a run may last here,
/// bounded by `ASBX_MAX_RUNTIME_SEC`: a workspace lets a dispatch's tokens
/// live that long plus the grace, docs/protocol.md §3).
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    responses((status = 200, description = "The runner is up", body = Health)),
)]
pub(crate) async fn healthz(State(inner): State<Arc<Inner>>) -> Json<Health> {
    Json(Health {
        status: "ok",
        profile: inner.sandbox.profile().as_str(),
        sessions: inner.sessions.running(),
        warm: inner.pool.warm(),
        capacity: inner.config.max_sandboxes,
        free: inner.capacity.available_permits(),
        max_duration_ms: inner.config.limits.max_duration_ms,
    })
}

/// The body of `GET /healthz`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    #[schema(value_type = String, example = "ok")]
    status: &'static str,
    /// The isolation profile in force.
    #[schema(value_type = String)]
    profile: &'static str,
    /// Sessions live now.
    sessions: usize,
    /// Sandboxes booted ahead.
    warm: usize,
    /// The most sandboxes at once.
    capacity: usize,
    /// How many more dispatches fit now.
    free: usize,
    /// The longest a run may last on this runner, in ms (its runtime cap).
    max_duration_ms: u64,
}

/// `GET /v1/identity`: the runner's long-term public key, which signs every
/// encrypted session's handshake (`docs/protocol.md` §4). Public, like
/// `/healthz`: it is a public key, and a client pins it to check that
/// `session_init`'s `serverPublicKey` came from this runner.
#[utoipa::path(
    get,
    path = "/v1/identity",
    tag = "meta",
    responses((status = 200, description = "The runner's identity key", body = Identity)),
)]
pub(crate) async fn identity(State(inner): State<Arc<Inner>>) -> Json<Identity> {
    Json(Identity {
        algorithm: asbx_crypto::SIGNATURE_ALGORITHM,
        public_key: inner.identity.public_key(),
    })
}

/// The body of `GET /v1/identity`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Identity {
    /// Always `ECDSA-P256-SHA256` (signatures are the 64 bytes `r || s`).
    #[schema(value_type = String, example = "ECDSA-P256-SHA256")]
    algorithm: &'static str,
    /// base64url (no padding) of the 65-byte uncompressed SEC1 point.
    public_key: String,
}

/// `GET /metrics`: the Prometheus exposition, behind the runner's bearer
/// like every route but `/healthz`.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    security(("runner_token" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn metrics(_: Authorized, State(inner): State<Arc<Inner>>) -> Response {
    let body = crate::metrics::METRICS.render(inner.sessions.running(), inner.pool.warm());
    Response::builder()
        .header(
            axum::http::header::CONTENT_TYPE,
            asbx_protocol::exposition::CONTENT_TYPE,
        )
        .body(Body::from(body))
        .unwrap_or_default()
}

/// `GET /v1/sessions`: every session the runner holds (live, and ended
/// ones kept for their detach grace).
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    security(("runner_token" = [])),
    responses(
        (status = 200, description = "The sessions", body = Vec<doc::SessionInfo>),
        (status = 401, response = inline(doc::Unauthorized)),
    ),
)]
pub(crate) async fn list_sessions(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
) -> Result<Json<Vec<SessionInfo>>, RunnerError> {
    Ok(Json(inner.sessions.list()))
}

/// `GET /v1/sessions/{id}`: one session, with its termination once ended.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    security(("runner_token" = [])),
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 200, description = "The session", body = doc::SessionInfo),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, description = "`not_found`: no such session", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn get_session(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, RunnerError> {
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    Ok(Json(s.info()))
}

/// `DELETE /v1/sessions/{id}`: cancels the session (its stream ends with
/// `cancelled`).
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    security(("runner_token" = [])),
    params(("id" = String, Path, description = "The session id")),
    responses(
        (status = 202, description = "Cancellation started"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 404, description = "`not_found`: no such session", body = doc::Problem, content_type = "application/problem+json"),
    ),
)]
pub(crate) async fn delete_session(
    _: Authorized,
    State(inner): State<Arc<Inner>>,
    Path(id): Path<String>,
) -> Result<StatusCode, RunnerError> {
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    s.cancel(CancelCause::Deleted);
    Ok(StatusCode::ACCEPTED)
}

/// `POST /stream`: validates the dispatch, boots (or takes a warm) sandbox
/// and streams the session's lines as NDJSON (docs/protocol.md §2) until
/// its last line. Errors found before the stream starts are problems; later
/// ones are `error` lines in the stream.
#[utoipa::path(
    post,
    path = "/stream",
    tag = "dispatch",
    security(("runner_token" = [])),
    request_body(content = doc::DispatchRequest, content_type = "application/json", description = "The dispatch (at most 2 MiB)"),
    responses(
        (status = 200, description = "The session's lines, one JSON object a line, each flushed", body = doc::Line, content_type = "application/x-ndjson"),
        (status = 400, description = "`invalid_request`: a field is wrong (`errors` names each), the body is not a dispatch, the agent URL is not allowed or the encryption key is not a P-256 point", body = doc::Problem, content_type = "application/problem+json"),
        (status = 401, response = inline(doc::Unauthorized)),
        (status = 409, description = "`session_exists`: the requested `sessionId` is taken (`sessionId` names it)", body = doc::Problem, content_type = "application/problem+json"),
        (status = 413, description = "`body_too_large`: the body is over 2 MiB", body = doc::Problem, content_type = "application/problem+json"),
        (status = 500, description = "`internal`: the sandbox could not be started", body = doc::Problem, content_type = "application/problem+json"),
        (status = 503, description = "`at_capacity`: every sandbox slot is taken; retry after `Retry-After` seconds", body = doc::Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
    ),
)]
pub(crate) async fn stream(
    auth: Authorized,
    State(inner): State<Arc<Inner>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Response, RunnerError> {
    let audit_token = headers
        .get(asbx_protocol::audit::AUDIT_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|t| !t.is_empty() && t.len() <= asbx_protocol::dispatch::MAX_TOKEN_BYTES)
        .map(str::to_owned);
    let res = start_stream(auth, inner, body, audit_token).await;
    if let Err(e) = &res {
        crate::metrics::METRICS.dispatch_refused(e.code());
    }
    res
}

async fn start_stream(
    _: Authorized,
    inner: Arc<Inner>,
    body: Body,
    audit_token: Option<String>,
) -> Result<Response, RunnerError> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            RunnerError::TooLarge(MAX_BODY)
        } else {
            RunnerError::InvalidRequest(vec![asbx_protocol::FieldError::new(
                "",
                format!("could not read the body: {e}"),
            )])
        }
    })?;
    let (session, lines) = open_session(&inner, &bytes, audit_token).await?;
    Ok(crate::dispatch::ndjson_response(&session.id, lines))
}

/// Validates a dispatch body, registers its session and starts it: the one
/// path of `POST /stream` and of a `dispatch` message on `GET /v1/ws`.
pub(crate) async fn open_session(
    inner: &Arc<Inner>,
    bytes: &[u8],
    audit_token: Option<String>,
) -> Result<(Arc<crate::session::Session>, crate::dispatch::Lines), RunnerError> {
    let req = DispatchRequest::parse(bytes).map_err(RunnerError::InvalidRequest)?;
    inner
        .config
        .check_agent_url(&req.agent_url)
        .map_err(|e| RunnerError::InvalidRequest(vec![e]))?;
    let session_id = req
        .session_id
        .clone()
        .unwrap_or_else(crate::dispatch::random_id);
    // The key is agreed before the session exists: a K that is not a point
    // on P-256 is a 400 like any other bad field (docs/protocol.md §4).
    let crypto = match &req.encryption {
        Some(e) => Some(
            asbx_crypto::ServerSession::new(&e.client_public_key, &session_id, &inner.identity)
                .map_err(|e| {
                    RunnerError::InvalidRequest(vec![asbx_protocol::FieldError::new(
                        "encryption.client_public_key",
                        e.to_string(),
                    )])
                })?,
        ),
        None => None,
    };
    let session = inner.sessions.insert(
        &session_id,
        req.protocol,
        std::time::Duration::from_millis(req.detach_grace_ms()),
    )?;
    if let Some(c) = crypto {
        session.set_crypto(c);
    }
    if let Some(t) = audit_token {
        session.set_audit_token(t);
    }
    match crate::dispatch::start(inner, &session, &req).await {
        Ok(lines) => Ok((session, lines)),
        Err(e) => {
            inner.sessions.remove(&session_id);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests;

//! HTTP handlers of the runner: thin, each delegating to `drive` or `session`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use asbx_protocol::DispatchRequest;
use asbx_protocol::gateway::{AgentBootstrap, ProviderInfo};
use asbx_protocol::line::SessionLimits;
use asbx_protocol::session::SessionInfo;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use futures::Stream;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::drive::{Drive, capture_stderr};
use crate::error::RunnerError;
use crate::pool::{Booted, Pool, Slot};
use crate::session::CancelCause;

/// Largest `POST /stream` body.
const MAX_BODY: usize = 2 << 20;

pub(crate) fn router(inner: Arc<Inner>) -> Router {
    Router::new()
        .route("/stream", post(stream))
        .route("/healthz", get(healthz))
        .route("/v1/sessions", get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session).delete(delete_session))
        .route("/v1/sessions/{id}/events", get(crate::resume::events))
        .route(
            "/v1/sessions/{id}/tool-result",
            post(crate::resume::tool_result),
        )
        .with_state(inner)
}

pub(crate) fn check_token(inner: &Inner, headers: &HeaderMap) -> Result<(), RunnerError> {
    let Some(want) = &inner.config.token else {
        return Ok(());
    };
    let got = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(g) if constant_time_eq(g.as_bytes(), want.as_bytes()) => Ok(()),
        _ => Err(RunnerError::Unauthorized),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn healthz(State(inner): State<Arc<Inner>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "status": "ok",
        "profile": inner.sandbox.profile().as_str(),
        "sessions": inner.sessions.running(),
        "capacity": inner.config.max_sandboxes,
    }))
}

async fn list_sessions(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
) -> Result<Json<Vec<SessionInfo>>, RunnerError> {
    check_token(&inner, &headers)?;
    Ok(Json(inner.sessions.list()))
}

async fn get_session(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, RunnerError> {
    check_token(&inner, &headers)?;
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    Ok(Json(s.info()))
}

async fn delete_session(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, RunnerError> {
    check_token(&inner, &headers)?;
    let s = inner
        .sessions
        .get(&id)
        .ok_or(RunnerError::SessionNotFound(id))?;
    s.cancel(CancelCause::Deleted);
    Ok(StatusCode::ACCEPTED)
}

fn random_id() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

async fn stream(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, RunnerError> {
    check_token(&inner, &headers)?;
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
    let req = DispatchRequest::parse(&bytes).map_err(RunnerError::InvalidRequest)?;
    inner
        .config
        .check_agent_url(&req.agent_url)
        .map_err(|e| RunnerError::InvalidRequest(vec![e]))?;
    let session_id = req.session_id.clone().unwrap_or_else(random_id);
    let session = inner.sessions.insert(
        &session_id,
        req.protocol,
        std::time::Duration::from_millis(req.detach_grace_ms()),
    )?;
    match start(&inner, &session, &req).await {
        Ok(res) => Ok(res),
        Err(e) => {
            inner.sessions.remove(&session_id);
            Err(e)
        }
    }
}

/// Takes a warm sandbox (or boots one), connects it and returns the stream.
async fn start(
    inner: &Arc<Inner>,
    session: &Arc<crate::session::Session>,
    req: &DispatchRequest,
) -> Result<Response, RunnerError> {
    let permit = Arc::clone(&inner.capacity)
        .try_acquire_owned()
        .map_err(|_| RunnerError::AtCapacity(inner.config.max_sandboxes))?;
    let started = Instant::now();
    let booted = match inner.pool.take(inner) {
        Some(b) => b,
        None => crate::pool::boot(inner, "sessions", &session.id)?,
    };
    // Replace what was taken, off the request's path.
    let refill = Arc::clone(inner);
    tokio::spawn(async move { Pool::refill(&refill) });

    let Booted { mut child, slot } = booted;
    let gateway_stop = match connect(inner, session, req, &slot, &mut child) {
        Ok(g) => g,
        Err(e) => {
            crate::drive::kill_tree(&mut child).await;
            slot.cleanup(inner);
            return Err(e);
        }
    };
    let stderr = match child.stderr.take() {
        Some(e) => capture_stderr(e),
        None => tokio::spawn(async { crate::stderr::StderrCapture::default() }),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let limits = inner.config.limits;
    let drive = Drive {
        session: Arc::clone(session),
        child,
        stderr,
        tx,
        protocol: req.protocol,
        filter: req.filter.clone(),
        deadline: started + inner.config.max_runtime + inner.config.runtime_grace,
        max_line: inner.config.max_line_bytes,
        session_limits: SessionLimits {
            max_duration_ms: limits.max_duration_ms,
            max_steps: limits.max_steps,
            max_tool_calls: limits.max_tool_calls,
            heartbeat_interval_ms: crate::drive::HEARTBEAT.as_millis() as u64,
        },
    };
    let task_inner = Arc::clone(inner);
    let task_session = Arc::clone(session);
    tokio::spawn(async move {
        let outcome = drive.run().await;
        gateway_stop.cancel();
        slot.cleanup(&task_inner);
        tracing::info!(
            session = %task_session.id,
            reason = ?outcome.termination.reason,
            exit_code = ?outcome.termination.exit_code,
            "session ended"
        );
        task_inner.sessions.retire(&task_session.id);
        drop(slot);
        drop(permit);
    });

    let body = Body::from_stream(GuardedStream {
        rx,
        _guard: CancelOnDrop(Arc::clone(session)).into_guard(),
    });
    let mut res = (StatusCode::OK, body).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        h.insert("asbx-session-id", v);
    }
    Ok(res)
}

/// Binds this dispatch's gateway and egress proxy into the sandbox's run
/// folder and hands the agent its bootstrap.
fn connect(
    inner: &Arc<Inner>,
    session: &Arc<crate::session::Session>,
    req: &DispatchRequest,
    slot: &Slot,
    child: &mut tokio::process::Child,
) -> Result<CancellationToken, RunnerError> {
    // Jailed sandboxes run the agent as their own host uid; unconfined
    // agents run as the runner's user.
    let agent_uid = slot.tool_user.map(|_| slot.uid.host_uid());
    let listener = bind_socket(&slot.dirs.gateway_socket(), agent_uid)?;
    let proxy_listener = bind_socket(&slot.dirs.proxy_socket(), agent_uid)?;
    let gateway_stop = CancellationToken::new();
    let allow = Arc::new(crate::egress::AllowList::default());
    let egress = Arc::new(crate::egress::Egress {
        allow: Arc::clone(&allow),
        settings: inner.egress.clone(),
        stop: gateway_stop.clone(),
    });
    crate::gateway::spawn(
        listener,
        crate::gateway::GatewaySpec {
            session: Arc::clone(session),
            agent_url: req.agent_url.clone(),
            providers: Arc::clone(&inner.providers),
            client: inner.client.clone(),
            allow: Arc::clone(&allow),
            egress: inner.egress.clone(),
        },
        gateway_stop.clone(),
    );
    crate::egress::spawn(proxy_listener, egress);
    let bootstrap = AgentBootstrap {
        session_id: session.id.clone(),
        protocol: req.protocol,
        prompt: req.prompt.clone(),
        otp_setup: req.otp_setup.clone(),
        otp_run: req.otp_run.clone(),
        otp_upload: req.otp_upload.clone(),
        gateway_socket: slot.gateway_socket.clone(),
        proxy_socket: Some(slot.proxy_socket.clone()),
        workdir: slot.workdir.clone(),
        providers: inner
            .providers
            .iter()
            .map(|p| ProviderInfo {
                name: p.name.clone(),
                kind: p.kind,
            })
            .collect(),
        max_limits: inner.config.limits,
        client_tools: req.client_tools.clone(),
        tool_user: slot.tool_user,
    };
    let json = serde_json::to_vec(&bootstrap).unwrap_or_default();
    if let Some(mut stdin) = child.stdin.take() {
        // The pipe holds 64 KiB; a large prompt must not block the handler.
        tokio::spawn(async move {
            let _ = stdin.write_all(&json).await;
            let _ = stdin.shutdown().await;
        });
    }
    Ok(gateway_stop)
}

/// Binds a Unix socket for the sandbox's agent.
///
/// In a jail the socket belongs to the agent's host uid, mode 0600: the
/// agent may connect, its tools (another uid) may not, so they reach the
/// network only through the agent's egress relay and never the gateway.
fn bind_socket(
    path: &std::path::Path,
    agent_uid: Option<u32>,
) -> Result<tokio::net::UnixListener, RunnerError> {
    use std::os::unix::fs::PermissionsExt;
    let listener =
        tokio::net::UnixListener::bind(path).map_err(|e| RunnerError::io(path.display(), e))?;
    if let Some(uid) = agent_uid {
        std::os::unix::fs::chown(path, Some(uid), Some(uid))
            .map_err(|e| RunnerError::io(path.display(), e))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| RunnerError::io(path.display(), e))?;
    Ok(listener)
}

/// What dropping the response body (client gone) does to the session.
struct CancelOnDrop(Arc<crate::session::Session>);

impl CancelOnDrop {
    fn into_guard(self) -> SessionGuard {
        if self.0.protocol == asbx_protocol::Protocol::V2 {
            self.0.attach();
        }
        SessionGuard(Some(self.0))
    }
}

/// Protocol 1: cancels at once. Protocol 2: detaches; the session lives on
/// for its detach grace so a client can resume from `/events`.
pub(crate) struct SessionGuard(pub(crate) Option<Arc<crate::session::Session>>);

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            match s.protocol {
                asbx_protocol::Protocol::V1 => s.cancel(CancelCause::ClientGone),
                asbx_protocol::Protocol::V2 => s.detach(),
            }
        }
    }
}

/// The response body: the drive task's chunks, cancelling on drop.
struct GuardedStream {
    rx: mpsc::Receiver<Bytes>,
    _guard: SessionGuard,
}

impl Stream for GuardedStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|o| o.map(Ok))
    }
}

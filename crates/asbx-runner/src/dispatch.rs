//! One dispatch's lifecycle: take (or boot) a sandbox, bind its gateway and
//! egress sockets into it, hand the agent its bootstrap, spawn the drive
//! task, and tear everything down when that task ends.

use std::sync::Arc;
use std::time::Instant;

use asbx_protocol::DispatchRequest;
use asbx_protocol::gateway::{AgentBootstrap, ProviderInfo};
use asbx_protocol::line::SessionLimits;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::drive::Drive;
use crate::error::RunnerError;
use crate::pool::{Booted, Pool, Slot};
use crate::stderr::{StderrReader, capture_stderr};

/// A fresh session id when the request names none.
pub(crate) fn random_id() -> String {
    let bytes: [u8; 16] = rand::random();
    hex::encode(bytes)
}

/// A session's lines as the drive task sends them (chunks of whole NDJSON
/// lines), holding the session attached until dropped. `POST /stream` sends
/// it as the response body; `GET /v1/ws` splits it into messages.
pub(crate) type Lines = crate::pool::UntilFirstLine<crate::session::GuardedStream>;

/// Takes a warm sandbox (or boots one), connects it and returns the stream.
pub(crate) async fn start(
    inner: &Arc<Inner>,
    session: &Arc<crate::session::Session>,
    req: &DispatchRequest,
) -> Result<Lines, RunnerError> {
    let permit = Arc::clone(&inner.capacity)
        .try_acquire_owned()
        .map_err(|_| RunnerError::AtCapacity(inner.config.max_sandboxes))?;
    let started = Instant::now();
    let trace = crate::otel::dispatch_span(&session.id);
    let bootstrap = crate::otel::bootstrap_span(&trace);
    // Refilling the pool waits until this sandbox's first line.
    let starting = Pool::starting(inner);
    let booted = match inner.pool.take(inner) {
        Some(b) => b,
        None => crate::pool::boot(inner, "sessions", &session.id)?,
    };
    // Replace what was taken, off the request's path.
    Pool::refill(inner);

    let Booted { mut child, slot } = booted;
    let workdir = match &req.workdir {
        None => None,
        Some(spec) => match open_workdir(inner, spec, req, &slot, &child).await {
            Ok(w) => Some(w),
            Err(e) => {
                child.kill_tree().await;
                let _ = slot.cleanup(inner).await;
                return Err(e);
            }
        },
    };
    let gateway_stop = match connect(inner, session, req, &slot, &mut child, &trace) {
        Ok(g) => g,
        Err(e) => {
            child.kill_tree().await;
            let _ = slot.cleanup(inner).await;
            return Err(e);
        }
    };
    let stderr = match child.stderr.take() {
        Some(e) => capture_stderr(e),
        None => StderrReader::none(),
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
        trace,
        bootstrap,
        workdir,
    };
    let task_inner = Arc::clone(inner);
    let task_session = Arc::clone(session);
    tokio::spawn(async move {
        let outcome = drive.run().await;
        gateway_stop.cancel();
        let _ = slot.cleanup(&task_inner).await;
        tracing::info!(
            session = %task_session.id,
            reason = ?outcome.termination.reason,
            exit_code = ?outcome.termination.exit_code,
            "session ended"
        );
        task_inner.sessions.retire(&task_session.id);
        drop(permit);
    });

    Ok(crate::pool::UntilFirstLine {
        body: crate::session::GuardedStream {
            rx,
            _guard: crate::session::CancelOnDrop(Arc::clone(session)).into_guard(),
        },
        starting: Some(starting),
    })
}

/// Opens the sandbox's working directory and restores the dispatch's
/// snapshot into it, before the agent gets its bootstrap (CONTRACT §11).
async fn open_workdir(
    inner: &Arc<Inner>,
    spec: &asbx_protocol::workdir::WorkdirDispatch,
    req: &DispatchRequest,
    slot: &Slot,
    child: &crate::child::SandboxChild,
) -> Result<crate::workdir::Workdir, RunnerError> {
    // A jail's `/work` belongs to its tool user and the shared group (the
    // host ids the jail gives its copied folder).
    let jailed = slot.tool_user.is_some();
    let host_uid = slot.uid.host_uid();
    let owner: crate::workdir::Owner = jailed.then_some((host_uid + 1, host_uid));
    let mut w = crate::workdir::Workdir::open(
        spec.clone(),
        &req.agent_url,
        inner.client.clone(),
        jailed.then(|| child.pid()),
        &slot.workdir,
    )
    .await
    .map_err(RunnerError::Spawn)?;
    w.restore(owner).await.map_err(|e| match e {
        crate::workdir::RestoreError::Fetch(e) => RunnerError::WorkdirUnavailable(e),
        crate::workdir::RestoreError::Local(e) => RunnerError::Spawn(e),
    })?;
    Ok(w)
}

/// The `POST /stream` answer: `lines` as an NDJSON body.
pub(crate) fn ndjson_response(session_id: &str, lines: Lines) -> Response {
    let body = Body::from_stream(lines);
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
    if let Ok(v) = HeaderValue::from_str(session_id) {
        h.insert("asbx-session-id", v);
    }
    res
}

/// Binds this dispatch's gateway and egress proxy into the sandbox's run
/// folder and hands the agent its bootstrap.
fn connect(
    inner: &Arc<Inner>,
    session: &Arc<crate::session::Session>,
    req: &DispatchRequest,
    slot: &Slot,
    child: &mut crate::child::SandboxChild,
    trace: &tracing::Span,
) -> Result<CancellationToken, RunnerError> {
    // Jailed sandboxes run the agent as their own host uid; unconfined
    // agents run as the runner's user.
    let agent_uid = slot.tool_user.map(|_| slot.uid.host_uid());
    let listener = bind_socket(&slot.dirs.gateway_socket(), agent_uid)?;
    let proxy_listener = bind_socket(&slot.dirs.proxy_socket(), agent_uid)?;
    let gateway_stop = CancellationToken::new();
    let allow = Arc::new(crate::egress::AllowList::default());
    let inject = Arc::new(std::sync::OnceLock::new());
    let audit = session.audit_token().map(|token| {
        crate::audit::AuditLog::start(
            inner.client.clone(),
            &req.agent_url,
            token.to_owned(),
            gateway_stop.clone(),
        )
    });
    let egress = Arc::new(crate::egress::Egress {
        allow: Arc::clone(&allow),
        inject: Arc::clone(&inject),
        settings: inner.egress.clone(),
        stop: gateway_stop.clone(),
        audit: audit.clone(),
    });
    crate::gateway::spawn(
        listener,
        crate::gateway::GatewaySpec {
            session: Arc::clone(session),
            agent_url: req.agent_url.clone(),
            providers: Arc::clone(&inner.providers),
            client: inner.client.clone(),
            allow: Arc::clone(&allow),
            inject,
            ca_file: ca_file(slot),
            egress: inner.egress.clone(),
            audit,
        },
        gateway_stop.clone(),
        trace.clone(),
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

/// Where the sandbox's CA bundle goes (its run folder, beside the
/// gateway's socket), on the host and as the sandbox sees it.
fn ca_file(slot: &Slot) -> Option<crate::gateway::CaFile> {
    let file = crate::egress::inject::CA_FILE;
    let dir = std::path::Path::new(&slot.gateway_socket).parent()?;
    Some(crate::gateway::CaFile {
        host: slot.dirs.run.join(file),
        sandbox: dir.join(file).to_str()?.to_owned(),
    })
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

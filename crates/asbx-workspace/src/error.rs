//! The workspace's one error type and its HTTP form.
//!
//! Every handler returns `Result<_, WorkspaceError>`; [`IntoResponse`] turns an
//! error into `application/problem+json` with a stable `code`. Details of a
//! 5xx are logged here and never sent: the client gets a generic message.

use std::path::PathBuf;

use asbx_protocol::{FieldError, Problem};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The stable problem `code`s, one list for the workspace and its runners
/// (a runner's refusal passes through with its own code).
pub(crate) use asbx_protocol::ProblemCode;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("invalid request: {detail}")]
    InvalidRequest {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("missing or malformed credentials")]
    Unauthorized,
    #[error("one-time token rejected")]
    OtpRejected,
    #[error("not allowed: {0}")]
    Forbidden(String),
    #[error("cross-origin request refused: origin {origin}")]
    CrossOrigin { origin: String },
    #[error("host {host:?} is not one this server answers to")]
    HostNotAllowed { host: String },
    #[error("{0} not found")]
    NotFound(String),
    #[error("method {method} not allowed here")]
    MethodNotAllowed { method: String },
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("unsupported content type: {found}")]
    UnsupportedMediaType { found: String },
    #[error("chat {chat_id} has a turn in flight: {turn_id}")]
    TurnInFlight { chat_id: String, turn_id: String },
    /// The request clashes with what is stored (a name taken, a reference
    /// to something since deleted): `409 conflict`.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A chat that kept no working directory to start a run from (none
    /// yet, or its latest turn's was refused): `409 workdir_not_kept`.
    #[error("chat {chat_id} kept no working directory{at}")]
    WorkdirNotKept { chat_id: String, at: String },
    /// A turn's working directory past its chat's `ASBX_WORKDIR_KEEP_TURNS`
    /// latest: its file list is kept, its bytes are not (`410 workdir_gone`).
    #[error(
        "the working directory of chat {chat_id}{at} is no longer kept (only the latest \
         ASBX_WORKDIR_KEEP_TURNS turns' are)"
    )]
    WorkdirGone { chat_id: String, at: String },
    #[error("no SANDBOX_URL: start the workspace with SANDBOX_URL")]
    SandboxUrlMissing,
    #[error(
        "no SANDBOX_URL for agent {agent_id}: set SANDBOX_URL in the agent's environment \
         variables, or start the workspace with SANDBOX_URL"
    )]
    AgentSandboxUrlMissing { agent_id: String },
    /// A runner URL that is not one the operator configured (`SANDBOX_URL`,
    /// `ASBX_ALLOWED_SANDBOX_URLS`): no request goes to it.
    #[error(
        "{field}: not one of the runners this workspace is configured with \
         (SANDBOX_URL, ASBX_ALLOWED_SANDBOX_URLS)"
    )]
    SandboxUrlNotAllowed { field: String },
    /// A model not among `ASBX_MODELS` (`GET /api/models`).
    #[error("{field}: model {model:?} is not allowed here; allowed: {}", allowed.join(", "))]
    ModelNotAllowed {
        field: String,
        model: String,
        allowed: Vec<String>,
    },
    #[error("runner request failed: {0}")]
    Upstream(String),
    #[error("lines of run {run_id} before seq {oldest} are no longer kept")]
    EventsGone { run_id: String, oldest: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(
        "refusing to listen on {listen}, which is not a loopback address, without authentication: \
         set ASBX_REQUIRE_AUTH=1 (and give clients an API key from `asbx key`)"
    )]
    AuthRequired { listen: std::net::SocketAddr },
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("i/o error on {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A workspace quota used up (CONTRACT.md §10): `429 quota_exceeded`.
    #[error("the workspace's quota {quota} ({limit}) is used up")]
    QuotaExceeded {
        /// The workspace refused (for the audit log, never in the answer).
        workspace: String,
        /// The quota's name (`concurrent-sandboxes`, ...).
        quota: &'static str,
        limit: u64,
        /// Seconds after which a retry may pass (`Retry-After`), when
        /// waiting helps.
        retry_after_s: Option<u64>,
    },
}

impl WorkspaceError {
    /// A 400 naming one problem.
    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        WorkspaceError::InvalidRequest {
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// A 400 naming every bad field.
    pub(crate) fn invalid_fields(errors: Vec<FieldError>) -> Self {
        let detail = errors
            .iter()
            .map(|e| {
                if e.field.is_empty() {
                    e.message.clone()
                } else {
                    format!("{}: {}", e.field, e.message)
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        WorkspaceError::InvalidRequest { detail, errors }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WorkspaceError::Io {
            path: path.into(),
            source,
        }
    }

    /// The problem body this error is answered with: its
    /// [`kind`](Self::kind), [`detail`](Self::detail) and
    /// [`members`](Self::members).
    pub(crate) fn problem(&self) -> Problem {
        let (status, code, title) = self.kind();
        self.members(Problem::of(status, code, title, self.detail()))
    }

    /// Status, stable code and title: what a client branches on.
    fn kind(&self) -> (u16, ProblemCode, &'static str) {
        use ProblemCode as C;
        use WorkspaceError as E;
        match self {
            E::InvalidRequest { .. } => (400, C::InvalidRequest, "Invalid request"),
            E::Unauthorized => (401, C::Unauthorized, "Unauthorized"),
            E::OtpRejected => (401, C::OtpRejected, "Token rejected"),
            E::Forbidden(_) => (403, C::Forbidden, "Forbidden"),
            E::CrossOrigin { .. } => (403, C::CrossOrigin, "Cross-origin request refused"),
            E::HostNotAllowed { .. } => (403, C::HostNotAllowed, "Host not allowed"),
            E::MethodNotAllowed { .. } => (405, C::MethodNotAllowed, "Method not allowed"),
            E::UnsupportedMediaType { .. } => {
                (415, C::UnsupportedMediaType, "Unsupported media type")
            }
            E::NotFound(_) => (404, C::NotFound, "Not found"),
            E::BodyTooLarge { .. } => (413, C::BodyTooLarge, "Request body too large"),
            E::TurnInFlight { .. } => (409, C::TurnInFlight, "Turn in flight"),
            E::Conflict(_) => (409, C::Conflict, "Conflict"),
            E::WorkdirNotKept { .. } => (409, C::WorkdirNotKept, "No working directory kept"),
            E::WorkdirGone { .. } => (410, C::WorkdirGone, "Working directory no longer kept"),
            E::SandboxUrlMissing | E::AgentSandboxUrlMissing { .. } => {
                (503, C::SandboxUrlMissing, "Sandbox runner not configured")
            }
            E::SandboxUrlNotAllowed { .. } => (400, C::SandboxUrlNotAllowed, "Runner not allowed"),
            E::ModelNotAllowed { .. } => (400, C::ModelNotAllowed, "Model not allowed"),
            E::Upstream(_) => (502, C::UpstreamFailed, "Sandbox runner unreachable"),
            E::EventsGone { .. } => (410, C::EventsGone, "Lines no longer kept"),
            E::QuotaExceeded { .. } => (429, C::QuotaExceeded, "Quota exceeded"),
            E::Database(e) if unreachable(e) => {
                (503, C::DatabaseUnavailable, "Database unavailable")
            }
            E::Config(_)
            | E::AuthRequired { .. }
            | E::Database(_)
            | E::Migrate(_)
            | E::Io { .. }
            | E::Corrupt(_) => (500, C::Internal, "Internal error"),
        }
    }

    /// What a person reads. An internal error's own words stay in the log
    /// ([`IntoResponse`]); the client gets a generic sentence.
    fn detail(&self) -> String {
        use WorkspaceError as E;
        match self {
            E::InvalidRequest { detail, .. } => detail.clone(),
            E::Unauthorized => "missing or malformed credentials".to_owned(),
            E::OtpRejected => {
                "the one-time token is unknown, expired, already used, or not valid here".to_owned()
            }
            E::Forbidden(what) | E::Conflict(what) => what.clone(),
            E::CrossOrigin { origin } => format!(
                "a state-changing request from origin {origin} is refused: only this \
                 server's own origin may make one"
            ),
            E::HostNotAllowed { host } => format!("this server does not answer to Host {host:?}"),
            E::MethodNotAllowed { method } => format!("{method} is not allowed on this route"),
            E::UnsupportedMediaType { found } => {
                format!("this route takes Content-Type: application/json, not {found}")
            }
            E::NotFound(what) => format!("{what} not found"),
            E::BodyTooLarge { limit } => format!("the request body is larger than {limit} bytes"),
            E::TurnInFlight { chat_id, turn_id } => {
                format!("chat {chat_id} already has a turn in flight ({turn_id})")
            }
            E::Upstream(_) => "the request to the sandbox runner failed".to_owned(),
            E::WorkdirNotKept { .. }
            | E::WorkdirGone { .. }
            | E::SandboxUrlMissing
            | E::AgentSandboxUrlMissing { .. }
            | E::SandboxUrlNotAllowed { .. }
            | E::ModelNotAllowed { .. }
            | E::EventsGone { .. }
            | E::QuotaExceeded { .. } => self.to_string(),
            E::Database(e) if unreachable(e) => {
                "the database cannot be reached now; nothing was changed, retry shortly".to_owned()
            }
            E::Config(_)
            | E::AuthRequired { .. }
            | E::Database(_)
            | E::Migrate(_)
            | E::Io { .. }
            | E::Corrupt(_) => "an internal error occurred; it has been logged".to_owned(),
        }
    }

    /// The members beyond the five a problem always has: the bad fields
    /// and what a client needs to act (the turn in flight, the quota).
    fn members(&self, problem: Problem) -> Problem {
        use WorkspaceError as E;
        match self {
            E::InvalidRequest { errors, .. } => problem.with_errors(errors.clone()),
            E::TurnInFlight { chat_id, turn_id } => problem
                .with("activeTurnId", turn_id.clone())
                .with("chatId", chat_id.clone()),
            E::WorkdirNotKept { chat_id, .. } | E::WorkdirGone { chat_id, .. } => {
                problem.with("chatId", chat_id.clone())
            }
            E::AgentSandboxUrlMissing { agent_id } => problem.with("agentId", agent_id.clone()),
            E::SandboxUrlNotAllowed { field } => problem.with_errors(vec![FieldError::new(
                field,
                "not one of the runners this workspace is configured with",
            )]),
            E::ModelNotAllowed { field, allowed, .. } => problem
                .with_errors(vec![FieldError::new(
                    field,
                    "not one of the allowed models",
                )])
                .with("allowed", allowed.clone()),
            E::EventsGone { run_id, oldest } => problem
                .with("runId", run_id.clone())
                .with("oldestSeq", *oldest),
            E::QuotaExceeded { quota, limit, .. } => {
                problem.with("quota", *quota).with("limit", *limit)
            }
            _ => problem,
        }
    }
}

/// Whether a database error says the database can't be reached now (the
/// connection, the pool, or the server refusing connections), rather than
/// that a statement failed: answered `503 database_unavailable`, so a
/// client retries and a load balancer can take the node out.
fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // SQLSTATE class 08 (connection exception), 53300 (too many
        // connections), 57P01-57P03 (shutting down, cannot connect now).
        sqlx::Error::Database(d) => d.code().is_some_and(|c| {
            c.starts_with("08") || matches!(&*c, "53300" | "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

impl IntoResponse for WorkspaceError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let retry_after = if let WorkspaceError::QuotaExceeded { retry_after_s, .. } = &self {
            *retry_after_s
        } else {
            None
        };
        if problem.status >= 500 {
            tracing::error!(error = %error_chain(&self), status = problem.status, "request failed");
        }
        let mut response = problem_response(&problem);
        if problem.code == ProblemCode::DatabaseUnavailable.as_str() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Some(s) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let WorkspaceError::QuotaExceeded {
            workspace, quota, ..
        } = self
        {
            response
                .extensions_mut()
                .insert(QuotaRefusal { workspace, quota });
        }
        response
    }
}

/// A quota refusal an answer carries (a response extension), for the
/// audit log's record of it (`audit::record_quota_refusals`).
#[derive(Debug, Clone)]
pub(crate) struct QuotaRefusal {
    pub(crate) workspace: String,
    pub(crate) quota: &'static str,
}

/// Writes any [`Problem`] as `application/problem+json`.
pub(crate) fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Problem::CONTENT_TYPE),
    );
    response
}

/// The error and every source, joined by `: `.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_database_is_503_and_a_failed_statement_500() {
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        ] {
            let p = WorkspaceError::Database(e).problem();
            assert_eq!((p.status, p.code.as_str()), (503, "database_unavailable"));
        }
        let p = WorkspaceError::Database(sqlx::Error::RowNotFound).problem();
        assert_eq!((p.status, p.code.as_str()), (500, "internal"));
        let r = WorkspaceError::Database(sqlx::Error::PoolTimedOut).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let r = WorkspaceError::Database(sqlx::Error::RowNotFound).into_response();
        assert!(r.headers().get(header::RETRY_AFTER).is_none());
    }
}

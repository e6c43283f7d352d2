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

    /// The problem body this error is answered with.
    pub(crate) fn problem(&self) -> Problem {
        match self {
            WorkspaceError::InvalidRequest { detail, errors } => Problem::new(
                400,
                ProblemCode::InvalidRequest.as_str(),
                "Invalid request",
                detail.clone(),
            )
            .with_errors(errors.clone()),
            WorkspaceError::Unauthorized => Problem::new(
                401,
                ProblemCode::Unauthorized.as_str(),
                "Unauthorized",
                "missing or malformed credentials",
            ),
            WorkspaceError::OtpRejected => Problem::new(
                401,
                ProblemCode::OtpRejected.as_str(),
                "Token rejected",
                "the one-time token is unknown, expired, already used, or not valid here",
            ),
            WorkspaceError::Forbidden(what) => Problem::new(
                403,
                ProblemCode::Forbidden.as_str(),
                "Forbidden",
                what.clone(),
            ),
            WorkspaceError::CrossOrigin { origin } => Problem::new(
                403,
                ProblemCode::CrossOrigin.as_str(),
                "Cross-origin request refused",
                format!(
                    "a state-changing request from origin {origin} is refused: only this \
                     server's own origin may make one"
                ),
            ),
            WorkspaceError::HostNotAllowed { host } => Problem::new(
                403,
                ProblemCode::HostNotAllowed.as_str(),
                "Host not allowed",
                format!("this server does not answer to Host {host:?}"),
            ),
            WorkspaceError::MethodNotAllowed { method } => Problem::new(
                405,
                ProblemCode::MethodNotAllowed.as_str(),
                "Method not allowed",
                format!("{method} is not allowed on this route"),
            ),
            WorkspaceError::UnsupportedMediaType { found } => Problem::new(
                415,
                ProblemCode::UnsupportedMediaType.as_str(),
                "Unsupported media type",
                format!("this route takes Content-Type: application/json, not {found}"),
            ),
            WorkspaceError::NotFound(what) => Problem::new(
                404,
                ProblemCode::NotFound.as_str(),
                "Not found",
                format!("{what} not found"),
            ),
            WorkspaceError::BodyTooLarge { limit } => Problem::new(
                413,
                ProblemCode::BodyTooLarge.as_str(),
                "Request body too large",
                format!("the request body is larger than {limit} bytes"),
            ),
            WorkspaceError::TurnInFlight { chat_id, turn_id } => Problem::new(
                409,
                ProblemCode::TurnInFlight.as_str(),
                "Turn in flight",
                format!("chat {chat_id} already has a turn in flight ({turn_id})"),
            )
            .with("activeTurnId", turn_id.clone())
            .with("chatId", chat_id.clone()),
            WorkspaceError::Conflict(what) => Problem::new(
                409,
                ProblemCode::Conflict.as_str(),
                "Conflict",
                what.clone(),
            ),
            WorkspaceError::WorkdirNotKept { chat_id, .. } => Problem::new(
                409,
                ProblemCode::WorkdirNotKept.as_str(),
                "No working directory kept",
                self.to_string(),
            )
            .with("chatId", chat_id.clone()),
            WorkspaceError::WorkdirGone { chat_id, .. } => Problem::new(
                410,
                ProblemCode::WorkdirGone.as_str(),
                "Working directory no longer kept",
                self.to_string(),
            )
            .with("chatId", chat_id.clone()),
            WorkspaceError::SandboxUrlMissing => Problem::new(
                503,
                ProblemCode::SandboxUrlMissing.as_str(),
                "Sandbox runner not configured",
                self.to_string(),
            ),
            WorkspaceError::AgentSandboxUrlMissing { agent_id } => Problem::new(
                503,
                ProblemCode::SandboxUrlMissing.as_str(),
                "Sandbox runner not configured",
                self.to_string(),
            )
            .with("agentId", agent_id.clone()),
            WorkspaceError::SandboxUrlNotAllowed { field } => Problem::new(
                400,
                ProblemCode::SandboxUrlNotAllowed.as_str(),
                "Runner not allowed",
                self.to_string(),
            )
            .with_errors(vec![FieldError::new(
                field,
                "not one of the runners this workspace is configured with",
            )]),
            WorkspaceError::ModelNotAllowed { field, allowed, .. } => Problem::new(
                400,
                ProblemCode::ModelNotAllowed.as_str(),
                "Model not allowed",
                self.to_string(),
            )
            .with_errors(vec![FieldError::new(
                field,
                "not one of the allowed models",
            )])
            .with("allowed", allowed.clone()),
            WorkspaceError::Upstream(_) => Problem::new(
                502,
                ProblemCode::UpstreamFailed.as_str(),
                "Sandbox runner unreachable",
                "the request to the sandbox runner failed",
            ),
            WorkspaceError::EventsGone { run_id, oldest } => Problem::new(
                410,
                ProblemCode::EventsGone.as_str(),
                "Lines no longer kept",
                self.to_string(),
            )
            .with("runId", run_id.clone())
            .with("oldestSeq", *oldest),
            WorkspaceError::QuotaExceeded { quota, limit, .. } => Problem::new(
                429,
                ProblemCode::QuotaExceeded.as_str(),
                "Quota exceeded",
                self.to_string(),
            )
            .with("quota", *quota)
            .with("limit", *limit),
            WorkspaceError::Database(e) if unreachable(e) => Problem::new(
                503,
                ProblemCode::DatabaseUnavailable.as_str(),
                "Database unavailable",
                "the database cannot be reached now; nothing was changed, retry shortly",
            ),
            WorkspaceError::Config(_)
            | WorkspaceError::AuthRequired { .. }
            | WorkspaceError::Database(_)
            | WorkspaceError::Migrate(_)
            | WorkspaceError::Io { .. }
            | WorkspaceError::Corrupt(_) => Problem::new(
                500,
                ProblemCode::Internal.as_str(),
                "Internal error",
                "an internal error occurred; it has been logged",
            ),
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

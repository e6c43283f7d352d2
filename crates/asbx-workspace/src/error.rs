//! The workspace's one error type and its HTTP form.
//!
//! Every handler returns `Result<_, WorkspaceError>`; [`IntoResponse`] turns an
//! error into `application/problem+json` with a stable `code`. Details of a
//! 5xx are logged here and never sent: the client gets a generic message.

use std::path::PathBuf;

use asbx_protocol::{FieldError, Problem};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Stable problem codes.
pub mod codes {
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const OTP_REJECTED: &str = "otp_rejected";
    pub const FORBIDDEN: &str = "forbidden";
    pub const NOT_FOUND: &str = "not_found";
    pub const PAYLOAD_TOO_LARGE: &str = "payload_too_large";
    pub const TURN_IN_FLIGHT: &str = "turn_in_flight";
    pub const SANDBOX_URL_MISSING: &str = "sandbox_url_missing";
    pub const UPSTREAM_FAILED: &str = "upstream_failed";
    pub const INTERNAL: &str = "internal";
}

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
    #[error("{0} not found")]
    NotFound(String),
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("chat {chat_id} has a turn in flight: {turn_id}")]
    TurnInFlight { chat_id: String, turn_id: String },
    #[error(
        "no SANDBOX_URL: pass sandboxUrl in the request or start the workspace with SANDBOX_URL"
    )]
    SandboxUrlMissing,
    #[error(
        "no SANDBOX_URL for agent {agent_id}: pass sandboxUrl in the run request, set SANDBOX_URL \
         in the agent's environment variables, or start the workspace with SANDBOX_URL"
    )]
    AgentSandboxUrlMissing { agent_id: String },
    #[error("runner request failed: {0}")]
    Upstream(String),
    #[error("invalid configuration: {0}")]
    Config(String),
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
}

impl WorkspaceError {
    /// A 400 naming one problem.
    pub fn invalid(detail: impl Into<String>) -> Self {
        WorkspaceError::InvalidRequest {
            detail: detail.into(),
            errors: Vec::new(),
        }
    }

    /// A 400 naming every bad field.
    pub fn invalid_fields(errors: Vec<FieldError>) -> Self {
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

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        WorkspaceError::Io {
            path: path.into(),
            source,
        }
    }

    /// The problem body this error is answered with.
    pub fn problem(&self) -> Problem {
        match self {
            WorkspaceError::InvalidRequest { detail, errors } => Problem::new(
                400,
                codes::INVALID_REQUEST,
                "Invalid request",
                detail.clone(),
            )
            .with_errors(errors.clone()),
            WorkspaceError::Unauthorized => Problem::new(
                401,
                codes::UNAUTHORIZED,
                "Unauthorized",
                "missing or malformed credentials",
            ),
            WorkspaceError::OtpRejected => Problem::new(
                401,
                codes::OTP_REJECTED,
                "Token rejected",
                "the one-time token is unknown, expired, already used, or not valid here",
            ),
            WorkspaceError::Forbidden(what) => {
                Problem::new(403, codes::FORBIDDEN, "Forbidden", what.clone())
            }
            WorkspaceError::NotFound(what) => Problem::new(
                404,
                codes::NOT_FOUND,
                "Not found",
                format!("{what} not found"),
            ),
            WorkspaceError::PayloadTooLarge { limit } => Problem::new(
                413,
                codes::PAYLOAD_TOO_LARGE,
                "Payload too large",
                format!("the request body is larger than {limit} bytes"),
            ),
            WorkspaceError::TurnInFlight { chat_id, turn_id } => Problem::new(
                409,
                codes::TURN_IN_FLIGHT,
                "Turn in flight",
                format!("chat {chat_id} already has a turn in flight ({turn_id})"),
            )
            .with("activeTurnId", turn_id.clone())
            .with("chatId", chat_id.clone()),
            WorkspaceError::SandboxUrlMissing => Problem::new(
                503,
                codes::SANDBOX_URL_MISSING,
                "Sandbox runner not configured",
                self.to_string(),
            ),
            WorkspaceError::AgentSandboxUrlMissing { agent_id } => Problem::new(
                503,
                codes::SANDBOX_URL_MISSING,
                "Sandbox runner not configured",
                self.to_string(),
            )
            .with("agentId", agent_id.clone()),
            WorkspaceError::Upstream(_) => Problem::new(
                502,
                codes::UPSTREAM_FAILED,
                "Sandbox runner unreachable",
                "the request to the sandbox runner failed",
            ),
            WorkspaceError::Config(_)
            | WorkspaceError::Database(_)
            | WorkspaceError::Migrate(_)
            | WorkspaceError::Io { .. }
            | WorkspaceError::Corrupt(_) => Problem::new(
                500,
                codes::INTERNAL,
                "Internal error",
                "an internal error occurred; it has been logged",
            ),
        }
    }
}

impl IntoResponse for WorkspaceError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        if problem.status >= 500 {
            tracing::error!(error = %error_chain(&self), status = problem.status, "request failed");
        }
        problem_response(&problem)
    }
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

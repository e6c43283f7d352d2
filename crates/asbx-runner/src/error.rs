//! The runner's error type and its one mapping to `application/problem+json`.

use asbx_protocol::{FieldError, Problem, ProblemCode};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("invalid request")]
    InvalidRequest(Vec<FieldError>),
    #[error("runner token missing or wrong")]
    Unauthorized,
    #[error(
        "a WebSocket upgrade from a web page (Origin {0}) is refused: the runner serves servers and SDKs"
    )]
    CrossOrigin(String),
    #[error(
        "refusing to listen on {0} without a runner token (set ASBX_RUNNER_TOKEN, or listen on loopback)"
    )]
    TokenRequired(std::net::SocketAddr),
    #[error("session {0} already exists")]
    SessionTaken(String),
    #[error("session {0} not found")]
    SessionNotFound(String),
    #[error("no route {0}")]
    NoRoute(String),
    #[error("method {0} not allowed on this route")]
    MethodNotAllowed(String),
    #[error("request body larger than {0} bytes")]
    TooLarge(usize),
    #[error("at capacity: {0} sandboxes running")]
    AtCapacity(usize),
    #[error("session {0} does not speak protocol 2")]
    NotProtocol2(String),
    #[error("no tool call {0} is waiting for an answer")]
    UnknownCall(String),
    #[error("tool call {0} was already answered")]
    AlreadyAnswered(String),
    #[error("the session ended before tool call {0} was answered")]
    CallClosed(String),
    #[error("the encrypted result of tool call {0} did not open with the session's key")]
    Undecryptable(String),
    #[error("events after seq {after} are gone; the oldest retained is {oldest}")]
    EventsGone { after: u64, oldest: u64 },
    #[error("could not start the sandbox: {0}")]
    Spawn(String),
    #[error("could not restore the working directory: {0}")]
    WorkdirUnavailable(String),
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl RunnerError {
    pub(crate) fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        RunnerError::Io {
            path: path.to_string(),
            source,
        }
    }

    /// The problem's stable `code`.
    pub(crate) fn code(&self) -> String {
        self.problem().code
    }

    fn problem(&self) -> Problem {
        match self {
            RunnerError::InvalidRequest(errors) => {
                let names: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                Problem::of(
                    400,
                    ProblemCode::InvalidRequest,
                    "Invalid request",
                    format!("bad fields: {}", names.join(", ")),
                )
                .with_errors(errors.clone())
            }
            RunnerError::Unauthorized => Problem::of(
                401,
                ProblemCode::Unauthorized,
                "Unauthorized",
                self.to_string(),
            ),
            RunnerError::CrossOrigin(_) => Problem::of(
                403,
                ProblemCode::CrossOrigin,
                "Cross-origin request",
                self.to_string(),
            ),
            RunnerError::SessionTaken(id) => Problem::of(
                409,
                ProblemCode::SessionExists,
                "Session exists",
                self.to_string(),
            )
            .with("sessionId", id.clone()),
            RunnerError::SessionNotFound(_) | RunnerError::NoRoute(_) => {
                Problem::of(404, ProblemCode::NotFound, "Not found", self.to_string())
            }
            RunnerError::MethodNotAllowed(_) => Problem::of(
                405,
                ProblemCode::MethodNotAllowed,
                "Method not allowed",
                self.to_string(),
            ),
            RunnerError::NotProtocol2(_) => Problem::of(
                409,
                ProblemCode::NotProtocol2,
                "Not a protocol 2 session",
                self.to_string(),
            ),
            RunnerError::UnknownCall(_) => Problem::of(
                404,
                ProblemCode::UnknownCall,
                "Unknown tool call",
                self.to_string(),
            ),
            RunnerError::AlreadyAnswered(_) => Problem::of(
                409,
                ProblemCode::AlreadyAnswered,
                "Tool call already answered",
                self.to_string(),
            ),
            RunnerError::CallClosed(_) => Problem::of(
                409,
                ProblemCode::SessionEnded,
                "Session ended",
                self.to_string(),
            ),
            RunnerError::Undecryptable(_) => Problem::of(
                400,
                ProblemCode::DecryptionFailed,
                "Decryption failed",
                self.to_string(),
            ),
            RunnerError::TooLarge(_) => Problem::of(
                413,
                ProblemCode::BodyTooLarge,
                "Request body too large",
                self.to_string(),
            ),
            RunnerError::AtCapacity(_) => Problem::of(
                503,
                ProblemCode::AtCapacity,
                "Runner at capacity",
                self.to_string(),
            ),
            RunnerError::EventsGone { oldest, .. } => Problem::of(
                410,
                ProblemCode::EventsGone,
                "Events no longer retained",
                self.to_string(),
            )
            .with("oldestSeq", *oldest),
            RunnerError::WorkdirUnavailable(_) => Problem::of(
                502,
                ProblemCode::WorkdirUnavailable,
                "Working directory unavailable",
                "the runner could not fetch the chat's working directory from the workspace",
            ),
            RunnerError::TokenRequired(_) | RunnerError::Spawn(_) | RunnerError::Io { .. } => {
                Problem::of(
                    500,
                    ProblemCode::Internal,
                    "Internal error",
                    "the runner could not start the sandbox; see the runner's log",
                )
            }
        }
    }
}

impl IntoResponse for RunnerError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        if problem.status >= 500 {
            tracing::error!(error = %self, "request failed");
        }
        let mut res = problem_response(&problem);
        if let RunnerError::AtCapacity(_) = self {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

/// The runner's one problem+json writer: the service routes, the gateway
/// and the egress proxy all answer through it.
pub(crate) fn problem_response(problem: &Problem) -> Response {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(problem).unwrap_or_default();
    let mut res = (status, body).into_response();
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(Problem::CONTENT_TYPE),
    );
    res
}

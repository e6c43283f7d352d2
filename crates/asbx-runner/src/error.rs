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

    /// The problem body: its [`kind`](Self::kind), its detail and the
    /// members a client acts on.
    fn problem(&self) -> Problem {
        let (status, code, title) = self.kind();
        let problem = Problem::of(status, code, title, self.detail());
        match self {
            RunnerError::InvalidRequest(errors) => problem.with_errors(errors.clone()),
            RunnerError::SessionTaken(id) => problem.with("sessionId", id.clone()),
            RunnerError::EventsGone { oldest, .. } => problem.with("oldestSeq", *oldest),
            _ => problem,
        }
    }

    /// Status, stable code and title: what a client branches on.
    fn kind(&self) -> (u16, ProblemCode, &'static str) {
        use ProblemCode as C;
        use RunnerError as E;
        match self {
            E::InvalidRequest(_) => (400, C::InvalidRequest, "Invalid request"),
            E::Unauthorized => (401, C::Unauthorized, "Unauthorized"),
            E::CrossOrigin(_) => (403, C::CrossOrigin, "Cross-origin request"),
            E::SessionTaken(_) => (409, C::SessionExists, "Session exists"),
            E::SessionNotFound(_) | E::NoRoute(_) => (404, C::NotFound, "Not found"),
            E::MethodNotAllowed(_) => (405, C::MethodNotAllowed, "Method not allowed"),
            E::NotProtocol2(_) => (409, C::NotProtocol2, "Not a protocol 2 session"),
            E::UnknownCall(_) => (404, C::UnknownCall, "Unknown tool call"),
            E::AlreadyAnswered(_) => (409, C::AlreadyAnswered, "Tool call already answered"),
            E::CallClosed(_) => (409, C::SessionEnded, "Session ended"),
            E::Undecryptable(_) => (400, C::DecryptionFailed, "Decryption failed"),
            E::TooLarge(_) => (413, C::BodyTooLarge, "Request body too large"),
            E::AtCapacity(_) => (503, C::AtCapacity, "Runner at capacity"),
            E::EventsGone { .. } => (410, C::EventsGone, "Events no longer retained"),
            E::WorkdirUnavailable(_) => {
                (502, C::WorkdirUnavailable, "Working directory unavailable")
            }
            E::TokenRequired(_) | E::Spawn(_) | E::Io { .. } => {
                (500, C::Internal, "Internal error")
            }
        }
    }

    /// What a person reads; an internal error's own words stay in the log.
    fn detail(&self) -> String {
        match self {
            RunnerError::InvalidRequest(errors) => {
                let names: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                format!("bad fields: {}", names.join(", "))
            }
            RunnerError::WorkdirUnavailable(_) => {
                "the runner could not fetch the chat's working directory from the workspace"
                    .to_owned()
            }
            RunnerError::TokenRequired(_) | RunnerError::Spawn(_) | RunnerError::Io { .. } => {
                "the runner could not start the sandbox; see the runner's log".to_owned()
            }
            _ => self.to_string(),
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

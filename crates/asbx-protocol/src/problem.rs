//! RFC 9457 problem details, the body of every HTTP error asbx sends.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `code` of a `413`, from the runner and the workspace alike: a request
/// body over the limit (CONTRACT.md §1, "413 body too large").
pub const BODY_TOO_LARGE: &str = ProblemCode::BodyTooLarge.as_str();

/// Every stable `code` a problem body of asbx carries, the runner's
/// (its routes, gateway and egress proxy) and the workspace's in one list,
/// so a code the workspace passes through from a runner is the same value
/// on both sides, and one condition has one name (`body_too_large`).
///
/// `Problem::code` stays a string: a gateway passes an MCP server's or a
/// runner's refusal through as it came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    // `400`: the body, a field or a parameter is wrong (`errors` names each).
    InvalidRequest,
    // `401`: a credential is missing or wrong.
    Unauthorized,
    // `401`: a one-time token unknown, expired, used or not this session's.
    OtpRejected,
    // `403`: not allowed to this caller.
    Forbidden,
    // `403`: a state-changing request from another origin (workspace).
    CrossOrigin,
    // `403`: a `Host` the workspace does not answer to.
    HostNotAllowed,
    // `404`: no such thing (or route).
    NotFound,
    // `405`: the route has no such method.
    MethodNotAllowed,
    // `413`: a request body over the limit, from either service.
    BodyTooLarge,
    // `415`: not `application/json`.
    UnsupportedMediaType,
    // `409`: a chat already has a turn running (workspace).
    TurnInFlight,
    // `409`: the request clashes with what is stored (workspace).
    Conflict,
    // `503`: no runner configured (workspace).
    SandboxUrlMissing,
    // `400`: a runner URL that is not one of the operator's (workspace).
    SandboxUrlNotAllowed,
    // `400` from the workspace, `403` from the gateway: a model not allowed.
    ModelNotAllowed,
    // `502`: the runner refused or could not be reached (workspace).
    UpstreamFailed,
    // `410`: the lines after a cursor are no longer kept (both).
    EventsGone,
    // `503`: the database cannot be reached now (workspace).
    DatabaseUnavailable,
    // `500`: see the service's log.
    Internal,
    // `409`: a runner session id already taken.
    SessionExists,
    // `409`: a runner session that does not speak protocol 2.
    #[serde(rename = "not_protocol_2")]
    NotProtocol2,
    // `404`: no tool call of that id is waiting for an answer.
    UnknownCall,
    // `409`: the tool call was already answered.
    AlreadyAnswered,
    // `409`/`410`: the session ended (before the call was answered).
    SessionEnded,
    // `400`: an encrypted tool result did not open with the session's key.
    DecryptionFailed,
    // `503`: the runner runs its most sandboxes (`Retry-After`).
    AtCapacity,
    // `404`: the gateway knows no such model provider.
    UnknownProvider,
    // `403`: a provider path the gateway does not forward.
    ModelPathNotAllowed,
    // `404`: the gateway knows no such MCP server.
    UnknownMcpServer,
    // `429`: a sandbox holds its most open gateway calls.
    TooManyCalls,
    // `502`: an upstream answer the gateway could not use.
    UpstreamInvalid,
    // `502`: an upstream the gateway or egress proxy could not reach.
    UpstreamUnreachable,
    // `502`: an upstream host name that did not resolve (egress proxy).
    UpstreamUnresolvable,
    // `502`: the upstream's TLS failed the egress proxy's verification.
    UpstreamTlsFailed,
    // `403`: a secret's placeholder sent to a host it is not bound to.
    SecretPlaceholder,
    // `403`: a host not in the sandbox's egress allow list.
    EgressHostNotAllowed,
    // `403`: a port the egress proxy does not connect to.
    EgressPortNotAllowed,
    // `403`: a host resolving to an internal address.
    EgressInternalAddress,
    // `403`: a `Host` header not the host connected to.
    EgressHostMismatch,
    // `503`: the listener holds its most connections (`Retry-After`).
    TooManyConnections,
    // `429`: a workspace quota is used up (workspace; `quota` names it,
    // `Retry-After` when waiting helps).
    QuotaExceeded,
    // `502`: the runner could not fetch a chat's kept working directory
    // from the workspace (after retrying), so the sandbox did not start.
    WorkdirUnavailable,
    // `409`: a chat that kept no working directory to start from (workspace).
    WorkdirNotKept,
    // `410`: a turn's working directory whose bytes are no longer kept,
    // past its chat's `ASBX_WORKDIR_KEEP_TURNS` (workspace).
    WorkdirGone,
}

impl ProblemCode {
    /// Every code.
    pub const ALL: [ProblemCode; 44] = [
        ProblemCode::InvalidRequest,
        ProblemCode::Unauthorized,
        ProblemCode::OtpRejected,
        ProblemCode::Forbidden,
        ProblemCode::CrossOrigin,
        ProblemCode::HostNotAllowed,
        ProblemCode::NotFound,
        ProblemCode::MethodNotAllowed,
        ProblemCode::BodyTooLarge,
        ProblemCode::UnsupportedMediaType,
        ProblemCode::TurnInFlight,
        ProblemCode::Conflict,
        ProblemCode::SandboxUrlMissing,
        ProblemCode::SandboxUrlNotAllowed,
        ProblemCode::ModelNotAllowed,
        ProblemCode::UpstreamFailed,
        ProblemCode::EventsGone,
        ProblemCode::DatabaseUnavailable,
        ProblemCode::Internal,
        ProblemCode::SessionExists,
        ProblemCode::NotProtocol2,
        ProblemCode::UnknownCall,
        ProblemCode::AlreadyAnswered,
        ProblemCode::SessionEnded,
        ProblemCode::DecryptionFailed,
        ProblemCode::AtCapacity,
        ProblemCode::UnknownProvider,
        ProblemCode::ModelPathNotAllowed,
        ProblemCode::UnknownMcpServer,
        ProblemCode::TooManyCalls,
        ProblemCode::UpstreamInvalid,
        ProblemCode::UpstreamUnreachable,
        ProblemCode::UpstreamUnresolvable,
        ProblemCode::UpstreamTlsFailed,
        ProblemCode::SecretPlaceholder,
        ProblemCode::EgressHostNotAllowed,
        ProblemCode::EgressPortNotAllowed,
        ProblemCode::EgressInternalAddress,
        ProblemCode::EgressHostMismatch,
        ProblemCode::TooManyConnections,
        ProblemCode::QuotaExceeded,
        ProblemCode::WorkdirUnavailable,
        ProblemCode::WorkdirNotKept,
        ProblemCode::WorkdirGone,
    ];

    /// The code on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProblemCode::InvalidRequest => "invalid_request",
            ProblemCode::Unauthorized => "unauthorized",
            ProblemCode::OtpRejected => crate::codes::OTP_REJECTED,
            ProblemCode::Forbidden => "forbidden",
            ProblemCode::CrossOrigin => "cross_origin",
            ProblemCode::HostNotAllowed => "host_not_allowed",
            ProblemCode::NotFound => "not_found",
            ProblemCode::MethodNotAllowed => "method_not_allowed",
            ProblemCode::BodyTooLarge => "body_too_large",
            ProblemCode::UnsupportedMediaType => "unsupported_media_type",
            ProblemCode::TurnInFlight => "turn_in_flight",
            ProblemCode::Conflict => "conflict",
            ProblemCode::SandboxUrlMissing => "sandbox_url_missing",
            ProblemCode::SandboxUrlNotAllowed => "sandbox_url_not_allowed",
            ProblemCode::ModelNotAllowed => "model_not_allowed",
            ProblemCode::UpstreamFailed => "upstream_failed",
            ProblemCode::EventsGone => "events_gone",
            ProblemCode::DatabaseUnavailable => "database_unavailable",
            ProblemCode::Internal => crate::codes::INTERNAL,
            ProblemCode::SessionExists => "session_exists",
            ProblemCode::NotProtocol2 => "not_protocol_2",
            ProblemCode::UnknownCall => "unknown_call",
            ProblemCode::AlreadyAnswered => "already_answered",
            ProblemCode::SessionEnded => "session_ended",
            ProblemCode::DecryptionFailed => "decryption_failed",
            ProblemCode::AtCapacity => "at_capacity",
            ProblemCode::UnknownProvider => "unknown_provider",
            ProblemCode::ModelPathNotAllowed => "model_path_not_allowed",
            ProblemCode::UnknownMcpServer => "unknown_mcp_server",
            ProblemCode::TooManyCalls => "too_many_calls",
            ProblemCode::UpstreamInvalid => "upstream_invalid",
            ProblemCode::UpstreamUnreachable => "upstream_unreachable",
            ProblemCode::UpstreamUnresolvable => "upstream_unresolvable",
            ProblemCode::UpstreamTlsFailed => "upstream_tls_failed",
            ProblemCode::SecretPlaceholder => "secret_placeholder",
            ProblemCode::EgressHostNotAllowed => "egress_host_not_allowed",
            ProblemCode::EgressPortNotAllowed => "egress_port_not_allowed",
            ProblemCode::EgressInternalAddress => "egress_internal_address",
            ProblemCode::EgressHostMismatch => "egress_host_mismatch",
            ProblemCode::TooManyConnections => "too_many_connections",
            ProblemCode::QuotaExceeded => "quota_exceeded",
            ProblemCode::WorkdirUnavailable => "workdir_unavailable",
            ProblemCode::WorkdirNotKept => "workdir_not_kept",
            ProblemCode::WorkdirGone => "workdir_gone",
        }
    }

    /// The code named `name` on the wire, if it is one of ours.
    pub fn parse(name: &str) -> Option<ProblemCode> {
        ProblemCode::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `application/problem+json` body.
///
/// - `type`: a URI naming the problem kind (`urn:asbx:problem:<code>`).
/// - `title`: a short human summary of the kind.
/// - `status`: the HTTP status.
/// - `detail`: what went wrong this time.
/// - `code`: the stable machine code (snake_case).
/// - `errors`: for `invalid_request`, every bad field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// Extra members, for example `activeTurnId` on a 409, or `oldestSeq` on a 410.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    pub const CONTENT_TYPE: &'static str = "application/problem+json";

    /// A problem with one of asbx's own codes.
    pub fn of(status: u16, code: ProblemCode, title: &str, detail: impl Into<String>) -> Self {
        Problem::new(status, code.as_str(), title, detail)
    }

    /// A problem with any code (one passed through from another service).
    pub fn new(status: u16, code: &str, title: &str, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("urn:asbx:problem:{code}"),
            title: title.to_owned(),
            status,
            detail: detail.into(),
            code: code.to_owned(),
            errors: Vec::new(),
            extra: serde_json::Map::new(),
        }
    }

    pub fn with_errors(mut self, errors: Vec<FieldError>) -> Self {
        self.errors = errors;
        self
    }

    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }
}

/// One bad field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        FieldError {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProblemCode;

    #[test]
    fn every_problem_code_is_listed_once_and_serializes_as_its_wire_name() {
        let mut seen = std::collections::BTreeSet::new();
        for code in ProblemCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} listed twice");
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::Value::from(code.as_str())
            );
            assert_eq!(ProblemCode::parse(code.as_str()), Some(code));
            let back: ProblemCode = serde_json::from_value(code.as_str().into()).unwrap();
            assert_eq!(back, code);
        }
        // The schema lists exactly these names.
        let schema = serde_json::to_value(schemars::schema_for!(ProblemCode)).unwrap();
        let mut names: Vec<String> = schema["enum"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let mut want: Vec<String> = seen.into_iter().map(str::to_owned).collect();
        want.sort();
        assert_eq!(names, want);
        assert_eq!(ProblemCode::parse("no_such_code"), None);
    }
}

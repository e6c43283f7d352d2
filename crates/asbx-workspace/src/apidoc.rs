//! The reference-only stand-ins of `asbx-protocol`'s types in the OpenAPI
//! document (`openapi`): each is a `$ref` to the component of the same
//! name, which the document's build fills with the type's schemars schema.
//! Handlers' `#[utoipa::path]` annotations and the wire types' `value_type`s
//! name them (`doc::Line`, ...).
//!
//! It also holds the problem answers many routes share (`doc::Unauthorized`,
//! ...), written once here and named in the annotations as
//! `(status = 401, response = inline(doc::Unauthorized))`.

use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder, schema::Schema};

macro_rules! by_reference {
    ($($name:ident),* $(,)?) => {$(
        pub(crate) struct $name;
        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                RefOr::Ref(Ref::from_schema_name(stringify!($name)))
            }
        }
        impl utoipa::ToSchema for $name {}
    )*};
}

by_reference!(
    Line,
    Problem,
    Skill,
    McpServer,
    RunLimits,
    Termination,
    StepStatus,
    Role,
    EnvResponse,
    ConfigResponse,
    ResultsRequest,
    ResultsResponse,
    AuditEvent,
    RunnerAuditBatch,
);

/// `"encrypted": {"iv", "ciphertext"}`: base64url (no padding) of a
/// 12-byte nonce and of the AES-256-GCM ciphertext with its tag.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct Sealed {
    iv: String,
    ciphertext: String,
}

/// A problem answer: `description` (which codes, when) over a
/// `Problem` body in `application/problem+json`.
fn problem_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            asbx_protocol::Problem::CONTENT_TYPE,
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
        .build()
}

macro_rules! problem_responses {
    ($($(#[$doc:meta])* $name:ident => $description:literal,)*) => {$(
        $(#[$doc])*
        pub(crate) struct $name;
        impl<'r> utoipa::ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), problem_response($description).into())
            }
        }
    )*};
}

// The problem answers more than one route gives, each with the status it
// is listed under.
problem_responses!(
    /// Listed under `401`.
    Unauthorized => "`unauthorized`: a wrong API key, or none where the workspace requires one",
    /// Listed under `415`.
    NotJson => "`unsupported_media_type`: the body is not `application/json`",
    /// Listed under `413`.
    BodyTooLarge => "`body_too_large`: the body is over the limit",
    /// Listed under `401`.
    SandboxTokenRejected => "`unauthorized`: no bearer token; `otp_rejected`: the one-time token is unknown, expired, used or not this session's",
    /// Listed under `502`.
    UpstreamFailed => "`upstream_failed`: the runner refused or could not be reached",
    /// Listed under `404`.
    ChatNotFound => "`not_found`: no such chat in the caller's workspace",
    /// Listed under `404`.
    AgentNotFound => "`not_found`: no such agent in the caller's workspace",
    /// Listed under `404`.
    RunNotFound => "`not_found`: no such run in the caller's workspace",
    /// Listed under `404`.
    FileNotFound => "`not_found`: no such file in the caller's workspace",
    /// Listed under `404`.
    EnvironmentNotFound => "`not_found`: no such environment in the caller's workspace",
    /// Listed under `400`.
    BadRunSettings => "`invalid_request`: the body or a field is wrong (`errors` names each); `model_not_allowed`: a model not among the operator's (the allowed member lists them); `sandbox_url_not_allowed`: a `SANDBOX_URL` that is not one of the operator's runners",
    /// Listed under `503`.
    RunnerUnavailable => "`sandbox_url_missing`: no runner is configured; `at_capacity`: the runner's refusal passed through (a runner's other refusals pass through with their status and code too)",
    /// Listed under `413`.
    ResultsTooLarge => "`body_too_large`: the results are over the limit",
    /// Listed under `409`.
    NamedEnvironmentMissing => "`conflict`: the named environment does not exist",
    /// Listed under `409`.
    NameTaken => "`conflict`: the name is taken",
    /// Listed under `404`.
    NoTurnInFlight => "`not_found`: no turn in flight in this chat",
    /// Listed under `400`.
    BadEnvironment => "`invalid_request`: the body or a field is wrong (`errors` names each); `sandbox_url_not_allowed`: a `SANDBOX_URL` that is not one of the operator's runners",
    /// Listed under `400`.
    BadFieldsOrModel => "`invalid_request`: the body or a field is wrong (`errors` names each); `model_not_allowed`: a model not among the operator's (the allowed member lists them)",
    /// Listed under `400`.
    BadFields => "`invalid_request`: the body or a field is wrong (`errors` names each)",
    /// Listed under `429`.
    QuotaExceeded => "`quota_exceeded`: a quota of the caller's workspace is used up (the quota member names it, the limit member is its value; a Retry-After header when waiting helps)",
);

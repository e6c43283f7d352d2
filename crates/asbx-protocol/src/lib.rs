//! Wire types shared by every part of asbx.
//!
//! This crate is the single source of truth for what crosses a process or
//! network boundary: the dispatch request (`POST /stream`), every NDJSON line,
//! problem bodies, the callback payloads of the workspace, the bootstrap the
//! runner hands the agent, and the policy the runner hands the jail.
//!
//! Architecture invariant: serde and pure functions only. No tokio, no HTTP,
//! no business logic. See `docs/protocol.md` for the rules these types encode.

pub mod audit;
pub mod callback;
pub mod decode;
pub mod dispatch;
pub mod exposition;
pub mod gateway;
pub mod jail;
pub mod line;
pub mod problem;
pub mod raw;
pub mod rules;
pub mod schema;
pub mod session;
pub mod sse;
pub mod workdir;
pub mod ws;

pub use decode::{DecodeError, LineDecoder};
pub use dispatch::{DispatchRequest, FieldError, Filter, Protocol};
pub use line::{Event, EventKind, Line, LogLevel, StepStatus};
pub use problem::{Problem, ProblemCode};

/// Error codes of `error` lines (docs/protocol.md §2): stable snake_case.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    OtpRejected,
    BootstrapFailed,
    SetupFailed,
    ModelError,
    ModelTimeout,
    StepLimitExceeded,
    ToolLimitExceeded,
    DurationLimitExceeded,
    RuntimeCapExceeded,
    Cancelled,
    SandboxCrashed,
    WritebackFailed,
    RunnerLost,
    Internal,
    /// An attachment could not be fetched into the sandbox, or did not
    /// match its declared size and SHA-256.
    AttachmentFailed,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::OtpRejected,
        ErrorCode::BootstrapFailed,
        ErrorCode::SetupFailed,
        ErrorCode::ModelError,
        ErrorCode::ModelTimeout,
        ErrorCode::StepLimitExceeded,
        ErrorCode::ToolLimitExceeded,
        ErrorCode::DurationLimitExceeded,
        ErrorCode::RuntimeCapExceeded,
        ErrorCode::Cancelled,
        ErrorCode::SandboxCrashed,
        ErrorCode::WritebackFailed,
        ErrorCode::RunnerLost,
        ErrorCode::Internal,
        ErrorCode::AttachmentFailed,
    ];

    /// The wire string.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::OtpRejected => "otp_rejected",
            ErrorCode::BootstrapFailed => "bootstrap_failed",
            ErrorCode::SetupFailed => "setup_failed",
            ErrorCode::ModelError => "model_error",
            ErrorCode::ModelTimeout => "model_timeout",
            ErrorCode::StepLimitExceeded => "step_limit_exceeded",
            ErrorCode::ToolLimitExceeded => "tool_limit_exceeded",
            ErrorCode::DurationLimitExceeded => "duration_limit_exceeded",
            ErrorCode::RuntimeCapExceeded => "runtime_cap_exceeded",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::SandboxCrashed => "sandbox_crashed",
            ErrorCode::WritebackFailed => "writeback_failed",
            ErrorCode::RunnerLost => "runner_lost",
            ErrorCode::Internal => "internal",
            ErrorCode::AttachmentFailed => "attachment_failed",
        }
    }

    /// The code named `name` on the wire, if it is one of ours. An agent may
    /// also use other snake_case codes; those stay strings.
    pub fn parse(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The [`ErrorCode`] strings as constants, for `match` arms and literals.
pub mod codes {
    use super::ErrorCode;

    pub const OTP_REJECTED: &str = ErrorCode::OtpRejected.as_str();
    pub const BOOTSTRAP_FAILED: &str = ErrorCode::BootstrapFailed.as_str();
    pub const SETUP_FAILED: &str = ErrorCode::SetupFailed.as_str();
    pub const MODEL_ERROR: &str = ErrorCode::ModelError.as_str();
    pub const MODEL_TIMEOUT: &str = ErrorCode::ModelTimeout.as_str();
    pub const STEP_LIMIT_EXCEEDED: &str = ErrorCode::StepLimitExceeded.as_str();
    pub const TOOL_LIMIT_EXCEEDED: &str = ErrorCode::ToolLimitExceeded.as_str();
    pub const DURATION_LIMIT_EXCEEDED: &str = ErrorCode::DurationLimitExceeded.as_str();
    pub const RUNTIME_CAP_EXCEEDED: &str = ErrorCode::RuntimeCapExceeded.as_str();
    pub const CANCELLED: &str = ErrorCode::Cancelled.as_str();
    pub const SANDBOX_CRASHED: &str = ErrorCode::SandboxCrashed.as_str();
    pub const WRITEBACK_FAILED: &str = ErrorCode::WritebackFailed.as_str();
    pub const RUNNER_LOST: &str = ErrorCode::RunnerLost.as_str();
    pub const INTERNAL: &str = ErrorCode::Internal.as_str();
    pub const ATTACHMENT_FAILED: &str = ErrorCode::AttachmentFailed.as_str();
}

/// Exit codes the sandbox processes (`asbx jail`, `asbx agent`) end with.
pub mod exit {
    /// The jail could not build the sandbox; nothing was executed
    /// (the convention of `env`, `chroot` and container runtimes).
    pub const SETUP_FAILED: u8 = 125;
    /// The command was found but could not be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// A usage error of `asbx jail` or `asbx agent` (bad arguments or policy).
    pub const USAGE: u8 = 2;
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

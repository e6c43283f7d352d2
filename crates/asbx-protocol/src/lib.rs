//! Wire types shared by every part of asbx.
//!
//! This crate is the single source of truth for what crosses a process or
//! network boundary: the dispatch request (`POST /stream`), every NDJSON line,
//! problem bodies, the callback payloads of the workspace, the bootstrap the
//! runner hands the agent, and the policy the runner hands the jail.
//!
//! Architecture invariant: serde and pure functions only. No tokio, no HTTP,
//! no business logic. See `CONTRACT.md` (shared) for the rules these types encode.

pub mod callback;
pub mod decode;
pub mod dispatch;
pub mod gateway;
pub mod jail;
pub mod line;
pub mod problem;
pub mod raw;
pub mod schema;
pub mod session;

pub use decode::{DecodeError, LineDecoder};
pub use dispatch::{DispatchRequest, FieldError, Filter, Protocol};
pub use line::{Event, Line, LogLevel, StepStatus};
pub use problem::Problem;

/// Error codes of `error` lines (CONTRACT section 2). Stable snake_case strings.
pub mod codes {
    pub const OTP_REJECTED: &str = "otp_rejected";
    pub const BOOTSTRAP_FAILED: &str = "bootstrap_failed";
    pub const SETUP_FAILED: &str = "setup_failed";
    pub const MODEL_ERROR: &str = "model_error";
    pub const MODEL_TIMEOUT: &str = "model_timeout";
    pub const STEP_LIMIT_EXCEEDED: &str = "step_limit_exceeded";
    pub const TOOL_LIMIT_EXCEEDED: &str = "tool_limit_exceeded";
    pub const DURATION_LIMIT_EXCEEDED: &str = "duration_limit_exceeded";
    pub const RUNTIME_CAP_EXCEEDED: &str = "runtime_cap_exceeded";
    pub const CANCELLED: &str = "cancelled";
    pub const SANDBOX_CRASHED: &str = "sandbox_crashed";
    pub const INTERNAL: &str = "internal";
}

/// Current Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

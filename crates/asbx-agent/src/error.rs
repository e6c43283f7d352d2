//! The agent's one error enum and its mapping to stable `error` line codes.

use asbx_protocol::codes;

use crate::providers::ModelError;

/// Everything that ends a turn with an `error` line instead of `result`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AgentError {
    #[error("the gateway rejected the {0} token")]
    OtpRejected(&'static str),
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    #[error("setup script failed ({status}): {tail}")]
    SetupFailed { status: String, tail: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("step limit exceeded: the model used all {0} steps without a final answer")]
    StepLimit(u32),
    #[error("tool call limit exceeded: at most {0} tool calls per run")]
    ToolLimit(u32),
    #[error("duration limit exceeded: the run took longer than {0} ms")]
    DurationLimit(u64),
    #[error("could not write to stdout: {0}")]
    Output(#[source] std::io::Error),
}

impl AgentError {
    /// The stable `code` of the `error` line (CONTRACT section 2).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            AgentError::OtpRejected(_) => codes::OTP_REJECTED,
            AgentError::Bootstrap(_) => codes::BOOTSTRAP_FAILED,
            AgentError::SetupFailed { .. } => codes::SETUP_FAILED,
            AgentError::Model(e) => e.code(),
            AgentError::StepLimit(_) => codes::STEP_LIMIT_EXCEEDED,
            AgentError::ToolLimit(_) => codes::TOOL_LIMIT_EXCEEDED,
            AgentError::DurationLimit(_) => codes::DURATION_LIMIT_EXCEEDED,
            AgentError::Output(_) => codes::INTERNAL,
        }
    }
}

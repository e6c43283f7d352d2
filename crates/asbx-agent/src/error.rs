//! The agent's one error enum and its mapping to stable `error` line codes.

use asbx_protocol::ErrorCode;

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
    #[error("attachment {path}: {reason}")]
    Attachment { path: String, reason: String },
    #[error("writeback failed: {0}")]
    Writeback(String),
    /// The turn failed, and the writeback after it failed too.
    #[error("{error}; and the writeback failed: {writeback}")]
    AndWriteback {
        error: Box<AgentError>,
        writeback: String,
    },
    #[error("could not write to stdout: {0}")]
    Output(#[source] std::io::Error),
}

impl AgentError {
    /// The stable `code` of the `error` line (docs/protocol.md §2).
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            AgentError::OtpRejected(_) => ErrorCode::OtpRejected,
            AgentError::Bootstrap(_) => ErrorCode::BootstrapFailed,
            AgentError::SetupFailed { .. } => ErrorCode::SetupFailed,
            AgentError::Model(e) => e.code(),
            AgentError::StepLimit(_) => ErrorCode::StepLimitExceeded,
            AgentError::ToolLimit(_) => ErrorCode::ToolLimitExceeded,
            AgentError::DurationLimit(_) => ErrorCode::DurationLimitExceeded,
            AgentError::Attachment { .. } => ErrorCode::AttachmentFailed,
            AgentError::Writeback(_) => ErrorCode::WritebackFailed,
            AgentError::AndWriteback { error, .. } => error.code(),
            AgentError::Output(_) => ErrorCode::Internal,
        }
    }
}

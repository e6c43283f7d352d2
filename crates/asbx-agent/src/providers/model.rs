//! The provider-neutral conversation and the one trait every provider
//! implements: what the loop sends ([`ModelRequest`]), what it gets back
//! ([`ModelTurn`]) or why not ([`ModelError`]), and where streamed text
//! goes ([`DeltaSink`]). A leaf of `providers`: the providers import it,
//! it imports none of them.

use std::time::Duration;

use asbx_protocol::ErrorCode;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::emit::Emitter;

/// One tool the model may call.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCallRequest {
    /// The provider's call id (echoed back with the result).
    pub id: String,
    pub name: String,
    /// The parsed arguments; a string holding the raw text when it was not JSON.
    pub args: Value,
}

/// One message of the provider-neutral conversation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Message {
    User(String),
    Assistant {
        text: String,
        tool_calls: Vec<ToolCallRequest>,
    },
    ToolResult {
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
}

/// What the loop sends for one model call.
#[derive(Debug, Clone)]
pub(crate) struct ModelRequest {
    /// The model name without the `provider:` prefix.
    pub model: String,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
}

/// Token counts of one call (estimated by the scripted model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One complete model answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ModelTurn {
    pub text: String,
    pub tool_calls: Vec<ToolCallRequest>,
    pub usage: Usage,
}

/// Why a model call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ModelError {
    #[error("model provider error ({status}): {message}")]
    Status {
        status: u16,
        message: String,
        retry_after: Option<Duration>,
    },
    #[error("cannot reach the model provider: {0}")]
    Connect(String),
    #[error("model stream ended before the answer was complete: {0}")]
    StreamCut(String),
    #[error("model stream stalled for more than {} ms", .0.as_millis())]
    Stalled(Duration),
    #[error("model provider error: {0}")]
    Provider(String),
    #[error("invalid model response: {0}")]
    Protocol(String),
    #[error("unknown model provider {0:?}")]
    UnknownProvider(String),
    #[error("model must be `provider:model`, got {0:?}")]
    BadModel(String),
}

impl ModelError {
    /// The `error` line code for this failure.
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            ModelError::Stalled(_) => ErrorCode::ModelTimeout,
            ModelError::Status { .. }
            | ModelError::Connect(_)
            | ModelError::StreamCut(_)
            | ModelError::Provider(_)
            | ModelError::Protocol(_)
            | ModelError::UnknownProvider(_)
            | ModelError::BadModel(_) => ErrorCode::ModelError,
        }
    }

    /// Whether trying the same request again may succeed.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            ModelError::Status { status, .. } => *status == 429 || *status >= 500,
            ModelError::Connect(_) | ModelError::StreamCut(_) => true,
            // A stall already waited the whole stall timeout; report it.
            ModelError::Stalled(_)
            | ModelError::Provider(_)
            | ModelError::Protocol(_)
            | ModelError::UnknownProvider(_)
            | ModelError::BadModel(_) => false,
        }
    }
}

/// Where streamed assistant text goes (`delta` lines, protocol 2 only).
#[derive(Debug, Clone)]
pub(crate) struct DeltaSink {
    emitter: Option<Emitter>,
}

impl DeltaSink {
    pub(crate) fn new(emitter: &Emitter) -> Self {
        DeltaSink {
            emitter: emitter.is_v2().then(|| emitter.clone()),
        }
    }

    /// A sink that drops everything.
    #[cfg(test)]
    pub(crate) fn none() -> Self {
        DeltaSink { emitter: None }
    }

    pub(crate) async fn delta(&self, text: &str) {
        if let Some(e) = &self.emitter
            && let Err(err) = e.delta(text).await
        {
            tracing::debug!("cannot write delta: {err}");
        }
    }
}

/// A model provider: one call, one complete turn.
pub(crate) trait Provider: Send + Sync {
    fn turn<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a DeltaSink,
    ) -> BoxFuture<'a, Result<ModelTurn, ModelError>>;
}

/// Extracts a human message from a provider's error body
/// (`{"error":{"message":..}}` for both OpenAI and Anthropic).
pub(crate) fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Inner {
        message: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Outer {
        error: Option<Inner>,
        message: Option<String>,
    }
    if let Ok(o) = serde_json::from_slice::<Outer>(body)
        && let Some(m) = o.error.and_then(|e| e.message).or(o.message)
    {
        return m;
    }
    let text = String::from_utf8_lossy(body);
    asbx_protocol::rules::truncate_with_marker(text.trim(), 1024)
}

//! The NDJSON line types (CONTRACT sections 2 and 4).
//!
//! On the wire a line is one flat JSON object:
//! `{"type":"step","seq":3,"ts":1700000000123,"sessionId":"s1","id":"step_1",...}`.
//! [`Line`] is the stamped form a runner emits; [`Event`] is the payload alone,
//! which is what the agent writes on its stdout (the runner stamps the rest).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stamped line of a session's stream.
///
/// - `seq`: 1, 2, 3, ... per session, no gaps in the unfiltered stream.
/// - `ts`: Unix epoch milliseconds, set by the runner.
/// - `sessionId`: the session this line belongs to.
/// - the rest: the [`Event`], flattened, with its `type` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Line {
    pub seq: u64,
    pub ts: u64,
    #[serde(rename = "sessionId")]
    pub session_id: String,
    #[serde(flatten)]
    pub event: Event,
}

/// Every line type, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Log(Log),
    Step(Step),
    Result(ResultLine),
    Error(ErrorLine),
    SessionInit(SessionInit),
    Delta(Delta),
    Stdout(Stdout),
    ToolCall(ToolCall),
    ToolResultApplied(ToolResultApplied),
    Heartbeat(Heartbeat),
    SessionEnded(crate::session::Termination),
}

impl Event {
    /// The wire name of this event's `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Log(_) => "log",
            Event::Step(_) => "step",
            Event::Result(_) => "result",
            Event::Error(_) => "error",
            Event::SessionInit(_) => "session_init",
            Event::Delta(_) => "delta",
            Event::Stdout(_) => "stdout",
            Event::ToolCall(_) => "tool_call",
            Event::ToolResultApplied(_) => "tool_result_applied",
            Event::Heartbeat(_) => "heartbeat",
            Event::SessionEnded(_) => "session_ended",
        }
    }

    /// `result` and `error` end a turn.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::Result(_) | Event::Error(_))
    }

    pub fn log(level: LogLevel, message: impl Into<String>) -> Self {
        Event::Log(Log {
            level,
            message: message.into(),
        })
    }

    pub fn error(code: impl Into<String>, message: impl Into<String>) -> Self {
        Event::Error(ErrorLine {
            code: code.into(),
            message: message.into(),
        })
    }
}

/// The four line types of protocol 1 (seed 000).
pub const PROTOCOL1_TYPES: &[&str] = &["log", "step", "result", "error"];

/// Every line type of protocol 2.
pub const ALL_TYPES: &[&str] = &[
    "log",
    "step",
    "result",
    "error",
    "session_init",
    "delta",
    "stdout",
    "tool_call",
    "tool_result_applied",
    "heartbeat",
    "session_ended",
];

/// `log`: free-form diagnostics; not shown in a chat thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Log {
    pub level: LogLevel,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// `step`: one tool call of the agent loop.
///
/// - `id`: correlates the `running` line with its single `succeeded`/`failed` line.
/// - `name`: what ran (`shell`, `recipes/add-node.sh`, `server/tool`, ...).
/// - `args`: the model's arguments (on `running`).
/// - `result`: the tool's return value, truncated for display (on `succeeded`).
/// - `error`: the failure message (on `failed`).
/// - `durationMs`: on `succeeded` and `failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    pub id: String,
    pub name: String,
    pub status: StepStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Running,
    Succeeded,
    Failed,
}

/// `result`: the final assistant message, exactly once per successful turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultLine {
    pub message: String,
}

/// `error`: terminal failure in place of `result`; `code` is one of [`crate::codes`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorLine {
    pub code: String,
    pub message: String,
}

/// `session_init` (protocol 2): the first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionInit {
    pub protocol_version: u8,
    pub limits: SessionLimits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionInit>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionLimits {
    pub max_duration_ms: u64,
    pub max_steps: u32,
    pub max_tool_calls: u32,
    pub heartbeat_interval_ms: u64,
}

/// The server half of the end-to-end encryption handshake (protocol 2).
///
/// - `curve`: always `P-256`.
/// - `serverPublicKey`: the server's ephemeral public key, uncompressed SEC1, base64.
/// - `salt`: the HKDF salt, base64.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncryptionInit {
    pub curve: String,
    pub server_public_key: String,
    pub salt: String,
}

/// `delta` (protocol 2): assistant text as the model streams it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    pub text: String,
}

/// `stdout` (protocol 2): a tool's output while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Stdout {
    pub step_id: String,
    pub stream: OutputStream,
    pub chunk: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// `tool_call` (protocol 2): the agent calls a client tool and waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCall {
    pub call_id: String,
    pub tool_name: String,
    pub args: Value,
}

/// `tool_result_applied` (protocol 2): the client's result reached the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolResultApplied {
    pub call_id: String,
}

/// `heartbeat` (protocol 2): no payload.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn line_is_flat_on_the_wire() {
        let line = Line {
            seq: 3,
            ts: 1_700_000_000_123,
            session_id: "s1".into(),
            event: Event::Step(Step {
                id: "step_1".into(),
                name: "shell".into(),
                status: StepStatus::Succeeded,
                args: None,
                result: Some(json!({"exitCode": 0})),
                error: None,
                duration_ms: Some(412),
            }),
        };
        let v = serde_json::to_value(&line).unwrap();
        assert_eq!(
            v,
            json!({"seq":3,"ts":1_700_000_000_123u64,"sessionId":"s1","type":"step","id":"step_1",
                   "name":"shell","status":"succeeded","result":{"exitCode":0},"durationMs":412})
        );
        let back: Line = serde_json::from_value(v).unwrap();
        assert_eq!(back, line);
    }

    #[test]
    fn unknown_type_is_rejected() {
        let err =
            serde_json::from_str::<Line>(r#"{"seq":1,"ts":1,"sessionId":"s","type":"bogus"}"#);
        assert!(err.is_err());
    }

    #[test]
    fn type_names_match_serde_tags() {
        let events = [
            Event::log(LogLevel::Info, "x"),
            Event::error("internal", "x"),
            Event::Heartbeat(Heartbeat {}),
            Event::Delta(Delta { text: "x".into() }),
        ];
        for e in events {
            let v = serde_json::to_value(&e).unwrap();
            assert_eq!(v["type"], e.type_name());
            assert!(ALL_TYPES.contains(&e.type_name()));
        }
    }
}

//! The NDJSON line types (docs/protocol.md §2 and §4).
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
    /// This event's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::Log(_) => EventKind::Log,
            Event::Step(_) => EventKind::Step,
            Event::Result(_) => EventKind::Result,
            Event::Error(_) => EventKind::Error,
            Event::SessionInit(_) => EventKind::SessionInit,
            Event::Delta(_) => EventKind::Delta,
            Event::Stdout(_) => EventKind::Stdout,
            Event::ToolCall(_) => EventKind::ToolCall,
            Event::ToolResultApplied(_) => EventKind::ToolResultApplied,
            Event::Heartbeat(_) => EventKind::Heartbeat,
            Event::SessionEnded(_) => EventKind::SessionEnded,
        }
    }

    /// The wire name of this event's `type`.
    pub fn type_name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// `result` and `error` end a turn.
    pub fn is_terminal(&self) -> bool {
        self.kind().is_terminal()
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

/// The one list of line types (docs/protocol.md §2 and §4). Every other part
/// names a type through this enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Log,
    Step,
    Result,
    Error,
    SessionInit,
    Delta,
    Stdout,
    ToolCall,
    ToolResultApplied,
    Heartbeat,
    SessionEnded,
}

impl EventKind {
    /// Every kind, in the order of docs/protocol.md §2 and §4.
    pub const ALL: [EventKind; 11] = [
        EventKind::Log,
        EventKind::Step,
        EventKind::Result,
        EventKind::Error,
        EventKind::SessionInit,
        EventKind::Delta,
        EventKind::Stdout,
        EventKind::ToolCall,
        EventKind::ToolResultApplied,
        EventKind::Heartbeat,
        EventKind::SessionEnded,
    ];

    /// The wire name (`session_init`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            EventKind::Log => "log",
            EventKind::Step => "step",
            EventKind::Result => "result",
            EventKind::Error => "error",
            EventKind::SessionInit => "session_init",
            EventKind::Delta => "delta",
            EventKind::Stdout => "stdout",
            EventKind::ToolCall => "tool_call",
            EventKind::ToolResultApplied => "tool_result_applied",
            EventKind::Heartbeat => "heartbeat",
            EventKind::SessionEnded => "session_ended",
        }
    }

    /// The kind named `name` on the wire, if any.
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether protocol 1 carries this kind (protocol 1's four).
    pub const fn in_protocol1(self) -> bool {
        matches!(
            self,
            EventKind::Log | EventKind::Step | EventKind::Result | EventKind::Error
        )
    }

    /// `result` and `error` end a turn.
    pub const fn is_terminal(self) -> bool {
        matches!(self, EventKind::Result | EventKind::Error)
    }

    /// Whether an agent may write this kind; `session_init`, `heartbeat`
    /// and `session_ended` belong to the runner.
    pub const fn agent_may_emit(self) -> bool {
        !matches!(
            self,
            EventKind::SessionInit | EventKind::Heartbeat | EventKind::SessionEnded
        )
    }

    /// Whether a filter always lets this kind through (docs/protocol.md §4).
    pub const fn always_passes_filter(self) -> bool {
        matches!(
            self,
            EventKind::Result | EventKind::Error | EventKind::SessionEnded
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// The server half of the end-to-end encryption handshake (protocol 2,
/// `docs/protocol.md` §4), sent in the clear in `session_init`.
///
/// - `algorithm`: always `ECDH-P256+HKDF-SHA256+AES-256-GCM`.
/// - `serverPublicKey`: the server's ephemeral P-256 public key, uncompressed
///   SEC1, base64url without padding.
/// - `salt`: the HKDF salt, 32 random bytes, base64url without padding.
/// - `signature`: the runner's identity key's ECDSA P-256 SHA-256 signature
///   (the 64 bytes `r || s`, base64url without padding) of the UTF-8 of
///   `"asbx-e2e-v1-sig:" + sessionId + "." + serverPublicKey + "." + salt`.
/// - `identityKey`: the runner's identity public key (`GET /v1/identity`),
///   uncompressed SEC1, base64url without padding. A client that pinned the
///   runner's key checks the signature under the pinned key, never this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncryptionInit {
    pub algorithm: String,
    pub server_public_key: String,
    pub salt: String,
    pub signature: String,
    pub identity_key: String,
}

/// `"encrypted": {"iv", "ciphertext"}` of an encrypted line or tool result:
/// base64url (no padding) of a 12-byte nonce and of the AES-256-GCM
/// ciphertext with its 16-byte tag appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sealed {
    pub iv: String,
    pub ciphertext: String,
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

    /// One line of every kind, as the wire carries it (one NDJSON line
    /// each): a change to any field name, tag or order shows in the snapshot.
    #[test]
    fn every_line_kind_on_the_wire() {
        use crate::session::{EndReason, SessionStats, StderrOutput, TerminatedBy, Termination};
        let events = vec![
            Event::log(LogLevel::Info, "loaded 2 skills"),
            Event::Step(Step {
                id: "step_1".into(),
                name: "shell".into(),
                status: StepStatus::Running,
                args: Some(json!({"command": "ls"})),
                result: None,
                error: None,
                duration_ms: None,
            }),
            Event::Step(Step {
                id: "step_1".into(),
                name: "shell".into(),
                status: StepStatus::Failed,
                args: None,
                result: None,
                error: Some("exit code 2".into()),
                duration_ms: Some(12),
            }),
            Event::Result(ResultLine {
                message: "done".into(),
            }),
            Event::error("model_timeout", "no answer in 60 s"),
            Event::SessionInit(SessionInit {
                protocol_version: 2,
                limits: SessionLimits {
                    max_duration_ms: 60_000,
                    max_steps: 50,
                    max_tool_calls: 200,
                    heartbeat_interval_ms: 5_000,
                },
                encryption: Some(EncryptionInit {
                    algorithm: "ECDH-P256+HKDF-SHA256+AES-256-GCM".into(),
                    server_public_key: "BPub".into(),
                    salt: "c2FsdA".into(),
                    signature: "c2ln".into(),
                    identity_key: "BId".into(),
                }),
            }),
            Event::Delta(Delta { text: "Hel".into() }),
            Event::Stdout(Stdout {
                step_id: "step_2".into(),
                stream: OutputStream::Stderr,
                chunk: "warning\n".into(),
            }),
            Event::ToolCall(ToolCall {
                call_id: "call_1".into(),
                tool_name: "pick_color".into(),
                args: json!({"hint": "warm"}),
            }),
            Event::ToolResultApplied(ToolResultApplied {
                call_id: "call_1".into(),
            }),
            Event::Heartbeat(Heartbeat {}),
            Event::SessionEnded(Termination {
                reason: EndReason::Error,
                terminated_by: TerminatedBy::Agent,
                message: Some("sandbox crashed".into()),
                exit_code: Some(137),
                signal: None,
                stderr: Some(StderrOutput {
                    head: Some("boom".into()),
                    tail: None,
                    truncated: false,
                    total_lines: 1,
                }),
                stats: SessionStats {
                    duration_ms: 812,
                    steps: 2,
                    tool_calls: 1,
                    input_tokens: 30,
                    output_tokens: 7,
                },
            }),
        ];
        let kinds: std::collections::HashSet<_> = events.iter().map(Event::kind).collect();
        assert_eq!(kinds.len(), EventKind::ALL.len(), "one line of every kind");
        let mut ndjson = String::new();
        for (i, event) in events.into_iter().enumerate() {
            let line = Line {
                seq: i as u64 + 1,
                ts: 1_700_000_000_000 + i as u64,
                session_id: "s1".into(),
                event,
            };
            ndjson.push_str(&serde_json::to_string(&line).unwrap());
            ndjson.push('\n');
        }
        insta::assert_snapshot!(ndjson);
    }

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
            assert_eq!(EventKind::parse(e.type_name()), Some(e.kind()));
        }
    }
}

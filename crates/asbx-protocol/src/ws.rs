//! The WebSocket transport (docs/protocol.md §13): what a client sends on
//! `GET /v1/ws` (runner) and `GET /api/runs/ws` (workspace), and the `error`
//! line a server answers a bad message with.
//!
//! Each client text message is one JSON object with a `type`:
//! - `dispatch`: the rest is the body of `POST /stream` (runner) or
//!   `POST /api/runs` (workspace), validated as that body is.
//! - `attach`: `sessionId` (runner) or `runId` (workspace) and `after`
//!   (default 0): the lines with `seq > after`, then the live tail.
//! - `tool_result`: the rest is the body of the `tool-result` route
//!   (`callId` and one of `result`, `error`, `encrypted`).
//! - `cancel`: nothing else; cancels the socket's session.
//!
//! Each server text message is one line exactly as NDJSON carries it (no
//! newline). An answer to a bad client message is an `error` line with
//! `seq: 0` (outside the session's numbering, so never a gap or a
//! duplicate) and a stable `code`; when the socket can't go on it is then
//! closed with [`CLOSE_POLICY`] and the code as the reason.

use serde_json::{Map, Value};

use crate::{Event, FieldError, Line};

/// Close code once the session's last line was sent.
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code after an `error` line for a message the socket can't go on
/// from (a refused dispatch or attach, a message too large).
pub const CLOSE_POLICY: u16 = 1008;

/// `error` code: `tool_result` or `cancel` before a `dispatch` or `attach`.
pub const NOT_ATTACHED: &str = "not_attached";
/// `error` code: a second `dispatch` or `attach` on a socket that carries a
/// session already (one session per socket).
pub const ALREADY_ATTACHED: &str = "already_attached";

/// What the attach message names its session by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachKey {
    /// The runner: `sessionId`.
    SessionId,
    /// The workspace: `runId`.
    RunId,
}

impl AttachKey {
    pub fn field(self) -> &'static str {
        match self {
            AttachKey::SessionId => "sessionId",
            AttachKey::RunId => "runId",
        }
    }
}

/// One client message.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientMessage {
    /// The dispatch body, without `type`.
    Dispatch(Map<String, Value>),
    /// Resume the session (or run) `id` after `after`.
    Attach {
        id: String,
        after: u64,
    },
    /// The tool-result body, without `type`.
    ToolResult(Map<String, Value>),
    Cancel,
}

impl ClientMessage {
    /// Parses one text message; the error names the bad field.
    pub fn parse(text: &str, key: AttachKey) -> Result<ClientMessage, FieldError> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| FieldError::new("", format!("the message is not JSON: {e}")))?;
        let Value::Object(mut map) = value else {
            return Err(FieldError::new("", "the message must be a JSON object"));
        };
        let kind = match map.remove("type") {
            Some(Value::String(s)) => s,
            Some(_) => return Err(FieldError::new("type", "must be a string")),
            None => return Err(FieldError::new("type", "required")),
        };
        match kind.as_str() {
            "dispatch" => Ok(ClientMessage::Dispatch(map)),
            "tool_result" => Ok(ClientMessage::ToolResult(map)),
            "cancel" => match map.keys().next() {
                Some(k) => Err(FieldError::new(k, "unknown field")),
                None => Ok(ClientMessage::Cancel),
            },
            "attach" => {
                let id = match map.remove(key.field()) {
                    Some(Value::String(s)) if !s.is_empty() => s,
                    Some(_) => {
                        return Err(FieldError::new(key.field(), "must be a non-empty string"));
                    }
                    None => return Err(FieldError::new(key.field(), "required")),
                };
                let after = match map.remove("after") {
                    None | Some(Value::Null) => 0,
                    Some(v) => v.as_u64().ok_or_else(|| {
                        FieldError::new("after", "must be a seq (an integer >= 0)")
                    })?,
                };
                match map.keys().next() {
                    Some(k) => Err(FieldError::new(k, "unknown field")),
                    None => Ok(ClientMessage::Attach { id, after }),
                }
            }
            other => Err(FieldError::new(
                "type",
                format!(
                    "unknown message type {:?}: dispatch, attach, tool_result or cancel",
                    other.chars().take(64).collect::<String>()
                ),
            )),
        }
    }
}

/// The `error` line answering a bad client message: `seq` 0, the socket's
/// session (empty before it has one).
pub fn message_error(session_id: &str, code: &str, message: impl Into<String>) -> String {
    let line = Line {
        seq: 0,
        ts: crate::now_ms(),
        session_id: session_id.to_owned(),
        event: Event::Error(crate::line::ErrorLine {
            code: code.to_owned(),
            message: message.into(),
        }),
    };
    serde_json::to_string(&line).unwrap_or_default()
}

/// Splits a chunk of NDJSON into its lines, each without its newline (one
/// WebSocket message each).
pub fn lines(chunk: &[u8]) -> impl Iterator<Item = &[u8]> {
    chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_by_type_and_bad_ones_name_their_field() {
        let m = ClientMessage::parse(
            r#"{"type":"dispatch","prompt":"hi","protocol":2}"#,
            AttachKey::SessionId,
        )
        .unwrap();
        match m {
            ClientMessage::Dispatch(map) => {
                assert_eq!(map.get("prompt"), Some(&Value::from("hi")));
                assert!(!map.contains_key("type"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ClientMessage::parse(
                r#"{"type":"attach","runId":"r1","after":7}"#,
                AttachKey::RunId
            )
            .unwrap(),
            ClientMessage::Attach {
                id: "r1".into(),
                after: 7
            }
        );
        assert_eq!(
            ClientMessage::parse(r#"{"type":"cancel"}"#, AttachKey::RunId).unwrap(),
            ClientMessage::Cancel
        );
        let bad = |t: &str, k| ClientMessage::parse(t, k).unwrap_err().field;
        assert_eq!(bad("nope", AttachKey::RunId), "");
        assert_eq!(bad("[1]", AttachKey::RunId), "");
        assert_eq!(bad(r#"{"prompt":"x"}"#, AttachKey::RunId), "type");
        assert_eq!(bad(r#"{"type":"launch"}"#, AttachKey::RunId), "type");
        assert_eq!(
            bad(r#"{"type":"attach","sessionId":"s"}"#, AttachKey::RunId),
            "runId"
        );
        assert_eq!(
            bad(
                r#"{"type":"attach","sessionId":"s","after":-1}"#,
                AttachKey::SessionId
            ),
            "after"
        );
        assert_eq!(
            bad(r#"{"type":"cancel","now":true}"#, AttachKey::RunId),
            "now"
        );
    }

    #[test]
    fn a_message_error_is_an_error_line_outside_the_numbering() {
        let text = message_error("s1", "invalid_request", "bad");
        let line: Line = serde_json::from_str(&text).unwrap();
        assert_eq!(line.seq, 0);
        assert_eq!(line.session_id, "s1");
        assert!(matches!(line.event, Event::Error(e) if e.code == "invalid_request"));
        let chunk = b"{\"a\":1}\n{\"b\":2}\n";
        assert_eq!(
            lines(chunk).collect::<Vec<_>>(),
            vec![&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]]
        );
    }
}

//! Zero-copy validation of the lines an agent writes (the runner's hot path).
//!
//! The runner treats the agent's stdout as untrusted. Each line is checked
//! against [`AgentEvent`], a flat borrowed view that allocates nothing for
//! ordinary lines, and must be one of the types an agent may emit, with exactly
//! the fields that type allows. Duplicate keys are refused, so a downstream
//! parser can never see a different line than the one validated. The runner
//! then stamps `seq`, `ts` and `sessionId` by splicing them in front of the
//! original bytes instead of re-serializing.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::line::{LogLevel, OutputStream, StepStatus};

/// Longest step or call id an agent may use.
pub const MAX_ID_BYTES: usize = 128;

/// The kind of a validated agent line: one of [`EventKind`] for which
/// [`EventKind::agent_may_emit`] holds.
pub use crate::line::EventKind as AgentKind;
use crate::line::EventKind;

/// A string that borrows from the line unless it holds escapes.
///
/// A newtype, because serde does not borrow through `Option<Cow<str>>` directly.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// A borrowed, flat view of one agent line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AgentEvent<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Text<'a>,
    pub level: Option<LogLevel>,
    #[serde(borrow)]
    pub message: Option<Text<'a>>,
    #[serde(borrow)]
    pub id: Option<Text<'a>>,
    #[serde(borrow)]
    pub name: Option<Text<'a>>,
    pub status: Option<StepStatus>,
    #[serde(borrow)]
    pub args: Option<&'a RawValue>,
    #[serde(borrow)]
    pub result: Option<&'a RawValue>,
    #[serde(borrow)]
    pub error: Option<Text<'a>>,
    pub duration_ms: Option<u64>,
    #[serde(borrow)]
    pub code: Option<Text<'a>>,
    #[serde(borrow)]
    pub text: Option<Text<'a>>,
    #[serde(borrow)]
    pub step_id: Option<Text<'a>>,
    pub stream: Option<OutputStream>,
    #[serde(borrow)]
    pub chunk: Option<Text<'a>>,
    #[serde(borrow)]
    pub call_id: Option<Text<'a>>,
    #[serde(borrow)]
    pub tool_name: Option<Text<'a>>,
}

/// Why an agent line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RawError {
    #[error("line is not a JSON object with known fields: {0}")]
    Json(String),
    #[error("line type {0:?} may not come from an agent")]
    Type(String),
    #[error("{kind} line is missing `{field}`")]
    Missing {
        kind: &'static str,
        field: &'static str,
    },
    #[error("{kind} line may not carry `{field}`")]
    Extra {
        kind: &'static str,
        field: &'static str,
    },
    #[error("{0}")]
    Invalid(&'static str),
}

const F_LEVEL: u32 = 1 << 0;
const F_MESSAGE: u32 = 1 << 1;
const F_ID: u32 = 1 << 2;
const F_NAME: u32 = 1 << 3;
const F_STATUS: u32 = 1 << 4;
const F_ARGS: u32 = 1 << 5;
const F_RESULT: u32 = 1 << 6;
const F_ERROR: u32 = 1 << 7;
const F_DURATION: u32 = 1 << 8;
const F_CODE: u32 = 1 << 9;
const F_TEXT: u32 = 1 << 10;
const F_STEP_ID: u32 = 1 << 11;
const F_STREAM: u32 = 1 << 12;
const F_CHUNK: u32 = 1 << 13;
const F_CALL_ID: u32 = 1 << 14;
const F_TOOL_NAME: u32 = 1 << 15;

const FIELD_NAMES: [&str; 16] = [
    "level",
    "message",
    "id",
    "name",
    "status",
    "args",
    "result",
    "error",
    "durationMs",
    "code",
    "text",
    "stepId",
    "stream",
    "chunk",
    "callId",
    "toolName",
];

impl<'a> AgentEvent<'a> {
    /// Parses and checks one line (without its trailing newline).
    ///
    /// A raw `\r` or `\n` is refused even where JSON allows it (as
    /// whitespace between tokens): the runner forwards the bytes as they are,
    /// and a reader that ends lines at `\r` (SSE does, some NDJSON readers
    /// do) would see the line cut in two. Inside strings JSON escapes them.
    ///
    /// The commonest shapes (`log`, `delta`, `result` with their fields in
    /// the usual order and a string with no escapes) are recognized byte by
    /// byte; everything else goes through serde. The fast path accepts only
    /// lines serde accepts too, with the same result (`fuzz/agent_line`
    /// checks that against [`AgentEvent::parse_full`]).
    #[inline]
    pub fn parse(line: &'a [u8]) -> Result<(AgentKind, AgentEvent<'a>), RawError> {
        match parse_common(line) {
            Some(v) => Ok(v),
            None => Self::parse_full(line),
        }
    }

    /// [`AgentEvent::parse`] without its fast path: serde and the checks.
    pub fn parse_full(line: &'a [u8]) -> Result<(AgentKind, AgentEvent<'a>), RawError> {
        if memchr::memchr2(b'\n', b'\r', line).is_some() {
            return Err(RawError::Invalid("a line may not hold a raw line break"));
        }
        let ev: AgentEvent<'a> =
            serde_json::from_slice(line).map_err(|e| RawError::Json(e.to_string()))?;
        let kind = ev.check()?;
        for raw in [ev.args, ev.result].into_iter().flatten() {
            check_value(raw)?;
        }
        Ok((kind, ev))
    }

    /// A line of type `kind` with no other field yet.
    fn bare(kind: &'a str) -> Self {
        AgentEvent {
            kind: Text(Cow::Borrowed(kind)),
            level: None,
            message: None,
            id: None,
            name: None,
            status: None,
            args: None,
            result: None,
            error: None,
            duration_ms: None,
            code: None,
            text: None,
            step_id: None,
            stream: None,
            chunk: None,
            call_id: None,
            tool_name: None,
        }
    }

    fn present(&self) -> u32 {
        let mut m = 0;
        let mut set = |cond: bool, bit: u32| {
            if cond {
                m |= bit
            }
        };
        set(self.level.is_some(), F_LEVEL);
        set(self.message.is_some(), F_MESSAGE);
        set(self.id.is_some(), F_ID);
        set(self.name.is_some(), F_NAME);
        set(self.status.is_some(), F_STATUS);
        set(self.args.is_some(), F_ARGS);
        set(self.result.is_some(), F_RESULT);
        set(self.error.is_some(), F_ERROR);
        set(self.duration_ms.is_some(), F_DURATION);
        set(self.code.is_some(), F_CODE);
        set(self.text.is_some(), F_TEXT);
        set(self.step_id.is_some(), F_STEP_ID);
        set(self.stream.is_some(), F_STREAM);
        set(self.chunk.is_some(), F_CHUNK);
        set(self.call_id.is_some(), F_CALL_ID);
        set(self.tool_name.is_some(), F_TOOL_NAME);
        m
    }

    /// Checks the type and that exactly the allowed fields are present.
    pub fn check(&self) -> Result<AgentKind, RawError> {
        let kind = match EventKind::parse(&self.kind) {
            Some(k) if k.agent_may_emit() => k,
            _ => return Err(RawError::Type(self.kind.to_string())),
        };
        let (required, optional) = match kind {
            EventKind::Log => (F_LEVEL | F_MESSAGE, 0),
            EventKind::Step => (
                F_ID | F_NAME | F_STATUS,
                F_ARGS | F_RESULT | F_ERROR | F_DURATION,
            ),
            EventKind::Result => (F_MESSAGE, 0),
            EventKind::Error => (F_CODE | F_MESSAGE, 0),
            EventKind::Delta => (F_TEXT, 0),
            EventKind::Stdout => (F_STEP_ID | F_STREAM | F_CHUNK, 0),
            EventKind::ToolCall => (F_CALL_ID | F_TOOL_NAME | F_ARGS, 0),
            EventKind::ToolResultApplied => (F_CALL_ID, 0),
            EventKind::SessionInit | EventKind::Heartbeat | EventKind::SessionEnded => {
                return Err(RawError::Type(self.kind.to_string()));
            }
        };
        let present = self.present();
        let missing = required & !present;
        if missing != 0 {
            return Err(RawError::Missing {
                kind: kind.as_str(),
                field: FIELD_NAMES[missing.trailing_zeros() as usize],
            });
        }
        let extra = present & !(required | optional);
        if extra != 0 {
            return Err(RawError::Extra {
                kind: kind.as_str(),
                field: FIELD_NAMES[extra.trailing_zeros() as usize],
            });
        }
        let id_ok = |s: &Option<Text<'_>>| {
            s.as_deref()
                .is_none_or(|s| !s.is_empty() && s.len() <= MAX_ID_BYTES)
        };
        if !id_ok(&self.id) || !id_ok(&self.step_id) || !id_ok(&self.call_id) {
            return Err(RawError::Invalid("ids must be 1 to 128 bytes"));
        }
        if kind == AgentKind::Step {
            match self.status {
                Some(StepStatus::Running) if present & (F_DURATION | F_RESULT | F_ERROR) != 0 => {
                    return Err(RawError::Invalid(
                        "a running step carries no result, error or durationMs",
                    ));
                }
                Some(StepStatus::Succeeded | StepStatus::Failed) if self.duration_ms.is_none() => {
                    return Err(RawError::Invalid("a finished step needs durationMs"));
                }
                Some(StepStatus::Failed) if self.error.is_none() => {
                    return Err(RawError::Invalid("a failed step needs error"));
                }
                _ => {}
            }
        }
        if kind == AgentKind::Error {
            let code_ok = self.code.as_deref().is_some_and(|c| {
                (1..=64).contains(&c.len())
                    && c.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            });
            if !code_ok {
                return Err(RawError::Invalid("error code must be snake_case"));
            }
        }
        Ok(kind)
    }
}

/// A line of one of the commonest shapes, validated: exactly
/// `{"type":"log","level":"L","message":"S"}`, `{"type":"delta","text":"S"}`
/// or `{"type":"result","message":"S"}`, no whitespace, `S` a string without
/// escapes. `None` for anything else, which serde then decides
/// ([`AgentEvent::parse_full`]); such a line is valid and needs no further
/// check, so a caller that only needs its kind (the runner's line path) takes
/// it without building an [`AgentEvent`].
#[inline]
pub fn common_kind(line: &[u8]) -> Option<AgentKind> {
    match_common(line).map(|c| c.kind)
}

/// What the fast path read from a line of a common shape.
struct Common<'a> {
    kind: AgentKind,
    level: Option<LogLevel>,
    /// `message` (log, result) or `text` (delta).
    text: &'a str,
}

#[inline]
fn match_common(line: &[u8]) -> Option<Common<'_>> {
    let rest = line.strip_prefix(b"{\"type\":\"")?;
    if let Some(rest) = rest.strip_prefix(b"log\",\"level\":\"") {
        let (level, rest) = [
            (LogLevel::Debug, &b"debug"[..]),
            (LogLevel::Info, b"info"),
            (LogLevel::Warn, b"warn"),
            (LogLevel::Error, b"error"),
        ]
        .into_iter()
        .find_map(|(level, name)| Some((level, rest.strip_prefix(name)?)))?;
        let text = plain_string(rest.strip_prefix(b"\",\"message\":")?)?;
        return Some(Common {
            kind: AgentKind::Log,
            level: Some(level),
            text,
        });
    }
    let (kind, rest) = if let Some(rest) = rest.strip_prefix(b"delta\",\"text\":") {
        (AgentKind::Delta, rest)
    } else {
        (
            AgentKind::Result,
            rest.strip_prefix(b"result\",\"message\":")?,
        )
    };
    Some(Common {
        kind,
        level: None,
        text: plain_string(rest)?,
    })
}

/// The fast path of [`AgentEvent::parse`], [`common_kind`] with its view.
#[inline]
fn parse_common(line: &[u8]) -> Option<(AgentKind, AgentEvent<'_>)> {
    let c = match_common(line)?;
    let mut ev = AgentEvent::bare(c.kind.as_str());
    let text = Some(Text(Cow::Borrowed(c.text)));
    match c.kind {
        AgentKind::Delta => ev.text = text,
        _ => ev.message = text,
    }
    ev.level = c.level;
    Some((c.kind, ev))
}

/// `"S"}` where `S` is valid UTF-8 with no `"`, `\\` or control character
/// (what serde takes as a string as it is): `S`.
fn plain_string(rest: &[u8]) -> Option<&str> {
    let s = rest.strip_prefix(b"\"")?.strip_suffix(b"\"}")?;
    // One branch-free pass (it vectorizes), then UTF-8.
    let mut refused = false;
    for &b in s {
        refused |= (b < 0x20) | (b == b'"') | (b == b'\\');
    }
    if refused {
        return None;
    }
    std::str::from_utf8(s).ok()
}

/// Parses a [`RawValue`] the way a consumer that builds the value will.
///
/// serde_json checks a `RawValue`'s shape but skips what is inside its
/// strings and numbers: a lone surrogate escape (`"\ude00"`) or a number out
/// of range (`1e999`) passes, while every reader that decodes the line
/// (`serde_json::Value`, a browser's `JSON.parse` into a string with a
/// different meaning) refuses or changes it. Found by fuzz/agent_line. Walks
/// the value once, decoding every key and string and every number, keeping
/// nothing.
fn check_value(raw: &RawValue) -> Result<(), RawError> {
    struct Checked;
    struct CheckedVisitor;
    impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
        type Value = Checked;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_unit<E>(self) -> Result<Checked, E> {
            Ok(Checked)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
            while seq.next_element::<Checked>()?.is_some() {}
            Ok(Checked)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
            while map.next_entry::<Checked, Checked>()?.is_some() {}
            Ok(Checked)
        }
    }
    impl<'de> Deserialize<'de> for Checked {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
            d.deserialize_any(CheckedVisitor)
        }
    }
    serde_json::from_str::<Checked>(raw.get())
        .map(|_| ())
        .map_err(|e| RawError::Json(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_each_agent_type() {
        let lines: &[&str] = &[
            r#"{"type":"log","level":"info","message":"hi"}"#,
            r#"{"type":"step","id":"s1","name":"shell","status":"running","args":{"command":"ls"}}"#,
            r#"{"type":"step","id":"s1","name":"shell","status":"succeeded","result":"ok","durationMs":3}"#,
            r#"{"type":"step","id":"s1","name":"shell","status":"failed","error":"x","durationMs":3}"#,
            r#"{"type":"result","message":"done \"quoted\""}"#,
            r#"{"type":"error","code":"model_error","message":"boom"}"#,
            r#"{"type":"delta","text":"tok"}"#,
            r#"{"type":"stdout","stepId":"s1","stream":"stderr","chunk":"x"}"#,
            r#"{"type":"tool_call","callId":"c1","toolName":"pick","args":{}}"#,
            r#"{"type":"tool_result_applied","callId":"c1"}"#,
        ];
        for l in lines {
            AgentEvent::parse(l.as_bytes()).unwrap_or_else(|e| panic!("{l}: {e}"));
        }
    }

    #[test]
    fn refuses_forgery_and_junk() {
        let bad: &[&str] = &[
            r#"{"type":"session_ended","reason":"completed"}"#,
            r#"{"type":"heartbeat"}"#,
            r#"{"type":"result","message":"x","seq":1}"#,
            r#"{"type":"result","message":"x","sessionId":"other"}"#,
            r#"{"type":"log","level":"info","message":"a","message":"b"}"#,
            r#"{"type":"log","type":"result","level":"info","message":"a"}"#,
            r#"{"type":"log","level":"loud","message":"a"}"#,
            r#"{"type":"step","id":"s","name":"n","status":"succeeded"}"#,
            r#"{"type":"step","id":"s","name":"n","status":"failed","durationMs":1}"#,
            r#"{"type":"error","code":"Not Snake","message":"x"}"#,
            r#"{"type":"result"}"#,
            r#"[1,2]"#,
            r#"not json"#,
            "",
        ];
        for l in bad {
            assert!(AgentEvent::parse(l.as_bytes()).is_err(), "accepted {l}");
        }
    }

    #[test]
    fn refuses_raw_line_breaks_between_tokens() {
        // Found by fuzz/agent_line: JSON allows `\r` as whitespace, and the
        // runner's SSE relay then split the event in two.
        for sep in ["\r", "\n", "\r\r", " \r\n"] {
            let l = format!(r#"{{"type":"delta",{sep}"text":"x"}}"#);
            assert_eq!(
                AgentEvent::parse(l.as_bytes()).map(|(k, _)| k),
                Err(RawError::Invalid("a line may not hold a raw line break")),
                "{l:?}"
            );
        }
        // Positive control: other whitespace there is fine, and escaped line
        // breaks inside strings are too.
        for l in [
            "{\"type\":\"delta\",\t \"text\":\"x\"}",
            r#"{"type":"delta","text":"a\r\nb"}"#,
        ] {
            assert_eq!(
                AgentEvent::parse(l.as_bytes()).map(|(k, _)| k),
                Ok(AgentKind::Delta)
            );
        }
    }

    #[test]
    fn refuses_what_a_decoding_reader_would_refuse_inside_args() {
        // Found by fuzz/agent_line: a RawValue skips escapes and numbers, so
        // the runner forwarded lines that `serde_json::Value` then refused.
        for inner in [
            r#"{"k":"\ude00"}"#,
            r#"{"\ud83d x":1}"#,
            r#"[1e999]"#,
            r#"{"a":[{"b":"\udfff"}]}"#,
        ] {
            let l = format!(r#"{{"type":"tool_call","callId":"c","toolName":"t","args":{inner}}}"#);
            assert!(
                matches!(AgentEvent::parse(l.as_bytes()), Err(RawError::Json(_))),
                "accepted {l}"
            );
            let l = format!(
                r#"{{"type":"step","id":"s","name":"n","status":"succeeded","result":{inner},"durationMs":1}}"#
            );
            assert!(AgentEvent::parse(l.as_bytes()).is_err(), "accepted {l}");
        }
        // Positive control: a proper pair, escapes and big but finite numbers pass.
        let l = r#"{"type":"tool_call","callId":"c","toolName":"t","args":{"\ud83d\ude00":"\u00e9\n","n":[1e300,-0.5,18446744073709551615,null,true]}}"#;
        assert_eq!(
            AgentEvent::parse(l.as_bytes()).map(|(k, _)| k),
            Ok(AgentKind::ToolCall)
        );
    }

    #[test]
    fn the_fast_path_agrees_with_serde() {
        let fast: &[&str] = &[
            r#"{"type":"log","level":"debug","message":"tick tock"}"#,
            r#"{"type":"log","level":"error","message":""}"#,
            "{\"type\":\"delta\",\"text\":\"h\u{e9} \u{7f}\"}",
            r#"{"type":"result","message":"done"}"#,
        ];
        for l in fast {
            let (kind, ev) = parse_common(l.as_bytes()).unwrap_or_else(|| panic!("slow: {l}"));
            let (full_kind, full) = AgentEvent::parse_full(l.as_bytes()).unwrap();
            assert_eq!(kind, full_kind, "{l}");
            assert_eq!(common_kind(l.as_bytes()), Some(kind), "{l}");
            assert_eq!(format!("{ev:?}"), format!("{full:?}"), "{l}");
        }
        // Shapes the fast path leaves to serde, whatever serde decides.
        let slow: &[&[u8]] = &[
            br#"{"type":"log","message":"m","level":"info"}"#,
            br#"{"type":"log","level":"loud","message":"m"}"#,
            br#"{"type":"log","level":"infoo","message":"m"}"#,
            br#"{"type":"delta","text":"a\"b"}"#,
            br#"{"type":"delta","text":"a"b"}"#,
            br#"{"type":"delta","text":"a"}x"#,
            br#"{"type":"delta","text":"a"} "#,
            br#"{"type":"delta", "text":"a"}"#,
            b"{\"type\":\"delta\",\"text\":\"a\tb\"}",
            b"{\"type\":\"delta\",\"text\":\"\xff\"}",
            br#"{"type":"result","message":"x","seq":1}"#,
            br#"{"type":"result","message":1}"#,
        ];
        for l in slow {
            assert!(parse_common(l).is_none(), "{}", String::from_utf8_lossy(l));
            assert!(common_kind(l).is_none(), "{}", String::from_utf8_lossy(l));
        }
    }

    #[test]
    fn borrows_plain_strings() {
        let l = br#"{"type":"log","level":"info","message":"plain"}"#;
        let (_, ev) = AgentEvent::parse(l).unwrap();
        assert!(matches!(ev.message, Some(Text(Cow::Borrowed("plain")))));
    }
}

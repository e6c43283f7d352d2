//! The dispatch request, `POST {SANDBOX_URL}/stream` (docs/protocol.md §1).
//!
//! [`DispatchRequest::parse`] checks the body field by field, so a bad request
//! is answered with every bad field named at once, not just the first one
//! serde trips over.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::line::EventKind;

/// Longest accepted `prompt`, in bytes.
pub const MAX_PROMPT_BYTES: usize = 1 << 20;
/// Longest accepted one-time token.
pub const MAX_TOKEN_BYTES: usize = 512;
/// Longest `detach_grace_ms`.
pub const MAX_DETACH_GRACE_MS: u64 = 600_000;
pub const DEFAULT_DETACH_GRACE_MS: u64 = 30_000;

/// The body of `POST /stream`.
///
/// - `agent_url`: http(s) base of this dispatch's callback routes.
/// - `otp_setup`, `otp_run`, `otp_upload`: the one-time tokens.
/// - `prompt`: the user's message for this turn, non-empty.
/// - `protocol`: 1 (default) or 2.
/// - `session_id`: `^[A-Za-z0-9_-]{1,64}$`, chosen by the runner when absent.
/// - `filter`, `client_tools`, `detach_grace_ms`, `encryption`: protocol 2 only.
/// - `workdir`: keep the working directory (CONTRACT §11): capture it when
///   the turn ends, and restore `workdir.restore` before the agent starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DispatchRequest {
    pub agent_url: String,
    pub otp_setup: String,
    pub otp_run: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otp_upload: Option<String>,
    pub prompt: String,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ClientTool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach_grace_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<crate::workdir::WorkdirDispatch>,
}

/// `encryption` of a dispatch (`docs/protocol.md` §4).
///
/// - `client_public_key`: base64url (no padding) of the client's ephemeral
///   P-256 public key as a 65-byte uncompressed SEC1 point. This crate checks
///   the shape; the runner checks that it is a point on the curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EncryptionRequest {
    pub client_public_key: String,
}

/// Length of K: 65 bytes in base64url without padding.
pub const CLIENT_PUBLIC_KEY_CHARS: usize = 87;

/// Whether `k` has the shape of K: 87 base64url characters encoding a
/// 65-byte string that starts with `0x04` (an uncompressed point; its first
/// character is then `B`).
pub fn is_client_public_key_shape(k: &str) -> bool {
    k.len() == CLIENT_PUBLIC_KEY_CHARS
        && k.starts_with('B')
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(try_from = "u8", into = "u8")]
pub enum Protocol {
    #[default]
    V1,
    V2,
}

impl TryFrom<u8> for Protocol {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, String> {
        match v {
            1 => Ok(Protocol::V1),
            2 => Ok(Protocol::V2),
            other => Err(format!("protocol must be 1 or 2, got {other}")),
        }
    }
}

impl From<Protocol> for u8 {
    fn from(p: Protocol) -> u8 {
        match p {
            Protocol::V1 => 1,
            Protocol::V2 => 2,
        }
    }
}

/// A protocol 2 line filter. `result`, `error` and `session_ended` always pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Filter {
    #[schemars(title = "AllowFilter")]
    Allow { types: Vec<EventKind> },
    #[schemars(title = "BlockFilter")]
    Block { blocked_types: Vec<EventKind> },
}

impl Filter {
    /// Whether a line of `kind` passes this filter.
    pub fn passes(&self, kind: EventKind) -> bool {
        if kind.always_passes_filter() {
            return true;
        }
        match self {
            Filter::Allow { types } => types.contains(&kind),
            Filter::Block { blocked_types } => !blocked_types.contains(&kind),
        }
    }
}

/// A tool the client executes (protocol 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub parameters: Value,
}

pub use crate::problem::FieldError;

/// Whether `id` matches `^[A-Za-z0-9_-]{1,64}$`.
pub fn is_valid_session_id(id: &str) -> bool {
    crate::rules::names::valid_tool_name(id)
}

const KNOWN_FIELDS: &[&str] = &[
    "agent_url",
    "otp_setup",
    "otp_run",
    "otp_upload",
    "prompt",
    "protocol",
    "session_id",
    "filter",
    "client_tools",
    "detach_grace_ms",
    "encryption",
    "workdir",
];

impl DispatchRequest {
    /// Parses and validates a request body, naming every bad field.
    pub fn parse(body: &[u8]) -> Result<Self, Vec<FieldError>> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| vec![FieldError::new("", format!("body is not valid JSON: {e}"))])?;
        let Value::Object(map) = value else {
            return Err(vec![FieldError::new("", "body must be a JSON object")]);
        };
        let mut errors = Vec::new();
        for key in map.keys() {
            if !KNOWN_FIELDS.contains(&key.as_str()) {
                errors.push(FieldError::new(key, "unknown field"));
            }
        }
        check_url(&map, &mut errors);
        for (name, required) in [
            ("otp_setup", true),
            ("otp_run", true),
            ("otp_upload", false),
        ] {
            check_token(&map, name, required, &mut errors);
        }
        match map.get("prompt") {
            None => errors.push(FieldError::new("prompt", "required")),
            Some(Value::String(s)) if s.trim().is_empty() => {
                errors.push(FieldError::new("prompt", "must not be empty"))
            }
            Some(Value::String(s)) if s.len() > MAX_PROMPT_BYTES => errors.push(FieldError::new(
                "prompt",
                format!("longer than {MAX_PROMPT_BYTES} bytes"),
            )),
            Some(Value::String(_)) => {}
            Some(_) => errors.push(FieldError::new("prompt", "must be a string")),
        }
        let protocol = match map.get("protocol") {
            None | Some(Value::Null) => Protocol::V1,
            Some(v) => match v.as_u64().and_then(|n| u8::try_from(n).ok()) {
                Some(n) => match Protocol::try_from(n) {
                    Ok(p) => p,
                    Err(m) => {
                        errors.push(FieldError::new("protocol", m));
                        Protocol::V1
                    }
                },
                None => {
                    errors.push(FieldError::new("protocol", "must be 1 or 2"));
                    Protocol::V1
                }
            },
        };
        match map.get("session_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if is_valid_session_id(s) => {}
            Some(_) => errors.push(FieldError::new(
                "session_id",
                "must match ^[A-Za-z0-9_-]{1,64}$",
            )),
        }
        let v2_only = ["filter", "client_tools", "detach_grace_ms", "encryption"];
        for name in v2_only {
            if map.get(name).is_some_and(|v| !v.is_null()) && protocol == Protocol::V1 {
                errors.push(FieldError::new(name, "allowed with protocol 2 only"));
            }
        }
        if let Some(v) = map.get("filter").filter(|v| !v.is_null()) {
            check_filter(v, &mut errors);
        }
        if let Some(v) = map.get("client_tools").filter(|v| !v.is_null()) {
            check_client_tools(v, &mut errors);
        }
        if let Some(v) = map.get("encryption").filter(|v| !v.is_null()) {
            check_encryption(v, &mut errors);
        }
        if let Some(v) = map.get("workdir").filter(|v| !v.is_null()) {
            check_workdir(v, &mut errors);
        }
        match map.get("detach_grace_ms") {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_u64() {
                Some(n) if n <= MAX_DETACH_GRACE_MS => {}
                _ => errors.push(FieldError::new(
                    "detach_grace_ms",
                    format!("must be an integer from 0 to {MAX_DETACH_GRACE_MS}"),
                )),
            },
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        serde_json::from_value(Value::Object(map))
            .map_err(|e| vec![FieldError::new("", format!("invalid request: {e}"))])
    }

    pub fn detach_grace_ms(&self) -> u64 {
        self.detach_grace_ms.unwrap_or(DEFAULT_DETACH_GRACE_MS)
    }
}

fn check_url(map: &Map<String, Value>, errors: &mut Vec<FieldError>) {
    match map.get("agent_url") {
        None => errors.push(FieldError::new("agent_url", "required")),
        Some(Value::String(s)) => {
            let ok = (s.starts_with("http://") || s.starts_with("https://"))
                && s.len() <= 2048
                && s.split("://").nth(1).is_some_and(|rest| {
                    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
                    !host.is_empty() && !host.contains(char::is_whitespace)
                });
            if !ok {
                errors.push(FieldError::new("agent_url", "must be an http(s) URL"));
            }
        }
        Some(_) => errors.push(FieldError::new("agent_url", "must be a string")),
    }
}

fn check_token(map: &Map<String, Value>, name: &str, required: bool, errors: &mut Vec<FieldError>) {
    match map.get(name) {
        None | Some(Value::Null) if required => errors.push(FieldError::new(name, "required")),
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {
            errors.push(FieldError::new(name, "must not be empty"))
        }
        Some(Value::String(s))
            if s.len() > MAX_TOKEN_BYTES || !s.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            errors.push(FieldError::new(
                name,
                format!("must be at most {MAX_TOKEN_BYTES} printable ASCII characters"),
            ))
        }
        Some(Value::String(_)) => {}
        Some(_) => errors.push(FieldError::new(name, "must be a string")),
    }
}

fn check_filter(v: &Value, errors: &mut Vec<FieldError>) {
    let Some(obj) = v.as_object() else {
        errors.push(FieldError::new("filter", "must be an object"));
        return;
    };
    let (key, list) = match (obj.get("types"), obj.get("blocked_types"), obj.len()) {
        (Some(l), None, 1) => ("types", l),
        (None, Some(l), 1) => ("blocked_types", l),
        _ => {
            errors.push(FieldError::new(
                "filter",
                "must be {\"types\": [..]} or {\"blocked_types\": [..]}",
            ));
            return;
        }
    };
    let field = format!("filter.{key}");
    let Some(items) = list.as_array() else {
        errors.push(FieldError::new(&field, "must be an array of line types"));
        return;
    };
    for item in items {
        match item.as_str() {
            Some(t) if EventKind::parse(t).is_some() => {}
            _ => errors.push(FieldError::new(&field, format!("unknown line type {item}"))),
        }
    }
}

fn check_workdir(v: &Value, errors: &mut Vec<FieldError>) {
    let Some(obj) = v.as_object() else {
        errors.push(FieldError::new("workdir", "must be an object"));
        return;
    };
    check_token(obj, "token", true, errors);
    match serde_json::from_value::<crate::workdir::WorkdirDispatch>(v.clone()) {
        Ok(w) => {
            if let Some(m) = &w.restore
                && let Err(e) = m.check(w.max_entries)
            {
                errors.push(FieldError::new("workdir.restore", e));
            }
        }
        Err(e) => errors.push(FieldError::new("workdir", e.to_string())),
    }
}

fn check_encryption(v: &Value, errors: &mut Vec<FieldError>) {
    let Some(obj) = v.as_object() else {
        errors.push(FieldError::new(
            "encryption",
            "must be {\"client_public_key\": K}",
        ));
        return;
    };
    for key in obj.keys().filter(|k| *k != "client_public_key") {
        errors.push(FieldError::new(
            &format!("encryption.{key}"),
            "unknown field",
        ));
    }
    match obj.get("client_public_key") {
        Some(Value::String(k)) if is_client_public_key_shape(k) => {}
        Some(_) => errors.push(FieldError::new(
            "encryption.client_public_key",
            "must be base64url (no padding) of a 65-byte uncompressed P-256 point",
        )),
        None => errors.push(FieldError::new("encryption.client_public_key", "required")),
    }
}

fn check_client_tools(v: &Value, errors: &mut Vec<FieldError>) {
    let Some(items) = v.as_array() else {
        errors.push(FieldError::new("client_tools", "must be an array"));
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("client_tools[{i}]");
        if let Err(e) = serde_json::from_value::<ClientTool>(item.clone()) {
            errors.push(FieldError::new(&field, e.to_string()));
            continue;
        }
        let name_ok = item["name"]
            .as_str()
            .is_some_and(crate::rules::names::valid_tool_name);
        if !name_ok {
            errors.push(FieldError::new(
                &field,
                "name must match ^[A-Za-z0-9_-]{1,64}$",
            ));
        }
        if !item["parameters"].is_object() {
            errors.push(FieldError::new(
                &field,
                "parameters must be a JSON Schema object",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_body() -> serde_json::Value {
        serde_json::json!({
            "agent_url": "http://127.0.0.1:8080/api/assistant/sandbox/s1",
            "otp_setup": "a", "otp_run": "b", "prompt": "hi"
        })
    }

    #[test]
    fn minimal_request_parses_with_defaults() {
        let r = DispatchRequest::parse(ok_body().to_string().as_bytes()).unwrap();
        assert_eq!(r.protocol, Protocol::V1);
        assert_eq!(r.otp_upload, None);
        assert_eq!(r.detach_grace_ms(), DEFAULT_DETACH_GRACE_MS);
    }

    #[test]
    fn every_bad_field_is_named() {
        let body = serde_json::json!({
            "agent_url": "ftp://x", "otp_setup": "", "prompt": "  ",
            "protocol": 3, "session_id": "bad id!", "bogus": 1
        });
        let errs = DispatchRequest::parse(body.to_string().as_bytes()).unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        for f in [
            "agent_url",
            "otp_setup",
            "otp_run",
            "prompt",
            "protocol",
            "session_id",
            "bogus",
        ] {
            assert!(fields.contains(&f), "{f} missing from {fields:?}");
        }
    }

    #[test]
    fn protocol_two_fields_need_protocol_two() {
        let mut body = ok_body();
        body["filter"] = serde_json::json!({"types": ["step"]});
        let errs = DispatchRequest::parse(body.to_string().as_bytes()).unwrap_err();
        assert_eq!(errs[0].field, "filter");
        body["protocol"] = 2.into();
        let r = DispatchRequest::parse(body.to_string().as_bytes()).unwrap();
        assert!(r.filter.unwrap().passes(EventKind::Result));
    }

    #[test]
    fn filter_always_passes_terminal_lines() {
        let f = Filter::Block {
            blocked_types: vec![EventKind::Result, EventKind::Log],
        };
        assert!(f.passes(EventKind::Result));
        assert!(!f.passes(EventKind::Log));
        assert!(f.passes(EventKind::Step));
    }

    #[test]
    fn encryption_takes_exactly_a_well_shaped_client_key() {
        let k = format!("B{}", "A".repeat(86));
        let mut body = ok_body();
        body["protocol"] = 2.into();
        body["encryption"] = serde_json::json!({ "client_public_key": k });
        let r = DispatchRequest::parse(body.to_string().as_bytes()).unwrap();
        assert_eq!(r.encryption.unwrap().client_public_key, k);
        for (bad, field) in [
            (
                serde_json::json!({ "client_public_key": "short" }),
                "encryption.client_public_key",
            ),
            (
                serde_json::json!({ "client_public_key": k, "alg": "x" }),
                "encryption.alg",
            ),
            (serde_json::json!({}), "encryption.client_public_key"),
            (serde_json::json!("K"), "encryption"),
        ] {
            body["encryption"] = bad;
            let errs = DispatchRequest::parse(body.to_string().as_bytes()).unwrap_err();
            assert!(errs.iter().any(|e| e.field == field), "{field}: {errs:?}");
        }
        body["protocol"] = 1.into();
        body["encryption"] = serde_json::json!({ "client_public_key": k });
        let errs = DispatchRequest::parse(body.to_string().as_bytes()).unwrap_err();
        assert_eq!(errs[0].field, "encryption");
    }

    #[test]
    fn not_json_is_a_field_error() {
        let errs = DispatchRequest::parse(b"{").unwrap_err();
        assert!(errs[0].message.contains("not valid JSON"));
    }

    #[test]
    fn numbers_in_client_tool_schemas_survive_a_round_trip() {
        // Found by fuzz/dispatch_request: without serde_json's
        // `float_roundtrip`, `1.03e50` parsed one ULP off, so a request
        // re-serialized by the runner changed on the way to the agent.
        let body = r#"{"agent_url":"http://h","otp_setup":"a","otp_run":"b","prompt":"x","protocol":2,
            "client_tools":[{"name":"t","parameters":{"n":1.03e50,"m":0.1,"k":2.2250738585072014e-308}}]}"#;
        let r = DispatchRequest::parse(body.as_bytes()).unwrap();
        let n = r.client_tools[0].parameters["n"].as_f64().unwrap();
        assert_eq!(n, 1.03e50, "the closest double to 1.03e50");
        let again = DispatchRequest::parse(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }
}

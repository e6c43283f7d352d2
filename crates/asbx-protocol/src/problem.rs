//! RFC 9457 problem details, the body of every HTTP error asbx sends.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The `code` of a `413`, from the runner and the workspace alike: a request
/// body over the limit (CONTRACT.md §1, "413 body too large").
pub const BODY_TOO_LARGE: &str = "body_too_large";

/// An `application/problem+json` body.
///
/// - `type`: a URI naming the problem kind (`urn:asbx:problem:<code>`).
/// - `title`: a short human summary of the kind.
/// - `status`: the HTTP status.
/// - `detail`: what went wrong this time.
/// - `code`: the stable machine code (snake_case).
/// - `errors`: for `invalid_request`, every bad field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// Extra members, for example `activeTurnId` on a 409, or `oldestSeq` on a 410.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Problem {
    pub const CONTENT_TYPE: &'static str = "application/problem+json";

    pub fn new(status: u16, code: &str, title: &str, detail: impl Into<String>) -> Self {
        Problem {
            kind: format!("urn:asbx:problem:{code}"),
            title: title.to_owned(),
            status,
            detail: detail.into(),
            code: code.to_owned(),
            errors: Vec::new(),
            extra: serde_json::Map::new(),
        }
    }

    pub fn with_errors(mut self, errors: Vec<FieldError>) -> Self {
        self.errors = errors;
        self
    }

    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }
}

/// One bad field of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        FieldError {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

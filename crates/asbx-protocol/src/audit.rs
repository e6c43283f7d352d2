//! The audit log's events (docs/api-audit.md, CONTRACT §10): what one
//! record says besides its chain fields (`id`, `ts`, `workspace`, `runId`,
//! `sessionId`, `prevHash`, `hash`), and the batch a runner reports.
//!
//! Never in an event: a secret's value, a token, a file's content.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The dispatch header (`POST /stream`) carrying the session's audit
/// token: a header, not a body field, so an older runner ignores it.
pub const AUDIT_TOKEN_HEADER: &str = "x-asbx-audit-token";
/// The runner report's header naming its version ([`AUDIT_VERSION`]).
pub const AUDIT_VERSION_HEADER: &str = "x-asbx-audit-version";

/// The runner's audit report header carrying its version of
/// [`RunnerAuditBatch`]; a runner without it sends none.
pub const AUDIT_VERSION: u32 = 1;

/// Most events one [`RunnerAuditBatch`] may carry.
pub const MAX_BATCH_EVENTS: usize = 5_000;

/// One audit event, tagged by `kind`.
///
/// - `egress`: one request through the runner's egress proxy: `host`,
///   `port`, `method` (when the proxy saw it), `bytesOut`/`bytesIn`
///   (sandbox to host and back), `allowed`, `code` (the refusal's),
///   `secret` (the NAME of a bound secret injected, never its value).
/// - `model_call`: one call through the runner's model gateway:
///   `provider`, `model`, `inputTokens`/`outputTokens` (when the
///   provider's answer says), `status` (HTTP, or 0 when none came).
/// - `tool_call`: one step of the agent loop: `name`, `status`
///   (`succeeded`/`failed`), `durationMs`, `exitCode` (a command's).
/// - `callback`: a one-time token redeemed: `route` (`env`, `config`,
///   `results`, `assets`).
/// - `file_write`/`file_read`: a file through the workspace API: `path`,
///   `size`, `via` (`sandbox`, `upload`, `download`).
/// - `api_key_created`/`api_key_revoked`: `name`, `keyId` (the first 12
///   hex digits of the key's hash).
/// - `quota_refused`: `quota` (its name).
/// - `dropped`: `count` events a runner could not keep for this session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AuditEvent {
    #[serde(rename_all = "camelCase")]
    Egress {
        host: String,
        port: u16,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        method: Option<String>,
        bytes_out: u64,
        bytes_in: u64,
        allowed: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<String>,
    },
    #[serde(rename_all = "camelCase")]
    ModelCall {
        provider: String,
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_tokens: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_tokens: Option<u64>,
        status: u16,
    },
    #[serde(rename_all = "camelCase")]
    ToolCall {
        name: String,
        status: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i64>,
    },
    Callback {
        route: String,
    },
    FileWrite {
        path: String,
        size: u64,
        via: String,
    },
    FileRead {
        path: String,
        size: u64,
        via: String,
    },
    #[serde(rename_all = "camelCase")]
    ApiKeyCreated {
        name: String,
        key_id: String,
    },
    #[serde(rename_all = "camelCase")]
    ApiKeyRevoked {
        name: String,
        key_id: String,
    },
    QuotaRefused {
        quota: String,
    },
    Dropped {
        count: u64,
    },
}

impl AuditEvent {
    /// Whether a runner may report it: only what happens past the sandbox
    /// (egress, model calls) and its own drop count.
    pub fn is_runner_kind(&self) -> bool {
        match self {
            AuditEvent::Egress { .. }
            | AuditEvent::ModelCall { .. }
            | AuditEvent::Dropped { .. } => true,
            AuditEvent::ToolCall { .. }
            | AuditEvent::Callback { .. }
            | AuditEvent::FileWrite { .. }
            | AuditEvent::FileRead { .. }
            | AuditEvent::ApiKeyCreated { .. }
            | AuditEvent::ApiKeyRevoked { .. }
            | AuditEvent::QuotaRefused { .. } => false,
        }
    }
}

/// `POST /api/audit/runner` (the runner's report, authenticated by the
/// dispatch's audit token): `events` in the order they happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunnerAuditBatch {
    pub events: Vec<AuditEvent>,
}

//! Payloads of the workspace callback routes the sandbox redeems its tokens at
//! (docs/protocol.md §3). Field names are snake_case on this wire.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The setup token's longest life (docs/protocol.md §3), in seconds; every
/// other token lives as long as its dispatch may.
pub const SETUP_TOKEN_TTL_SECS: u64 = 600;

/// The header the runner's gateway sends on every callback: one random id
/// per logical callback, the same on its retry (docs/protocol.md §3). The
/// workspace answers a retry of a redeemed token once more when it carries
/// the id the redemption carried, within [`CALLBACK_REPLAY_WINDOW_MS`].
pub const REQUEST_ID_HEADER: &str = "x-asbx-request-id";

/// How long after a redemption its retry (same token, same request id) is
/// answered once more, in milliseconds.
pub const CALLBACK_REPLAY_WINDOW_MS: u64 = 120_000;

/// Whether `id` is a well-formed callback request id: 16 to 64 characters
/// of `[A-Za-z0-9_-]` (the gateway sends 32 lowercase hex characters).
pub fn is_valid_request_id(id: &str) -> bool {
    (16..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Turns of history sent to the sandbox (docs/protocol.md §3).
pub const REPLAY_TURN_LIMIT: usize = 20;

/// `GET {agent_url}/env`.
///
/// - `variables`: set in the sandbox before the setup script.
/// - `setup_script`: bash, run in the working directory before the first model call.
/// - `allowed_hosts`: what tools may reach through the egress proxy (default none).
/// - `injected_secrets`: runner-only (docs/protocol.md §3, "Secrets set at
///   the egress proxy"): secrets the egress proxy sets as headers on
///   requests to their hosts. The workspace sends them only to a gateway
///   that says it strips them ([`crate::gateway::STRIPS_INJECTED_SECRETS`]);
///   the gateway removes the field before the agent sees the answer, so the
///   sandbox never holds a value (its variable holds the placeholder).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct EnvResponse {
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    #[serde(default)]
    pub setup_script: Option<String>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// The in-sandbox workspace API of this session (docs/protocol.md §3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceAccess>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injected_secrets: Vec<InjectedSecret>,
}

/// `EnvResponse.injected_secrets`: one secret the egress proxy sets as
/// `header` = `format` (its `{value}` replaced) on requests to `hosts`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InjectedSecret {
    pub name: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub header: String,
    pub format: String,
}

impl std::fmt::Debug for InjectedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value.
        f.debug_struct("InjectedSecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// `EnvResponse.workspace`: the in-sandbox workspace API of this session.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceAccess {
    /// `asbx_ws_...` bearer, valid only for this session, until it settles
    /// or its runtime cap passes. Only its SHA-256 is stored.
    pub token: String,
    /// Files the agent fetches (through the gateway) into its working
    /// directory before the setup script runs.
    #[serde(default)]
    pub attachments: Vec<AttachmentRef>,
}

/// A file of the workspace the agent places in its working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachmentRef {
    /// File id in the workspace (`GET workspace/files/{id}`).
    pub id: String,
    /// Relative path in the working directory, e.g. `attachments/report.pdf`.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
    pub mime_type: String,
}

/// `GET {agent_url}/config`.
///
/// - `model`: `provider:model`.
/// - `conversation`: at most the last 20 turns.
/// - `limits`: each clamped to the runner's own maximum.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ConfigResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    pub model: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Skill>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServer>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<ChatTurn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
}

/// A skill bundle: instructions and scripts placed in the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Skill {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Relative path to text content, for example `SKILL.md`, `scripts/run.sh`.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
}

/// An MCP server: a stdio command started in the sandbox, or a streamable-HTTP URL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum McpServer {
    #[schemars(title = "McpStdioServer")]
    Stdio {
        name: String,
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    #[schemars(title = "McpHttpServer")]
    Http { name: String, url: String },
}

impl McpServer {
    pub fn name(&self) -> &str {
        match self {
            McpServer::Stdio { name, .. } | McpServer::Http { name, .. } => name,
        }
    }
}

/// One turn of replayed history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChatTurn {
    pub role: Role,
    pub content: String,
    pub ts: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
}

/// Per-run limits; each is optional and clamped to the runner's maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct RunLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
}

/// `POST {agent_url}/results`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResultsRequest {
    pub files: Vec<ResultFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ResultFile {
    /// Relative to the sandbox's `out/` folder.
    pub path: String,
    pub content_base64: String,
    #[serde(default)]
    pub mime_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
pub struct ResultsResponse {
    pub files: Vec<StoredFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoredFile {
    pub path: String,
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_16_to_64_url_safe_characters() {
        assert!(is_valid_request_id("0123456789abcdef0123456789abcdef"));
        assert!(is_valid_request_id(&"A_-9".repeat(4)));
        assert!(is_valid_request_id(&"a".repeat(64)));
        assert!(!is_valid_request_id(&"a".repeat(15)));
        assert!(!is_valid_request_id(&"a".repeat(65)));
        assert!(!is_valid_request_id("0123456789abcdef 0123"));
        assert!(!is_valid_request_id("0123456789abcdef/0123"));
    }
}

//! JSON bodies of the workspace's own API (camelCase on this wire).
//!
//! The sandbox callback payloads are not here: they are
//! `asbx_protocol::callback` types, shared with the agent.

use std::collections::BTreeMap;

use asbx_protocol::callback::{McpServer, RunLimits, Skill};
use serde::{Deserialize, Serialize};

/// `POST /api/runs`.
///
/// - `prompt`: the user's message, non-empty.
/// - `model`: `provider:model`; default: the server's default model.
/// - `systemPrompt`: sent to the sandbox in `/config`.
/// - `setupScript`, `variables`, `allowedHosts`: sent in `/env`.
/// - `sandboxUrl`: the runner to use; default: the server's `SANDBOX_URL`.
/// - `limits`: `{max_steps, max_tool_calls, tool_timeout_ms, tool_output_bytes,
///   max_duration_ms}` (snake_case, as on the callback wire), each optional.
/// - `skills`, `mcpServers`: sent in `/config`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRunRequest {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_script: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Skill>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServer>,
}

/// `GET /api/runs/{id}`.
///
/// - `id`: the run id, which is also the sandbox session id.
/// - `kind`: `run` (`POST /api/runs`), `chat` (a chat turn) or `agent` (a
///   stored agent's run, `POST /api/agents/{id}/runs`).
/// - `chatId`, `agentId`: the chat or the agent the run belongs to.
/// - `status`: `running`, `succeeded` or `failed`.
/// - `result`: the `result` line's message, on success.
/// - `error`: the `error` line's code and message (or the workspace's, for
///   example `cancelled` when the client went away), on failure.
/// - `files`: what the run wrote back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub id: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub status: String,
    pub prompt: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    pub files: Vec<FileInfo>,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub code: String,
    pub message: String,
}

/// A stored file.
///
/// - `url`: where to download it (`/api/files/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    pub id: String,
    pub path: String,
    pub mime_type: String,
    pub size: i64,
    pub created_at: i64,
    pub url: String,
}

/// The HTTP header carrying the run id on a `POST /api/runs` stream.
pub const RUN_ID_HEADER: &str = "x-asbx-run-id";
/// The HTTP header naming the chat of a turn stream.
pub const CHAT_ID_HEADER: &str = "x-asbx-chat-id";
/// The HTTP header naming the turn of a turn stream.
pub const TURN_ID_HEADER: &str = "x-asbx-turn-id";

/// `POST /api/agents` and `PUT /api/agents/{id}`: a stored agent, the
/// definition a workflow's Agents block runs. `PUT` replaces it whole.
///
/// - `name`: shown in lists; 1 to 200 characters.
/// - `description`: free text.
/// - `systemPrompt`: sent to the sandbox in `/config`.
/// - `model`: `provider:model`; absent: the server's default model at run time.
/// - `skills`: bundles (CONTRACT section 3), sent in `/config`; unique names
///   matching `^[A-Za-z0-9_.-]{1,64}$`, file paths relative.
/// - `mcpServers`: stdio commands or streamable-HTTP URLs, sent in `/config`;
///   unique names matching `^[A-Za-z0-9_-]{1,64}$`.
/// - `environment`: the named environment sent in `/env`.
/// - `limits`: as on `POST /api/runs`, sent in `/config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    pub skills: Vec<Skill>,
    #[serde(default)]
    pub mcp_servers: Vec<McpServer>,
    #[serde(default)]
    pub environment: AgentEnvironment,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
}

/// An agent's named environment: what the sandbox gets from `/env`.
///
/// - `name`: the environment's name (for example `staging`); optional.
/// - `variables`: set in the sandbox; names match `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
///   A `SANDBOX_URL` variable also picks the runner of the agent's runs
///   (CONTRACT section 6), after the run request's own `sandboxUrl`.
/// - `setupScript`: bash, run before the first model call.
/// - `allowedHosts`: what the sandbox's tools may reach (default none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentEnvironment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_script: Option<String>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// A stored agent as the API answers it: the definition plus its id and times.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRecord {
    pub id: String,
    #[serde(flatten)]
    pub definition: AgentDefinition,
    pub created_at: i64,
    pub updated_at: i64,
}

/// `GET /api/agents`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentList {
    pub agents: Vec<AgentRecord>,
}

/// `POST /api/agents/{id}/runs`: one run of a stored agent.
///
/// - `prompt`: the block's input, non-empty.
/// - `sandboxUrl`: the runner to use; default: the agent environment's
///   `SANDBOX_URL` variable, then the server's `SANDBOX_URL`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRunRequest {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_url: Option<String>,
}

/// The HTTP header naming the agent of an agent run stream.
pub const AGENT_ID_HEADER: &str = "x-asbx-agent-id";

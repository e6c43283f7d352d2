//! The runner-to-agent handshake and the gateway the agent talks through.
//!
//! The sandbox has no network of its own. The runner serves one HTTP gateway
//! per sandbox on a Unix socket mounted inside it:
//!
//! - `GET /callback/env`, `GET /callback/config`, `POST /callback/results`:
//!   forwarded to this dispatch's `agent_url` (and nowhere else), with the
//!   agent's `Authorization` header passed through.
//! - `POST /model/{provider}/{path...}`: forwarded to that provider's base URL
//!   with the provider's key added by the runner. Keys never enter the sandbox.
//! - `GET /mcp/{name}` (and POST, DELETE): a streamable-HTTP MCP server by name.
//! - `GET /client-tool/{callId}` (protocol 2): held until the client answers
//!   with `{"result": ..}` or `{"error": ".."}`.
//! - `POST /usage`: the agent's token counts for the session's stats.
//!
//! The agent reads one [`AgentBootstrap`] JSON object from stdin, then writes
//! NDJSON [`crate::Event`]s (unstamped) to stdout.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dispatch::{ClientTool, Protocol};

pub const CALLBACK_ENV: &str = "/callback/env";
pub const CALLBACK_CONFIG: &str = "/callback/config";
pub const CALLBACK_RESULTS: &str = "/callback/results";
pub const MODEL_PREFIX: &str = "/model/";
/// Protocol 2: `GET /client-tool/{callId}` waits for the client's answer.
pub const CLIENT_TOOL_PREFIX: &str = "/client-tool/";
/// `POST /usage` [`Usage`]: the agent's token counts, for `session_ended` stats.
pub const USAGE: &str = "/usage";
/// `GET|POST|DELETE /mcp/{name}`: a streamable-HTTP MCP server by name.
pub const MCP_PREFIX: &str = "/mcp/";
/// `GET|POST|PUT|DELETE /workspace/{rest}`: forwarded to
/// `{agent_url}/workspace/{rest}`, the in-sandbox workspace API.
pub const WORKSPACE_PREFIX: &str = "/workspace/";

/// What the agent reports of its model use before its last line.
///
/// - `modelCalls`: model calls made (the `steps` of `session_ended.stats`);
///   absent counts as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub model_calls: u32,
}

/// What the runner writes on the agent's stdin, once, then closes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentBootstrap {
    pub session_id: String,
    pub protocol: Protocol,
    pub prompt: String,
    pub otp_setup: String,
    pub otp_run: String,
    #[serde(default)]
    pub otp_upload: Option<String>,
    /// Path of the gateway's Unix socket, as the agent sees it.
    pub gateway_socket: String,
    /// Path of the egress proxy's Unix socket: the agent relays its tools'
    /// `HTTP_PROXY`/`HTTPS_PROXY` connections from the sandbox's loopback to it.
    #[serde(default)]
    pub proxy_socket: Option<String>,
    /// The working directory tools run in; `out/` under it is written back.
    pub workdir: String,
    /// Providers the gateway knows: name and wire format. No keys.
    #[serde(default)]
    pub providers: Vec<ProviderInfo>,
    /// The runner's maximums; `/config` limits are clamped to these.
    pub max_limits: MaxLimits,
    #[serde(default)]
    pub client_tools: Vec<ClientTool>,
    /// Uid and gid tools run as, when the jail provides a separate one.
    #[serde(default)]
    pub tool_user: Option<(u32, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderInfo {
    pub name: String,
    pub kind: ProviderKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// OpenAI-compatible chat completions (`/chat/completions`).
    Openai,
    /// Anthropic Messages (`/messages`).
    Anthropic,
}

impl ProviderKind {
    /// The one path under `/model/{provider}/` the gateway forwards for
    /// this wire format; any other is refused.
    pub const fn path(self) -> &'static str {
        match self {
            ProviderKind::Openai => "chat/completions",
            ProviderKind::Anthropic => "messages",
        }
    }
}

/// The runner's ceilings for per-run limits, and the defaults when `/config` is silent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MaxLimits {
    pub max_steps: u32,
    pub max_tool_calls: u32,
    pub tool_timeout_ms: u64,
    pub tool_output_bytes: u64,
    pub max_duration_ms: u64,
}

impl Default for MaxLimits {
    fn default() -> Self {
        MaxLimits {
            max_steps: 50,
            max_tool_calls: 200,
            tool_timeout_ms: 120_000,
            tool_output_bytes: 64 * 1024,
            max_duration_ms: 28_800_000,
        }
    }
}

/// The header the gateway adds when it relays `/env`: it removes
/// `injected_secrets` from the answer before the agent sees it. The
/// workspace sends a run's bound secrets only when it is present (a gateway
/// that predates them would pass the values into the sandbox), and a
/// sandbox can't set it: the gateway forwards only its own headers.
pub const STRIPS_INJECTED_SECRETS: &str = "x-asbx-strips-injected-secrets";

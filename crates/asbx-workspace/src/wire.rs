//! JSON bodies of the workspace's own API (camelCase on this wire).
//!
//! The sandbox callback payloads are not here: they are
//! `asbx_protocol::callback` types, shared with the agent.

use std::collections::BTreeMap;

use asbx_protocol::StepStatus;
use asbx_protocol::callback::{ChatTurn, Role};
use asbx_protocol::callback::{McpServer, RunLimits, Skill};
use asbx_protocol::session::Termination;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `as_str` (the stored and wire name) and `parse` (its inverse) for a
/// unit enum stored as text.
macro_rules! stored_names {
    ($ty:ident { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $ty {
            /// The stored (and wire) name.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($ty::$v => $s,)+
                }
            }

            /// The value of a stored name.
            pub(crate) fn parse(s: &str) -> Option<Self> {
                match s {
                    $($s => Some($ty::$v),)+
                    _ => None,
                }
            }
        }
    };
}

/// `POST /api/runs`.
///
/// - `prompt`: the user's message, non-empty.
/// - `model`: `provider:model`; default: the server's default model. With
///   `ASBX_MODELS` set, one of those (`400 model_not_allowed`).
/// - `systemPrompt`: sent to the sandbox in `/config`.
/// - `setupScript`, `variables`, `allowedHosts`: sent in `/env`.
/// - `limits`: `{max_steps, max_tool_calls, tool_timeout_ms, tool_output_bytes,
///   max_duration_ms}` (snake_case, as on the callback wire), each optional.
/// - `skills`, `mcpServers`: sent in `/config`.
/// - `protocol`, `filter`, `clientTools`, `encryption`: the protocol 2
///   choices, checked by `runs::request::options` (docs/api-runs.md).
/// - `environment`: a named environment (`/api/environments`), by id or
///   name: its variables, secrets, setup script and allowed hosts go into
///   `/env`; this request's own `variables` and `setupScript` win on a
///   clash, allowed hosts are the union.
///
/// - `sandboxUrl`: the runner to use (CONTRACT §6), one the operator
///   configured (`SANDBOX_URL`, `ASBX_ALLOWED_SANDBOX_URLS`; compared as
///   normalised URLs); any other is `400 sandbox_url_not_allowed` and gets
///   no request. Absent: the server's `SANDBOX_URL` (its fleet). A caller
///   never picks an address of its own: the workspace sends its runner
///   token and three one-time tokens to that URL.
/// - `workdir`: `{"from": chatId, "afterMessageId"?}`: the sandbox's
///   working directory starts as that chat of the caller's workspace kept
///   it (CONTRACT §11), its latest or after that assistant message's turn;
///   the run keeps nothing back. Another workspace's chat is `404`, a chat
///   that kept none `409 workdir_not_kept`, one no longer kept `410
///   workdir_gone`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CreateRunRequest {
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
    #[schema(value_type = Option<crate::apidoc::RunLimits>)]
    pub limits: Option<RunLimits>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<crate::apidoc::Skill>)]
    pub skills: Vec<Skill>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<crate::apidoc::McpServer>)]
    pub mcp_servers: Vec<McpServer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_tools: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<RunWorkdir>,
}

/// `workdir` of `POST /api/runs`: the chat whose kept working directory
/// the run starts from, and optionally the assistant message whose turn
/// left it (default: the chat's latest).
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RunWorkdir {
    pub from: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_message_id: Option<String>,
}

/// `POST /api/runs/{id}/tool-result`: `{"callId", "result"}`,
/// `{"callId", "error"}` or `{"callId", "encrypted": {"iv", "ciphertext"}}`,
/// forwarded to the runner as it is.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ToolResultRequest {
    pub call_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::apidoc::Sealed>)]
    pub encrypted: Option<asbx_protocol::line::Sealed>,
}

/// `GET /api/runs/{id}/events?after=N`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    #[serde(default)]
    pub after: Option<u64>,
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RunRecord {
    pub id: String,
    pub kind: RunKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub status: RunStatus,
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
    /// The `session_ended` fields (docs/protocol.md §4) once the run has
    /// ended; absent for an encrypted run, whose fields are ciphertext.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::apidoc::Termination>)]
    pub termination: Option<Termination>,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct RunError {
    pub code: String,
    pub message: String,
}

/// A stored file.
///
/// - `url`: where to download it (`/api/files/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileInfo {
    pub id: String,
    pub path: String,
    pub mime_type: String,
    pub size: i64,
    pub created_at: i64,
    pub url: String,
}

/// The HTTP header carrying the run id on a `POST /api/runs` stream.
pub(crate) const RUN_ID_HEADER: &str = "x-asbx-run-id";
/// The HTTP header naming the chat of a turn stream.
pub(crate) const CHAT_ID_HEADER: &str = "x-asbx-chat-id";
/// The HTTP header naming the turn of a turn stream.
pub(crate) const TURN_ID_HEADER: &str = "x-asbx-turn-id";

/// `POST /api/agents` and `PUT /api/agents/{id}`: a stored agent, the
/// definition a workflow's Agents block runs. `PUT` replaces it whole.
///
/// - `name`: shown in lists; 1 to 200 characters.
/// - `description`: free text.
/// - `systemPrompt`: sent to the sandbox in `/config`.
/// - `model`: `provider:model`; absent: the server's default model at run time.
/// - `skills`: bundles (docs/protocol.md §3), sent in `/config`; unique names
///   matching `^[A-Za-z0-9_.-]{1,64}$`, file paths relative.
/// - `mcpServers`: stdio commands or streamable-HTTP URLs, sent in `/config`;
///   unique names matching `^[A-Za-z0-9_-]{1,64}$`.
/// - `environment`: the named environment sent in `/env`.
/// - `environmentId`: a stored environment (`/api/environments`) whose
///   variables, secrets, setup script and allowed hosts go into `/env`
///   under `environment`'s (which win on a clash; hosts are the union).
/// - `limits`: as on `POST /api/runs`, sent in `/config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AgentDefinition {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default)]
    #[schema(value_type = Vec<crate::apidoc::Skill>)]
    pub skills: Vec<Skill>,
    #[serde(default)]
    #[schema(value_type = Vec<crate::apidoc::McpServer>)]
    pub mcp_servers: Vec<McpServer>,
    #[serde(default)]
    pub environment: AgentEnvironment,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::apidoc::RunLimits>)]
    pub limits: Option<RunLimits>,
}

/// An agent's named environment: what the sandbox gets from `/env`.
///
/// - `name`: the environment's name (for example `staging`); optional.
/// - `variables`: set in the sandbox; names match `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
///   A `SANDBOX_URL` variable also picks the runner of the agent's runs
///   (docs/protocol.md §7), before the server's; it must be one of the
///   runners the operator configured (`SANDBOX_URL`,
///   `ASBX_ALLOWED_SANDBOX_URLS`), else `400 sandbox_url_not_allowed`. The
///   workspace's runner token goes only to the `SANDBOX_URL` runners.
/// - `setupScript`: bash, run before the first model call.
/// - `allowedHosts`: what the sandbox's tools may reach (default none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AgentEnvironment {
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
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AgentRecord {
    pub id: String,
    #[serde(flatten)]
    pub definition: AgentDefinition,
    pub created_at: i64,
    pub updated_at: i64,
}

/// `GET /api/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct AgentList {
    pub agents: Vec<AgentRecord>,
}

/// `POST /api/agents/{id}/runs`: one run of a stored agent.
///
/// - `prompt`: the block's input, non-empty.
///
/// - `sandboxUrl`: the block's runner, first of the three (CONTRACT §6):
///   then the agent environment's `SANDBOX_URL`, then the server's; it must
///   be one the operator configured, as on [`CreateRunRequest`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AgentRunRequest {
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_tools: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Value>,
}

/// The HTTP header naming the agent of an agent run stream.
pub(crate) const AGENT_ID_HEADER: &str = "x-asbx-agent-id";

/// What a run is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RunKind {
    /// `POST /api/runs`.
    Run,
    /// A chat turn.
    Chat,
    /// `POST /api/agents/{id}/runs`: a stored agent (a workflow's Agents block).
    Agent,
}

stored_names!(RunKind { Run => "run", Chat => "chat", Agent => "agent" });

/// The state of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RunStatus {
    Running,
    Succeeded,
    Failed,
}

stored_names!(RunStatus {
    Running => "running",
    Succeeded => "succeeded",
    Failed => "failed",
});

/// `POST /api/assistant/chat/stream`.
///
/// - `chatId`: the chat to continue; absent: the turn creates a chat.
/// - `message`: the user's message, non-empty.
/// - `attachmentIds`: bag files (`POST /api/assistant/files`) to attach.
/// - `settings`: the new chat's [`ChatSettings`]; only without `chatId`
///   (an existing chat's change with `PUT /api/assistant/chats/{id}/settings`).
///
/// There is no `sandboxUrl`: chat turns always use the server's runner.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TurnRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<String>,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachment_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<ChatSettings>,
}

/// `POST /api/assistant/chats/{id}/cancel` (`202`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CancelAccepted {
    pub chat_id: String,
    pub turn_id: String,
}

/// A chat in the list.
///
/// - `activeTurnId`: the turn holding the chat's lease, if one is in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChatSummary {
    pub id: String,
    pub title: String,
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_turn_id: Option<String>,
    /// The chat this one was forked from (`POST .../fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
}

/// One chat: its thread, its bag and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChatDetail {
    #[serde(flatten)]
    pub chat: ChatSummary,
    pub messages: Vec<PersistedMessage>,
    /// The cursor of the next older page (`?before=`), `null` when the
    /// thread starts with this page.
    pub before: Option<i64>,
    pub files: Vec<FileInfo>,
    pub settings: ChatSettingsView,
}

/// `GET /api/assistant/chats/{id}?limit=N&before=C`: the newest `limit`
/// messages (default [`CHAT_PAGE_DEFAULT`], at most [`CHAT_PAGE_MAX`])
/// before the cursor `before` (a previous page's `before`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ChatPageQuery {
    pub limit: Option<String>,
    pub before: Option<String>,
}

/// Messages in a page of a thread when `limit` is not given.
pub(crate) const CHAT_PAGE_DEFAULT: i64 = 100;
/// Most messages in a page of a thread.
pub(crate) const CHAT_PAGE_MAX: i64 = 500;

/// One message of a chat (also its stored form).
///
/// - `id`: stable message id.
/// - `role`: `user` or `assistant`.
/// - `content`: the content blocks, in display order.
/// - `fileAttachments`: bag files the user attached to this message.
/// - `createdAt`: Unix epoch ms.
/// - `turnId`: the turn (run) this message belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PersistedMessage {
    pub id: String,
    #[schema(value_type = crate::apidoc::Role)]
    pub role: Role,
    pub content: Vec<ContentBlock>,
    #[serde(default)]
    pub file_attachments: Vec<FileAttachment>,
    pub created_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
}

/// A content block.
///
/// - `text`: message text (the user's message, or the `result` line).
/// - `step`: one step of the trace, its `running` and final line merged;
///   `result` is the tool's structured output; `output` is what the tool
///   printed while it ran (its `stdout` lines), bounded as the live stream
///   bounds it.
/// - `error`: the turn failed with this code and message; `termination`
///   holds the `session_ended` fields of a failed or stopped turn
///   (docs/protocol.md §4), `interrupted` is set when the workspace lost the
///   turn (restarted or lost its runner) before it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub(crate) enum ContentBlock {
    Text {
        text: String,
    },
    Step {
        id: String,
        name: String,
        #[schema(value_type = crate::apidoc::StepStatus)]
        status: StepStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<StepOutput>,
    },
    Error {
        code: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(value_type = Option<crate::apidoc::Termination>)]
        termination: Option<Termination>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        interrupted: bool,
    },
}

/// What a step printed while it ran: its `stdout` and `stderr` chunks in the
/// order they came, at most [`STEP_OUTPUT_LIVE_BYTES`] of them.
///
/// - `text`: the chunks, concatenated.
/// - `truncated`: the step printed more; the rest was not streamed (the
///   step's `result` keeps the tool's own bounded output).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StepOutput {
    pub text: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Most bytes of one step's live output sent to a browser and kept in the
/// message; past it a single `stdout` event marked `truncated` ends it.
pub(crate) const STEP_OUTPUT_LIVE_BYTES: usize = 64 * 1024;

/// A bag file attached to a user message, denormalized so history renders
/// the chip without another lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FileAttachment {
    pub id: String,
    pub name: String,
    pub mime_type: String,
    pub size: i64,
}

impl PersistedMessage {
    /// The text this message contributes to the replayed conversation.
    pub(crate) fn replay_text(&self) -> String {
        let mut text = String::new();
        let mut error = None;
        for block in &self.content {
            match block {
                ContentBlock::Text { text: t } => {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(t);
                }
                ContentBlock::Error { code, message, .. } => error = Some((code, message)),
                ContentBlock::Step { .. } => {}
            }
        }
        if !self.file_attachments.is_empty() {
            let names: Vec<_> = self
                .file_attachments
                .iter()
                .map(|f| f.name.as_str())
                .collect();
            text.push_str(&format!("\n[attached: {}]", names.join(", ")));
        }
        match (text.is_empty(), error) {
            (true, Some((code, message))) => format!("(this turn failed: {code}: {message})"),
            _ => text,
        }
    }

    /// The message as a replayed conversation turn in `/config`.
    pub(crate) fn to_chat_turn(&self) -> ChatTurn {
        ChatTurn {
            role: self.role,
            content: self.replay_text(),
            ts: u64::try_from(self.created_at).unwrap_or(0),
        }
    }
}

/// How a chat turn ended, in its `done` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TurnStatus {
    Succeeded,
    Failed,
    Cancelled,
}

/// The `done` SSE event's payload, last on every turn stream.
///
/// - `status`: how the turn ended.
/// - `messageId`: the persisted assistant message.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Done {
    pub chat_id: String,
    pub turn_id: String,
    pub status: TurnStatus,
    pub message_id: String,
}

/// The `turn` SSE event's payload, first on every turn stream.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TurnInfo {
    pub chat_id: String,
    pub turn_id: String,
    pub user_message_id: String,
}

/// `POST /api/session`: sign in with an API key.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SignIn {
    pub api_key: String,
}

/// `GET /api/session`, and the answer to a sign-in.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = SignedIn)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionInfo {
    pub workspace_id: String,
    pub workspace_name: String,
}

/// `GET /healthz`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    #[schema(value_type = String)]
    pub status: &'static str,
}

/// `POST /api/environments` and `PUT /api/environments/{id}`: a named
/// environment, what a run's `/env` carries.
///
/// - `name`: unique among the workspace's environments; 1 to 200 characters.
/// - `variables`: set in the sandbox, returned by the API.
/// - `secrets`: set in the sandbox like variables, never returned (only
///   their names, `secretNames`). On `PUT`: absent keeps every secret, a
///   name with `null` deletes that one, a name with a string sets it. A
///   secret given as `{"value", "inject": {"hosts", "header", "format"}}`
///   is bound to hosts instead: the sandbox's variable holds the
///   placeholder `asbx-secret:NAME` and the runner's egress proxy sets the
///   header on requests to those hosts only (`injectedSecrets`).
/// - `setupScript`: bash, run before the first model call.
/// - `allowedHosts`: what the sandbox's tools may reach.
///
/// `PUT` replaces everything but the secrets.
#[derive(Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct EnvironmentBody {
    pub name: String,
    #[serde(default)]
    pub variables: BTreeMap<String, String>,
    /// A name with `null` deletes that secret (`PUT`).
    #[serde(default)]
    #[schema(value_type = Option<BTreeMap<String, SecretInput>>)]
    pub secrets: Option<BTreeMap<String, Option<SecretInput>>>,
    #[serde(default)]
    pub setup_script: Option<String>,
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
}

/// One secret of an [`EnvironmentBody`]: its value, or its value bound to
/// hosts. Never returned, never in `Debug`.
#[derive(Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(crate) enum SecretInput {
    Value(String),
    Bound(BoundSecret),
}

impl SecretInput {
    pub(crate) fn into_parts(self) -> (String, Option<SecretInject>) {
        match self {
            SecretInput::Value(v) => (v, None),
            SecretInput::Bound(b) => (b.value, Some(b.inject)),
        }
    }
}

/// `{"value", "inject"}`: a secret the egress proxy sets as a header.
#[derive(Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BoundSecret {
    pub value: String,
    pub inject: SecretInject,
}

/// Where and how the egress proxy sets a bound secret
/// (`asbx_protocol::rules::inject::InjectSpec`):
///
/// - `hosts`: as in `allowedHosts`; each is also an allowed host.
/// - `header`: the header set (`Authorization`), replacing the request's own.
/// - `format`: its value, `{value}` standing for the secret (`Bearer {value}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SecretInject {
    pub hosts: Vec<String>,
    pub header: String,
    pub format: String,
}

impl std::fmt::Debug for EnvironmentBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never a secret's value.
        f.debug_struct("EnvironmentBody")
            .field("name", &self.name)
            .field(
                "secrets",
                &self.secrets.as_ref().map(|s| s.keys().collect::<Vec<_>>()),
            )
            .finish_non_exhaustive()
    }
}

/// A named environment as the API answers it: never a secret's value.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EnvironmentRecord {
    pub id: String,
    pub name: String,
    pub variables: BTreeMap<String, String>,
    pub secret_names: Vec<String>,
    /// The secrets bound to hosts, by name: where the egress proxy sets
    /// them, never their values.
    pub injected_secrets: BTreeMap<String, SecretInject>,
    pub setup_script: Option<String>,
    pub allowed_hosts: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// `GET /api/environments`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct EnvironmentList {
    pub environments: Vec<EnvironmentRecord>,
}

/// A chat's settings, stored on the chat: chosen with its first turn or
/// `PUT /api/assistant/chats/{id}/settings`, used by every turn.
///
/// - `model`: `provider:model`, one of `GET /api/models`; absent: the
///   server's default model.
/// - `systemPrompt`: absent: the Assistant's default system prompt.
/// - `environmentId`: a named environment of the workspace, sent in `/env`.
/// - `skills`, `mcpServers`: as on stored agents, sent in `/config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ChatSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<crate::apidoc::Skill>)]
    pub skills: Vec<Skill>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<crate::apidoc::McpServer>)]
    pub mcp_servers: Vec<McpServer>,
}

/// A chat's settings as answered: what is stored, plus `effective`, the
/// model and system prompt a turn uses now.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ChatSettingsView {
    #[serde(flatten)]
    pub settings: ChatSettings,
    pub effective: EffectiveSettings,
}

/// The model and system prompt a chat's turn uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EffectiveSettings {
    pub model: String,
    pub system_prompt: String,
}

/// `GET /api/models`: the models a chat may choose, the default first
/// marked `default`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelList {
    pub models: Vec<ModelInfo>,
}

/// One model: `id` is `provider:model`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelInfo {
    pub id: String,
    pub provider: String,
    pub default: bool,
}

/// One SSE event's `data` on a chat turn's stream: `turn` (TurnInfo)
/// first, each runner line by its type (Line), `done` (Done) last.
pub(crate) struct TurnEvent;

impl utoipa::PartialSchema for TurnEvent {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let item =
            |name: &str| utoipa::openapi::RefOr::Ref(utoipa::openapi::Ref::from_schema_name(name));
        utoipa::openapi::schema::AnyOfBuilder::new()
            .item(item("TurnInfo"))
            .item(item("Line"))
            .item(item("Done"))
            .description(Some(
                "The `data` of one SSE event: `event: turn` (TurnInfo), a runner line's type (Line) or `event: done` (Done)",
            ))
            .into()
    }
}

impl utoipa::ToSchema for TurnEvent {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("TurnInfo".into(), TurnInfo::schema()));
        schemas.push(("Done".into(), Done::schema()));
        schemas.push(("TurnStatus".into(), TurnStatus::schema()));
    }
}

/// `GET /api/usage`: the caller's workspace's quotas and what it used
/// (CONTRACT.md §10), each keyed by the quota's name
/// (`concurrent-sandboxes`, `requests-per-minute`,
/// `sandbox-seconds-per-day`, `tokens-per-day`, `storage-mb`).
///
/// - `quotas`: each quota's value, `null` when unlimited.
/// - `used`: running sandboxes; the caller's requests this minute (its API
///   key or browser session); sandbox seconds and model tokens (input +
///   output, of runs that ended) today (UTC); stored megabytes (files and
///   run lines, fractional).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Usage {
    pub quotas: std::collections::BTreeMap<String, Option<u64>>,
    pub used: std::collections::BTreeMap<String, f64>,
}

"""Typed JSON bodies: what the SDK sends, and the nested objects of what it reads.

These are `TypedDict`s, so a plain dict literal type-checks against them and
code written for the untyped dicts of older versions keeps working. Keys are
the wire's (camelCase, as in `openapi/workspace.json`); the top-level
answers are the dataclasses of `_models`.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, Required, TypedDict

from ._unions import EndReason, EventType, StepStatus, TerminatedBy


class RunLimits(TypedDict, total=False):
    """Per-run limits, each optional and clamped to the runner's maximum (snake_case on the wire)."""

    max_steps: int | None
    max_tool_calls: int | None
    tool_timeout_ms: int | None
    tool_output_bytes: int | None
    max_duration_ms: int | None


class Skill(TypedDict, total=False):
    """A skill bundle placed in the sandbox: `files` maps relative paths (`SKILL.md`) to text."""

    name: Required[str]
    description: str
    files: dict[str, str]


class McpStdioServer(TypedDict, total=False):
    """An MCP server started inside the sandbox."""

    name: Required[str]
    command: Required[str]
    args: list[str]
    env: dict[str, str]


class McpHttpServer(TypedDict):
    """A streamable-HTTP MCP server."""

    name: str
    url: str


McpServer = McpStdioServer | McpHttpServer


class AgentEnvironment(TypedDict, total=False):
    """An agent's named environment: what the sandbox gets from `/env`."""

    name: str | None
    variables: dict[str, str]
    setupScript: str | None
    allowedHosts: list[str]


class AgentDefinition(TypedDict, total=False):
    """`POST /api/agents`, `PUT /api/agents/{id}` (docs/api-agents.md): a stored agent."""

    name: Required[str]
    description: str | None
    systemPrompt: str | None
    model: str | None
    skills: list[Skill]
    mcpServers: list[McpServer]
    environment: AgentEnvironment
    environmentId: str | None
    limits: RunLimits | None


class ChatSettings(TypedDict, total=False):
    """A chat's settings: with its first turn, or `PUT /api/assistant/chats/{id}/settings`."""

    model: str | None
    systemPrompt: str | None
    environmentId: str | None
    skills: list[Skill]
    mcpServers: list[McpServer]


class EffectiveSettings(TypedDict):
    """The model and system prompt a chat's turn uses now."""

    model: str
    systemPrompt: str


class ChatSettingsView(ChatSettings):
    """A chat's settings as answered: what is stored, plus `effective`."""

    effective: EffectiveSettings


class TypesFilter(TypedDict):
    types: list[EventType]


class BlockedTypesFilter(TypedDict):
    blockedTypes: list[EventType]


Filter = TypesFilter | BlockedTypesFilter


class ClientToolSpec(TypedDict):
    """A client tool as the model sees it: `parameters` is a JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class Encryption(TypedDict):
    clientPublicKey: str


class EncryptionInit(TypedDict):
    """The server half of the encryption handshake, in `session_init` (docs/protocol.md §4)."""

    algorithm: str
    serverPublicKey: str
    salt: str
    signature: str
    identityKey: str


class RunOptions(TypedDict, total=False):
    """The protocol 2 choices of a run, stored agent's or not."""

    protocol: Literal[2]
    filter: Filter
    clientTools: list[ClientToolSpec]
    encryption: Encryption


class AgentRunRequest(RunOptions):
    """`POST /api/agents/{id}/runs`; `sandboxUrl`: one of the operator's runners."""

    prompt: Required[str]
    sandboxUrl: NotRequired[str]


# `workdir` of `POST /api/runs`: the chat whose kept working directory the run starts
# from, its latest or as `afterMessageId`'s turn left it (CONTRACT §11). `from` is a
# Python keyword, so the functional syntax.
RunWorkdir = TypedDict(
    "RunWorkdir", {"from": Required[str], "afterMessageId": str}, total=False
)


class CreateRunRequest(RunOptions, total=False):
    """`POST /api/runs` (docs/api-runs.md)."""

    prompt: Required[str]
    model: str | None
    systemPrompt: str | None
    setupScript: str | None
    variables: dict[str, str]
    allowedHosts: list[str]
    limits: RunLimits | None
    skills: list[Skill]
    mcpServers: list[McpServer]
    environment: str | None
    sandboxUrl: str
    workdir: RunWorkdir


class TurnRequest(TypedDict, total=False):
    """`POST /api/assistant/chat/stream`: one turn, of a new chat without `chatId`."""

    message: Required[str]
    chatId: str
    attachmentIds: list[str]
    settings: ChatSettings


class EnvironmentBody(TypedDict, total=False):
    """`POST /api/environments`, `PUT /api/environments/{id}`: `secrets` on PUT: absent keeps
    them all, a name set to None deletes that one."""

    name: Required[str]
    variables: dict[str, str]
    secrets: dict[str, str | None] | None
    setupScript: str | None
    allowedHosts: list[str]


class ToolAnswer(TypedDict, total=False):
    """A client tool's answer: `result`, or `error`."""

    result: Any
    error: str


class ToolResultRequest(ToolAnswer, total=False):
    """`POST /api/runs/{id}/tool-result`: plaintext (`result`/`error`) or sealed (`encrypted`)."""

    callId: Required[str]
    encrypted: dict[str, str]


class RunError(TypedDict):
    """Why a run failed: an `error` line's `code` (an `ErrorCode`, or another snake_case code)."""

    code: str
    message: str


class FileAttachment(TypedDict):
    """A bag file attached to a user message."""

    id: str
    name: str
    mimeType: str
    size: int


class StepOutput(TypedDict, total=False):
    text: str
    truncated: bool


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class StepBlock(TypedDict):
    """One step of a stored trace, its `running` and final line merged."""

    type: Literal["step"]
    id: str
    name: str
    status: StepStatus
    args: NotRequired[Any]
    result: NotRequired[Any]
    error: NotRequired[str | None]
    duration_ms: NotRequired[int | None]
    output: NotRequired[StepOutput | None]


class StderrDict(TypedDict, total=False):
    head: str | None
    tail: str | None
    truncated: bool
    totalLines: int


class SessionStatsDict(TypedDict):
    durationMs: int
    steps: int
    toolCalls: int
    inputTokens: int
    outputTokens: int


class TerminationDict(TypedDict):
    """`session_ended`'s fields as JSON (the typed form is `TerminationInfo`)."""

    reason: EndReason
    terminatedBy: TerminatedBy
    stats: SessionStatsDict
    message: NotRequired[str | None]
    exitCode: NotRequired[int | None]
    signal: NotRequired[int | None]
    stderr: NotRequired[StderrDict | None]


class ErrorBlock(TypedDict):
    """The turn failed with this code; `interrupted` when the workspace lost the turn."""

    type: Literal["error"]
    code: str
    message: str
    interrupted: NotRequired[bool]
    termination: NotRequired[TerminationDict | None]


ContentBlock = TextBlock | StepBlock | ErrorBlock


class CancelAccepted(TypedDict):
    """`POST /api/assistant/chats/{id}/cancel` (202)."""

    chatId: str
    turnId: str


__all__ = [
    "AgentDefinition",
    "AgentEnvironment",
    "AgentRunRequest",
    "BlockedTypesFilter",
    "CancelAccepted",
    "ChatSettings",
    "ChatSettingsView",
    "ClientToolSpec",
    "ContentBlock",
    "CreateRunRequest",
    "EffectiveSettings",
    "Encryption",
    "EncryptionInit",
    "EnvironmentBody",
    "ErrorBlock",
    "FileAttachment",
    "Filter",
    "McpHttpServer",
    "McpServer",
    "McpStdioServer",
    "RunError",
    "RunLimits",
    "RunOptions",
    "SessionStatsDict",
    "Skill",
    "StderrDict",
    "StepBlock",
    "StepOutput",
    "TerminationDict",
    "TextBlock",
    "ToolAnswer",
    "ToolResultRequest",
    "TurnRequest",
    "TypesFilter",
]

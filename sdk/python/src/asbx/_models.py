"""Typed answers of the workspace's JSON routes (docs/api-assistant.md, docs/api-runs.md).

Each keeps the whole JSON object in `.raw`, so fields this SDK does not name
yet are still at hand.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ._events import TerminationInfo
from ._types import (
    AgentDefinition,
    AgentEnvironment,
    ChatSettingsView,
    ClientToolSpec,
    ContentBlock,
    FileAttachment,
    McpServer,
    RunError,
    RunLimits,
    Skill,
)


@dataclass(frozen=True)
class FileInfo:
    """A stored file (an attachment, or one a run wrote under `out/`)."""

    id: str
    path: str
    mime_type: str | None
    size: int | None
    created_at: int | None
    url: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> FileInfo:
        return FileInfo(
            id=str(d.get("id", "")),
            path=str(d.get("path") or d.get("name") or ""),
            mime_type=d.get("mimeType"),
            size=d.get("size"),
            created_at=d.get("createdAt"),
            url=d.get("url"),
            raw=d,
        )


@dataclass(frozen=True)
class ChatSummary:
    """One entry of `GET /api/assistant/chats` (newest first)."""

    id: str
    title: str | None
    created_at: int | None
    updated_at: int | None
    active_turn_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> ChatSummary:
        return ChatSummary(
            id=str(d.get("id", "")),
            title=d.get("title"),
            created_at=d.get("createdAt"),
            updated_at=d.get("updatedAt"),
            active_turn_id=d.get("activeTurnId"),
            raw=d,
        )


@dataclass(frozen=True)
class Message:
    """One stored message: `role` and `content` blocks (`text`, `step`, `error`)."""

    id: str
    role: str
    content: list[ContentBlock]
    turn_id: str | None
    created_at: int | None
    file_attachments: list[FileAttachment]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The message's text blocks, joined."""
        return "".join(b["text"] for b in self.content if b["type"] == "text")

    @staticmethod
    def from_json(d: dict[str, Any]) -> Message:
        return Message(
            id=str(d.get("id", "")),
            role=str(d.get("role", "")),
            content=cast(list[ContentBlock], list(d.get("content") or [])),
            turn_id=d.get("turnId"),
            created_at=d.get("createdAt"),
            file_attachments=cast(list[FileAttachment], list(d.get("fileAttachments") or [])),
            raw=d,
        )


@dataclass(frozen=True)
class Chat:
    """`GET /api/assistant/chats/{id}`: the thread and the chat's bag of files."""

    id: str
    title: str | None
    messages: list[Message]
    files: list[FileInfo]
    settings: ChatSettingsView | None
    """What is stored, plus `effective` (`model`, `systemPrompt`), when the workspace answers it."""
    before: str | None
    """Cursor of the next older page of messages (`get_chat(id, before=...)`), None when none."""
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Chat:
        before = d.get("before")
        return Chat(
            id=str(d.get("id", "")),
            title=d.get("title"),
            messages=[Message.from_json(m) for m in d.get("messages") or []],
            files=[FileInfo.from_json(f) for f in d.get("files") or []],
            settings=cast(ChatSettingsView | None, d.get("settings")),
            before=None if before is None else str(before),
            raw=d,
        )


@dataclass(frozen=True)
class RunInfo:
    """`GET /api/runs/{id}`: `status` (`running`, `succeeded`, `failed`) and how it ended;
    `kind` is `run`, `chat` (a chat turn) or `agent` (a stored agent's run)."""

    id: str
    status: str
    result: Any
    error: RunError | None
    files: list[FileInfo]
    termination: TerminationInfo | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    kind: str | None = None
    chat_id: str | None = None
    agent_id: str | None = None
    model: str | None = None
    created_at: int | None = None
    ended_at: int | None = None

    @staticmethod
    def from_json(d: dict[str, Any]) -> RunInfo:
        term = d.get("termination")
        return RunInfo(
            id=str(d.get("id", "")),
            status=str(d.get("status", "")),
            result=d.get("result"),
            error=cast(RunError | None, d.get("error")),
            files=[FileInfo.from_json(f) for f in d.get("files") or [] if isinstance(f, dict)],
            termination=TerminationInfo.from_json(term) if isinstance(term, dict) else None,
            raw=d,
            kind=d.get("kind"),
            chat_id=d.get("chatId"),
            agent_id=d.get("agentId"),
            model=d.get("model"),
            created_at=d.get("createdAt"),
            ended_at=d.get("endedAt"),
        )


@dataclass(frozen=True)
class Environment:
    """A named environment (`/api/environments`): never a secret's value, only `secret_names`."""

    id: str
    name: str
    variables: dict[str, str]
    secret_names: list[str]
    setup_script: str | None
    allowed_hosts: list[str]
    created_at: int | None
    updated_at: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Environment:
        return Environment(
            id=str(d.get("id", "")),
            name=str(d.get("name", "")),
            variables=dict(d.get("variables") or {}),
            secret_names=list(d.get("secretNames") or []),
            setup_script=d.get("setupScript"),
            allowed_hosts=list(d.get("allowedHosts") or []),
            created_at=d.get("createdAt"),
            updated_at=d.get("updatedAt"),
            raw=d,
        )


@dataclass(frozen=True)
class Agent:
    """A stored agent (`/api/agents`, docs/api-agents.md): its definition, `id` and times.

    `definition()` is what `agents.update()` takes back: change it and send it."""

    id: str
    name: str
    description: str | None
    system_prompt: str | None
    model: str | None
    skills: list[Skill]
    mcp_servers: list[McpServer]
    environment: AgentEnvironment | None
    environment_id: str | None
    limits: RunLimits | None
    created_at: int | None
    updated_at: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    def definition(self) -> AgentDefinition:
        """The stored definition, without `id` and times."""
        return cast(
            AgentDefinition,
            {k: v for k, v in self.raw.items() if k not in ("id", "createdAt", "updatedAt")},
        )

    @staticmethod
    def from_json(d: dict[str, Any]) -> Agent:
        env = d.get("environment")
        return Agent(
            id=str(d.get("id", "")),
            name=str(d.get("name", "")),
            description=d.get("description"),
            system_prompt=d.get("systemPrompt"),
            model=d.get("model"),
            skills=cast(list[Skill], list(d.get("skills") or [])),
            mcp_servers=cast(list[McpServer], list(d.get("mcpServers") or [])),
            environment=cast(AgentEnvironment, env) if isinstance(env, dict) else None,
            environment_id=d.get("environmentId"),
            limits=cast(RunLimits | None, d.get("limits")),
            created_at=d.get("createdAt"),
            updated_at=d.get("updatedAt"),
            raw=d,
        )


@dataclass(frozen=True)
class Usage:
    """`GET /api/usage`: the workspace's quotas and usage, by quota name
    (`concurrent-sandboxes`, `requests-per-minute`, `sandbox-seconds-per-day`,
    `tokens-per-day`, `storage-mb`). A quota of None is unlimited; `used` holds
    running sandboxes, the caller's requests this minute, sandbox seconds and
    tokens today (UTC), stored megabytes."""

    quotas: dict[str, int | None]
    used: dict[str, float]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Usage:
        quotas = d.get("quotas") or {}
        used = d.get("used") or {}
        return Usage(
            quotas={str(k): (None if v is None else int(v)) for k, v in quotas.items()},
            used={str(k): float(v) for k, v in used.items()},
            raw=d,
        )


@dataclass(frozen=True)
class ModelInfo:
    """One model of `GET /api/models`: `id` is `provider:model`."""

    id: str
    provider: str
    default: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> ModelInfo:
        return ModelInfo(
            id=str(d.get("id", "")),
            provider=str(d.get("provider", "")),
            default=bool(d.get("default", False)),
            raw=d,
        )


@dataclass(frozen=True)
class WorkspaceEvent:
    """`GET /api/assistant/events`: a chat's turn started or ended, or it was deleted or updated."""

    chat_id: str
    turn_id: str | None
    state: str
    title: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> WorkspaceEvent:
        return WorkspaceEvent(
            chat_id=str(d.get("chatId", "")),
            turn_id=d.get("turnId"),
            state=str(d.get("state", "")),
            title=d.get("title"),
            raw=d,
        )


ToolHandler = Callable[[Any], Any]
AsyncToolHandler = Callable[[Any], Awaitable[Any] | Any]


@dataclass(frozen=True)
class ClientTool:
    """A tool the caller runs itself (`clientTools`, docs/api-runs.md).

    When the agent calls it, the SDK calls `handler(args)` and posts what it
    returns as the result (`None` as `""`); an exception it raises is posted as the error
    (its text). No handler: answer with `stream.answer(...)` yourself. With
    `AsyncClient`, the handler may be a coroutine function.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    handler: Callable[[Any], Any] | None = None

    def spec(self) -> ClientToolSpec:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

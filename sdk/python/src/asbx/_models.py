"""Typed answers of the workspace's JSON routes (docs/api-assistant.md, docs/api-runs.md).

Each keeps the whole JSON object in `.raw`, so fields this SDK does not name
yet are still at hand.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ._events import TerminationInfo


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
    content: list[dict[str, Any]]
    turn_id: str | None
    created_at: int | None
    file_attachments: list[dict[str, Any]]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The message's text blocks, joined."""
        return "".join(str(b.get("text", "")) for b in self.content if b.get("type") == "text")

    @staticmethod
    def from_json(d: dict[str, Any]) -> Message:
        return Message(
            id=str(d.get("id", "")),
            role=str(d.get("role", "")),
            content=list(d.get("content") or []),
            turn_id=d.get("turnId"),
            created_at=d.get("createdAt"),
            file_attachments=list(d.get("fileAttachments") or []),
            raw=d,
        )


@dataclass(frozen=True)
class Chat:
    """`GET /api/assistant/chats/{id}`: the thread and the chat's bag of files."""

    id: str
    title: str | None
    messages: list[Message]
    files: list[FileInfo]
    settings: dict[str, Any] | None
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
            settings=d.get("settings"),
            before=None if before is None else str(before),
            raw=d,
        )


@dataclass(frozen=True)
class RunInfo:
    """`GET /api/runs/{id}`: `status` (`running`, `succeeded`, `failed`) and how it ended."""

    id: str
    status: str
    result: Any
    error: dict[str, Any] | None
    files: list[FileInfo]
    termination: TerminationInfo | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @staticmethod
    def from_json(d: dict[str, Any]) -> RunInfo:
        term = d.get("termination")
        return RunInfo(
            id=str(d.get("id", "")),
            status=str(d.get("status", "")),
            result=d.get("result"),
            error=d.get("error"),
            files=[FileInfo.from_json(f) for f in d.get("files") or [] if isinstance(f, dict)],
            termination=TerminationInfo.from_json(term) if isinstance(term, dict) else None,
            raw=d,
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

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

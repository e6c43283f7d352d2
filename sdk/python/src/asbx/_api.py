"""The routes, sans I/O: each operation of the workspace API as a `Call`, the
request to send and how to read its answer, or an `Open`, a request whose
answer is a stream.

The async client (`_async`) and the blocking one (`_sync`, generated from
it) only send what this module builds and hand the answer back to it, so a
route's path, body and typed answer are written once, here.
"""

from __future__ import annotations

import json as jsonlib
import mimetypes
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, TypeVar, cast
from urllib.parse import quote

from ._core import check_status
from ._crypto import ClientSession
from ._models import Agent, Chat, ChatSummary, ClientTool, Environment, FileInfo, ModelInfo, RunInfo, Usage
from ._types import (
    AgentDefinition,
    AgentRunRequest,
    ChatSettings,
    ChatSettingsView,
    CreateRunRequest,
    EnvironmentBody,
    McpServer,
    RunLimits,
    RunWorkdir,
    Skill,
    ToolAnswer,
    ToolResultRequest,
    TurnRequest,
)
from ._unions import EventType

T = TypeVar("T")

NDJSON = {"accept": "application/x-ndjson"}
SSE = {"accept": "text/event-stream"}


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The decoded JSON answer: None for an empty one, the bytes when it is not JSON."""
        check_status(self.status, self.body)
        if not self.body:
            return None
        if "json" in self.headers.get("content-type", ""):
            return jsonlib.loads(self.body)
        return self.body


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer (`parse` raises `AsbxError` for an error status)."""

    method: str
    path: str
    parse: Callable[[Answer], T]
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Open:
    """A request whose answer is a stream of lines (NDJSON) or frames (SSE)."""

    method: str
    path: str
    params: dict[str, str] | None = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def seg(value: str) -> str:
    """`value` as one path segment."""
    return quote(str(value), safe="")


def _none(a: Answer) -> None:
    a.json()


def _object(a: Answer) -> dict[str, Any]:
    body = a.json()
    return body if isinstance(body, dict) else {}


def _items(key: str) -> Callable[[Answer], list[dict[str, Any]]]:
    def parse(a: Answer) -> list[dict[str, Any]]:
        items = _object(a).get(key) or []
        return [i for i in items if isinstance(i, dict)]

    return parse


def deprecated(old: str, new: str) -> None:
    """Warns that the flat method `old` is now `new` (it still works)."""
    warnings.warn(f"{old}() is deprecated, use client.{new}()", DeprecationWarning, stacklevel=3)


# -- chats --------------------------------------------------------------------


def turn_body(
    message: str,
    chat_id: str | None,
    attachments: Iterable[str | FileInfo] | None,
    settings: ChatSettings | Mapping[str, Any] | None,
) -> TurnRequest:
    body: TurnRequest = {"message": message}
    if chat_id is not None:
        body["chatId"] = chat_id
    if attachments:
        body["attachmentIds"] = [a.id if isinstance(a, FileInfo) else a for a in attachments]
    if settings is not None:
        body["settings"] = ChatSettings(**settings)  # type: ignore[typeddict-item]
    return body


def open_turn(body: TurnRequest) -> Open:
    return Open("POST", "/api/assistant/chat/stream", json=body, headers=dict(SSE))


def open_chat_stream(chat_id: str, after: int) -> Open:
    headers = dict(SSE)
    if after:
        headers["last-event-id"] = str(after)
    return Open("GET", f"/api/assistant/chats/{seg(chat_id)}/stream", headers=headers)


def open_workspace_events() -> Open:
    return Open("GET", "/api/assistant/events", headers=dict(SSE))


def list_chats() -> Call[list[ChatSummary]]:
    def parse(a: Answer) -> list[ChatSummary]:
        body = a.json() or []
        return [ChatSummary.from_json(c) for c in body if isinstance(c, dict)]

    return Call("GET", "/api/assistant/chats", parse)


def get_chat(chat_id: str, limit: int | None, before: str | None) -> Call[Chat]:
    params = {}
    if limit is not None:
        params["limit"] = str(limit)
    if before is not None:
        params["before"] = str(before)
    return Call(
        "GET",
        f"/api/assistant/chats/{seg(chat_id)}",
        lambda a: Chat.from_json(_object(a)),
        params=params or None,
    )


def delete_chat(chat_id: str) -> Call[None]:
    return Call("DELETE", f"/api/assistant/chats/{seg(chat_id)}", _none)


def fork_chat(chat_id: str, after_message_id: str) -> Call[str]:
    def parse(a: Answer) -> str:
        return str(_object(a)["id"])

    return Call(
        "POST",
        f"/api/assistant/chats/{seg(chat_id)}/fork",
        parse,
        json={"afterMessageId": after_message_id},
    )


def chat_workdir_tar(chat_id: str, after_message_id: str | None) -> Call[bytes]:
    def parse(a: Answer) -> bytes:
        check_status(a.status, a.body)
        return a.body

    params = {"afterMessageId": after_message_id} if after_message_id is not None else None
    return Call("GET", f"/api/assistant/chats/{seg(chat_id)}/workdir.tar", parse, params=params)


def cancel_chat(chat_id: str) -> Call[None]:
    return Call("POST", f"/api/assistant/chats/{seg(chat_id)}/cancel", _none)


def update_chat_settings(chat_id: str, settings: ChatSettings | Mapping[str, Any]) -> Call[ChatSettingsView]:
    return Call(
        "PUT",
        f"/api/assistant/chats/{seg(chat_id)}/settings",
        lambda a: ChatSettingsView(**_object(a)),  # type: ignore[typeddict-item]
        json=dict(settings),
    )


# -- files --------------------------------------------------------------------


def read_upload(data: bytes | str | os.PathLike[str] | IO[bytes], name: str | None) -> tuple[bytes, str]:
    """The bytes and name of an upload: bytes (`name` required), a path, or a binary file object."""
    if isinstance(data, bytes | bytearray | memoryview):
        if not name:
            raise ValueError("name is required when uploading bytes")
        return bytes(data), name
    if isinstance(data, str | os.PathLike):
        p = Path(data)
        return p.read_bytes(), name or p.name
    content = data.read()
    guessed = os.path.basename(str(getattr(data, "name", "") or ""))
    if not (name or guessed):
        raise ValueError("name is required for a file object without a name")
    return content, name or guessed


def upload_file(
    data: bytes | str | os.PathLike[str] | IO[bytes],
    name: str | None,
    mime_type: str | None,
    chat_id: str | None,
) -> Call[FileInfo]:
    content, name = read_upload(data, name)
    params = {"name": name}
    if chat_id:
        params["chatId"] = chat_id
    mime = mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Call(
        "POST",
        "/api/assistant/files",
        lambda a: FileInfo.from_json(_object(a)),
        params=params,
        content=content,
        headers={"content-type": mime},
    )


def download_file(file_id: str) -> Call[bytes]:
    def parse(a: Answer) -> bytes:
        check_status(a.status, a.body)
        return a.body

    return Call("GET", f"/api/files/{seg(file_id)}", parse)


def delete_file(file_id: str) -> Call[None]:
    return Call("DELETE", f"/api/files/{seg(file_id)}", _none)


# -- runs ---------------------------------------------------------------------


def normalize_tools(
    tools: Sequence[ClientTool] | Mapping[str, Any] | None,
) -> dict[str, ClientTool]:
    """`tools` as a list of `ClientTool`, or a mapping of names to handlers (or `ClientTool`s)."""
    if not tools:
        return {}
    if isinstance(tools, Mapping):
        out: dict[str, ClientTool] = {}
        for name, t in tools.items():
            out[name] = t if isinstance(t, ClientTool) else ClientTool(name=name, handler=t)
        return out
    return {t.name: t for t in tools}


def run_options(
    body: CreateRunRequest | AgentRunRequest,
    tools: dict[str, ClientTool],
    crypto: ClientSession | None,
    filter_types: Sequence[EventType | str] | None,
    blocked_types: Sequence[EventType | str] | None,
) -> None:
    """Sets the protocol 2 choices (`protocol`, `clientTools`, `encryption`, `filter`) on `body`."""
    body["protocol"] = 2
    if tools:
        body["clientTools"] = [t.spec() for t in tools.values()]
    if crypto is not None:
        body["encryption"] = {"clientPublicKey": crypto.public_key}
    if filter_types is not None and blocked_types is not None:
        raise ValueError("give filter_types or blocked_types, not both")
    if filter_types is not None:
        body["filter"] = {"types": cast(list[EventType], list(filter_types))}
    if blocked_types is not None:
        body["filter"] = {"blockedTypes": cast(list[EventType], list(blocked_types))}


def run_body(
    prompt: str,
    *,
    model: str | None = None,
    system_prompt: str | None = None,
    setup_script: str | None = None,
    variables: Mapping[str, str] | None = None,
    allowed_hosts: Sequence[str] | None = None,
    limits: RunLimits | None = None,
    skills: Sequence[Skill] | None = None,
    mcp_servers: Sequence[McpServer] | None = None,
    environment: str | None = None,
    workdir_from: str | None = None,
    workdir_after_message_id: str | None = None,
) -> CreateRunRequest:
    """`POST /api/runs`'s body, protocol 2 choices aside; only what is given."""
    body: CreateRunRequest = {"prompt": prompt}
    if model is not None:
        body["model"] = model
    if system_prompt is not None:
        body["systemPrompt"] = system_prompt
    if setup_script is not None:
        body["setupScript"] = setup_script
    if variables is not None:
        body["variables"] = dict(variables)
    if allowed_hosts is not None:
        body["allowedHosts"] = list(allowed_hosts)
    if limits is not None:
        body["limits"] = limits
    if skills is not None:
        body["skills"] = list(skills)
    if mcp_servers is not None:
        body["mcpServers"] = list(mcp_servers)
    if environment is not None:
        body["environment"] = environment
    if workdir_from is not None:
        workdir: RunWorkdir = {"from": workdir_from}
        if workdir_after_message_id is not None:
            workdir["afterMessageId"] = workdir_after_message_id
        body["workdir"] = workdir
    elif workdir_after_message_id is not None:
        raise ValueError("workdir_after_message_id needs workdir_from")
    return body


def open_run(body: CreateRunRequest | AgentRunRequest, agent_id: str | None) -> Open:
    path = f"/api/agents/{seg(agent_id)}/runs" if agent_id else "/api/runs"
    return Open("POST", path, json=body, headers=dict(NDJSON))


def open_run_events(run_id: str, after: int) -> Open:
    return Open("GET", f"/api/runs/{seg(run_id)}/events", params={"after": str(after)}, headers=dict(NDJSON))


def get_run(run_id: str) -> Call[RunInfo]:
    return Call("GET", f"/api/runs/{seg(run_id)}", lambda a: RunInfo.from_json(_object(a)))


def cancel_run(run_id: str) -> Call[bool]:
    """True while the run ends (202), False when it had already ended (204)."""

    def parse(a: Answer) -> bool:
        check_status(a.status, a.body)
        return a.status == 202

    return Call("DELETE", f"/api/runs/{seg(run_id)}", parse)


def tool_answer(result: Any = None, error: str | None = None) -> ToolAnswer:
    """`{"error"}`, else `{"result"}`; a `None` result is sent as `""`, as the
    runner reads a `null` result as none at all (docs/api-runs.md)."""
    if error is not None:
        return {"error": error}
    return {"result": "" if result is None else result}


def tool_result(
    run_id: str, call_id: str, answer: ToolAnswer | Mapping[str, Any], crypto: ClientSession | None
) -> Call[None]:
    """Posts a client tool's answer, sealed when the run is encrypted (`crypto`)."""
    body: ToolResultRequest = {"callId": call_id}
    if crypto is not None:
        body["encrypted"] = crypto.seal_tool_result(call_id, dict(answer))
    else:
        body.update(answer)  # type: ignore[typeddict-item]
    return Call("POST", f"/api/runs/{seg(run_id)}/tool-result", _none, json=body)


# -- agents -------------------------------------------------------------------


def create_agent(definition: AgentDefinition | Mapping[str, Any]) -> Call[Agent]:
    return Call("POST", "/api/agents", lambda a: Agent.from_json(_object(a)), json=dict(definition))


def list_agents() -> Call[list[Agent]]:
    return Call("GET", "/api/agents", lambda a: [Agent.from_json(d) for d in _items("agents")(a)])


def get_agent(agent_id: str) -> Call[Agent]:
    return Call("GET", f"/api/agents/{seg(agent_id)}", lambda a: Agent.from_json(_object(a)))


def update_agent(agent_id: str, definition: AgentDefinition | Mapping[str, Any]) -> Call[Agent]:
    return Call(
        "PUT", f"/api/agents/{seg(agent_id)}", lambda a: Agent.from_json(_object(a)), json=dict(definition)
    )


def delete_agent(agent_id: str) -> Call[None]:
    return Call("DELETE", f"/api/agents/{seg(agent_id)}", _none)


# -- environments and models ----------------------------------------------------


def environment_body(
    name: str,
    variables: Mapping[str, str] | None,
    secrets: Mapping[str, str | None] | None,
    setup_script: str | None,
    allowed_hosts: Sequence[str] | None,
) -> EnvironmentBody:
    body: EnvironmentBody = {"name": name, "variables": dict(variables or {})}
    if secrets is not None:
        body["secrets"] = dict(secrets)
    if setup_script is not None:
        body["setupScript"] = setup_script
    body["allowedHosts"] = list(allowed_hosts or [])
    return body


def list_environments() -> Call[list[Environment]]:
    return Call(
        "GET", "/api/environments", lambda a: [Environment.from_json(e) for e in _items("environments")(a)]
    )


def get_environment(environment_id: str) -> Call[Environment]:
    return Call(
        "GET", f"/api/environments/{seg(environment_id)}", lambda a: Environment.from_json(_object(a))
    )


def create_environment(body: EnvironmentBody) -> Call[Environment]:
    return Call("POST", "/api/environments", lambda a: Environment.from_json(_object(a)), json=body)


def update_environment(environment_id: str, body: EnvironmentBody) -> Call[Environment]:
    return Call(
        "PUT",
        f"/api/environments/{seg(environment_id)}",
        lambda a: Environment.from_json(_object(a)),
        json=body,
    )


def delete_environment(environment_id: str) -> Call[None]:
    return Call("DELETE", f"/api/environments/{seg(environment_id)}", _none)


# -- audit --------------------------------------------------------------------


def list_audit(
    after: int = 0, limit: int | None = None, run_id: str | None = None
) -> Call[list[dict[str, Any]]]:
    """The audit records after `after` (NDJSON, oldest first): the workspace's, or one run's."""

    def parse(a: Answer) -> list[dict[str, Any]]:
        check_status(a.status, a.body)
        return [cast(dict[str, Any], jsonlib.loads(line)) for line in a.body.splitlines() if line.strip()]

    params = {"after": str(after)}
    if limit is not None:
        params["limit"] = str(limit)
    path = "/api/audit" if run_id is None else f"/api/runs/{seg(run_id)}/audit"
    return Call("GET", path, parse, params=params)


def list_models() -> Call[list[ModelInfo]]:
    return Call("GET", "/api/models", lambda a: [ModelInfo.from_json(m) for m in _items("models")(a)])


def get_usage() -> Call[Usage]:
    return Call("GET", "/api/usage", lambda a: Usage.from_json(_object(a)))

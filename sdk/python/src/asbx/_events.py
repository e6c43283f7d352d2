"""Typed events of a chat turn's SSE stream and a run's protocol 2 lines.

The shapes are those of docs/protocol.md §2 and §4 (lines) and §7 (the chat
stream's own `turn` and `done`). Every event keeps the decoded JSON object in
`.raw`; a type this SDK does not know yet arrives as `UnknownEvent` rather
than ending the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from ._types import EncryptionInit


@dataclass(frozen=True)
class Event:
    """Fields every line carries: `type`, `seq` (1, 2, 3... per session), `ts` (Unix ms), `sessionId`."""

    type: str
    seq: int | None
    ts: int | None
    session_id: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)


@dataclass(frozen=True)
class Limits:
    max_duration_ms: int | None
    max_steps: int | None
    max_tool_calls: int | None
    heartbeat_interval_ms: int | None


@dataclass(frozen=True)
class SessionInit(Event):
    """First line: the session's effective limits, and `encryption` when sealed."""

    protocol_version: int
    limits: Limits
    encryption: EncryptionInit | None


@dataclass(frozen=True)
class Delta(Event):
    """Model text as it streams."""

    text: str


@dataclass(frozen=True)
class Stdout(Event):
    """A tool's output while it runs (`stream` is `stdout` or `stderr`)."""

    step_id: str
    stream: str
    chunk: str
    truncated: bool


@dataclass(frozen=True)
class Step(Event):
    """A tool step: once `running`, then once `succeeded` or `failed`."""

    id: str
    name: str
    status: str
    args: Any
    result: Any
    error: Any
    duration_ms: int | None


@dataclass(frozen=True)
class Log(Event):
    level: str
    message: str


@dataclass(frozen=True)
class ToolCall(Event):
    """The agent calls a client tool and waits for its answer."""

    call_id: str
    tool_name: str
    args: Any


@dataclass(frozen=True)
class ToolResultApplied(Event):
    call_id: str


@dataclass(frozen=True)
class Heartbeat(Event):
    pass


@dataclass(frozen=True)
class Result(Event):
    """The turn's answer (once per successful turn)."""

    message: str


@dataclass(frozen=True)
class ErrorEvent(Event):
    """A terminal failure instead of `result` (`code` from docs/protocol.md §2)."""

    code: str
    message: str


@dataclass(frozen=True)
class StderrOutput:
    head: str | None
    tail: str | None
    truncated: bool
    total_lines: int | None


@dataclass(frozen=True)
class SessionStats:
    duration_ms: int
    steps: int
    tool_calls: int
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TerminationInfo:
    """How a session ended: `session_ended`'s fields (docs/protocol.md §4)."""

    reason: str
    terminated_by: str
    message: str | None
    exit_code: int | None
    signal: int | str | None
    stderr: StderrOutput | None
    stats: SessionStats | None

    @property
    def ok(self) -> bool:
        return self.reason == "completed"

    @staticmethod
    def from_json(d: dict[str, Any]) -> TerminationInfo:
        err = d.get("stderr")
        stats = d.get("stats")
        return TerminationInfo(
            reason=str(d.get("reason", "")),
            terminated_by=str(d.get("terminatedBy", "")),
            message=d.get("message"),
            exit_code=d.get("exitCode"),
            signal=d.get("signal"),
            stderr=StderrOutput(
                head=err.get("head"),
                tail=err.get("tail"),
                truncated=bool(err.get("truncated", False)),
                total_lines=err.get("totalLines"),
            )
            if isinstance(err, dict)
            else None,
            stats=SessionStats(
                duration_ms=int(stats.get("durationMs", 0)),
                steps=int(stats.get("steps", 0)),
                tool_calls=int(stats.get("toolCalls", 0)),
                input_tokens=int(stats.get("inputTokens", 0)),
                output_tokens=int(stats.get("outputTokens", 0)),
            )
            if isinstance(stats, dict)
            else None,
        )


@dataclass(frozen=True)
class SessionEnded(Event):
    """Always the last line of a session."""

    termination: TerminationInfo


@dataclass(frozen=True)
class Turn(Event):
    """Chat stream only, first: the chat and turn ids."""

    chat_id: str
    turn_id: str
    user_message_id: str | None


@dataclass(frozen=True)
class Done(Event):
    """Chat stream only, last: `status` (`succeeded`, `failed`, `cancelled`) and the stored message id."""

    chat_id: str
    turn_id: str
    status: str
    message_id: str | None


@dataclass(frozen=True)
class UnknownEvent(Event):
    """A type this version of the SDK does not know; see `.raw`."""


def _base(kind: str, d: dict[str, Any]) -> dict[str, Any]:
    seq = d.get("seq")
    return {
        "type": kind,
        "seq": seq if isinstance(seq, int) else None,
        "ts": d.get("ts"),
        "session_id": d.get("sessionId"),
        "raw": d,
    }


def parse_event(kind: str, d: dict[str, Any]) -> Event:
    """The typed event of type `kind` (the line's `type`, or the SSE event name) for object `d`."""
    b = _base(kind, d)
    g = d.get
    if kind == "session_init":
        lim = g("limits") or {}
        return SessionInit(
            **b,
            protocol_version=int(g("protocolVersion", 2)),
            limits=Limits(
                lim.get("maxDurationMs"),
                lim.get("maxSteps"),
                lim.get("maxToolCalls"),
                lim.get("heartbeatIntervalMs"),
            ),
            encryption=cast(EncryptionInit | None, g("encryption")),
        )
    if kind == "delta":
        return Delta(**b, text=str(g("text", "")))
    if kind == "stdout":
        return Stdout(
            **b,
            step_id=str(g("stepId", "")),
            stream=str(g("stream", "stdout")),
            chunk=str(g("chunk", "")),
            truncated=bool(g("truncated", False)),
        )
    if kind == "step":
        return Step(
            **b,
            id=str(g("id", "")),
            name=str(g("name", "")),
            status=str(g("status", "")),
            args=g("args"),
            result=g("result"),
            error=g("error"),
            duration_ms=g("durationMs"),
        )
    if kind == "log":
        return Log(**b, level=str(g("level", "info")), message=str(g("message", "")))
    if kind == "tool_call":
        return ToolCall(**b, call_id=str(g("callId", "")), tool_name=str(g("toolName", "")), args=g("args"))
    if kind == "tool_result_applied":
        return ToolResultApplied(**b, call_id=str(g("callId", "")))
    if kind == "heartbeat":
        return Heartbeat(**b)
    if kind == "result":
        return Result(**b, message=str(g("message", "")))
    if kind == "error":
        return ErrorEvent(**b, code=str(g("code", "")), message=str(g("message", "")))
    if kind == "session_ended":
        return SessionEnded(**b, termination=TerminationInfo.from_json(d))
    if kind == "turn":
        return Turn(
            **b,
            chat_id=str(g("chatId", "")),
            turn_id=str(g("turnId", "")),
            user_message_id=g("userMessageId"),
        )
    if kind == "done":
        return Done(
            **b,
            chat_id=str(g("chatId", "")),
            turn_id=str(g("turnId", "")),
            status=str(g("status", "")),
            message_id=g("messageId"),
        )
    return UnknownEvent(**b)

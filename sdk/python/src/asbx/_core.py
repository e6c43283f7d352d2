"""What the sync and async clients share besides the routes (`_api`): settings,
retry policy, stream framing and the state of one stream (dedup by `seq`,
decryption, how it ended).

No I/O here: `_sync` and `_async` feed it lines.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._crypto import ClientSession
from ._errors import AsbxError, DecryptionError, StreamError
from ._events import Done, Event, Result, SessionEnded, SessionInit, TerminationInfo, Turn, parse_event
from ._types import ToolAnswer

USER_AGENT = "asbx-python/0.1.0"
# Protocol 2 sends a heartbeat after 5 s without another line (docs/protocol.md §4):
# a stream silent for this long is dead, and is resumed.
STREAM_READ_TIMEOUT = 30.0
MAX_RESUMES = 8
# Methods a dropped connection may repeat: sending one twice does no harm.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
# Statuses that say "not now, try again": the request was not taken.
RETRY_STATUSES = frozenset({429, 503})
# The longest `Retry-After` honoured, in seconds.
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """How streams reconnect and plain requests are retried.

    A dropped stream is re-opened up to `max_attempts` times in a row without a new
    line, waiting `initial_delay_ms * backoff_multiplier ** n` (at most `max_delay_ms`)
    before the n-th (from 0). A plain request answered 429 or 503, or (for an
    idempotent method) lost to a connection error, is sent again up to `max_retries`
    times, after the answer's `Retry-After` when it has one (at most 60 s).
    """

    max_attempts: int = MAX_RESUMES
    initial_delay_ms: float = 100.0
    backoff_multiplier: float = 2.0
    max_delay_ms: float = 2000.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.max_attempts < 0 or self.max_retries < 0:
            raise ValueError("max_attempts and max_retries must be >= 0")
        if self.initial_delay_ms < 0 or self.max_delay_ms < 0 or self.backoff_multiplier < 1:
            raise ValueError("delays must be >= 0 and backoff_multiplier >= 1")

    def delay(self, n: int) -> float:
        """Seconds before the n-th retry or reconnect (from 0)."""
        ms = min(self.initial_delay_ms * self.backoff_multiplier ** min(n, 64), self.max_delay_ms)
        return ms / 1000.0

    def retry_wait(self, method: str, status: int | None, headers: Mapping[str, str], n: int) -> float | None:
        """Seconds to wait before sending again the n-th time, or None not to.

        `status` None: the connection failed."""
        if n >= self.max_retries:
            return None
        if status is None:
            return self.delay(n) if method.upper() in IDEMPOTENT else None
        if status not in RETRY_STATUSES:
            return None
        after = retry_after(headers.get("retry-after"))
        return self.delay(n) if after is None else after


def retry_after(value: str | None) -> float | None:
    """A `Retry-After` header (seconds, or an HTTP date) in seconds, capped at 60 s."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        secs = when.timestamp() - time.time()
    return min(max(secs, 0.0), MAX_RETRY_AFTER)


def settings_from_env(base_url: str | None, api_key: str | None) -> tuple[str, str | None]:
    """`base_url` and `api_key`, else `ASBX_URL` and `ASBX_API_KEY` from the environment."""
    url = base_url or os.environ.get("ASBX_URL")
    if not url:
        raise ValueError("no workspace URL: pass base_url or set ASBX_URL")
    key = api_key if api_key is not None else (os.environ.get("ASBX_API_KEY") or None)
    return url.rstrip("/"), key


def auth_headers(api_key: str | None) -> dict[str, str]:
    headers = {"user-agent": USER_AGENT}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    return headers


class RunChannel(Protocol):
    """A run's own socket (`transport="websocket"`, `_ws.SocketRun`): a run
    stream reopens over it, and sends tool answers and `cancel` on it while
    it is open (the HTTP routes otherwise)."""

    def reopen(self, run_id: str, after: int) -> Any:
        """A new socket attached to `run_id` after `seq` `after`, read like an NDJSON response."""
        ...

    def answer(self, call_id: str, answer: ToolAnswer, crypto: ClientSession | None) -> bool:
        """Sends a tool answer (sealed with `crypto`); False when the socket is not open."""
        ...

    def cancel(self) -> bool:
        """Sends `cancel`; False when the socket is not open."""
        ...


class SseDecoder:
    """SSE framing (`event:`, `data:`, `id:`, comments), fed one line at a time."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> tuple[str, str, str | None] | None:
        """A finished frame `(event, data, id)` at a blank line, else None."""
        if line.endswith("\r"):
            line = line[:-1]
        if not line:
            if not self._data and not self._event:
                return None
            frame = (self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data, self._id = "", [], None
            return frame
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


@dataclass
class StreamState:
    """One session's stream across reconnects: what was seen, how it ended."""

    crypto: ClientSession | None = None
    last_seq: int = 0
    turn_seen: bool = False
    ended: bool = False
    done: bool = False
    termination: TerminationInfo | None = None
    result: str | None = None
    error: Any = None
    session_id: str | None = None
    seen: int = 0
    _pending: list[Event] = field(default_factory=list)

    def accept(self, kind: str | None, obj: dict[str, Any]) -> Event | None:
        """The event for one decoded line or frame, or None for one already seen."""
        kind = kind or str(obj.get("type", ""))
        seq = obj.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            if seq <= self.last_seq:
                return None
            self.last_seq = seq
        elif kind == "turn":
            if self.turn_seen:
                return None
            self.turn_seen = True
        if self.crypto is None:
            if "encrypted" in obj:
                raise DecryptionError(
                    "the run is encrypted: read it with the key it was started with (crypto=)",
                    code="decryption_failed",
                )
        else:
            if kind == "session_init" and not self.crypto.agreed:
                enc = obj.get("encryption")
                if not isinstance(enc, dict):
                    raise StreamError("the run was asked to be encrypted but session_init has no encryption")
                self.crypto.agree(enc, str(obj.get("sessionId", "")))
            obj = self.crypto.decrypt_line(obj)
        ev = parse_event(kind, obj)
        self.seen += 1
        if ev.session_id:
            self.session_id = ev.session_id
        if isinstance(ev, SessionEnded):
            self.ended = True
            self.termination = ev.termination
        elif isinstance(ev, Result):
            self.result = ev.message
        elif isinstance(ev, Done):
            self.done = True
        elif isinstance(ev, SessionInit | Turn):
            pass
        elif ev.type == "error":
            self.error = ev
        return ev

    def accept_ndjson(self, line: str) -> Event | None:
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise StreamError(f"a line that is not JSON: {line[:200]!r}") from e
        if not isinstance(obj, dict):
            raise StreamError(f"a line that is not a JSON object: {line[:200]!r}")
        return self.accept(None, obj)

    def accept_sse(self, frame: tuple[str, str, str | None]) -> Event | None:
        kind, data, _id = frame
        try:
            obj = json.loads(data) if data else {}
        except ValueError:
            obj = {"text": data}
        if not isinstance(obj, dict):
            obj = {"value": obj}
        return self.accept(kind, obj)


def frame_json(frame: tuple[str, str, str | None]) -> dict[str, Any]:
    try:
        obj = json.loads(frame[1]) if frame[1] else {}
    except ValueError as e:
        raise StreamError(f"an event whose data is not JSON: {frame[1][:200]!r}") from e
    return obj if isinstance(obj, dict) else {"value": obj}


def check_status(status: int, body: bytes) -> None:
    if status >= 400:
        raise AsbxError.from_problem(status, body)

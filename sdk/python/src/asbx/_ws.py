"""The WebSocket transport of runs (docs/protocol.md §13), for `Client.run(...,
transport="websocket")`: `GET /api/runs/ws` carries a run's lines as text
messages, one line each.

The socket is shown to `RunStream` as the NDJSON response the HTTP transport
gets (`iter_lines()`, `close()`, `headers`), so resume, client tools and
encryption work the same; a dropped socket is resumed with an `attach`
message, and tool results and `cancel` go over the socket while it is open.

Needs the `websockets` package (`pip install "asbx[websocket]"`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from ._errors import AsbxError, StreamError

if TYPE_CHECKING:
    from ._crypto import ClientSession
    from ._types import ToolAnswer


class Endpoint(Protocol):
    """What a socket needs of the client: where, with which headers, how long to wait."""

    base_url: str
    _headers: dict[str, str]
    _stream_timeout: httpx.Timeout


def _connect(client: Endpoint) -> Any:
    try:
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError('transport="websocket" needs the websockets package: pip install "asbx[websocket]"') from e
    url = client.base_url.replace("http", "ws", 1) + "/api/runs/ws"
    try:
        return connect(
            url,
            additional_headers=client._headers,
            max_size=None,
            open_timeout=client._stream_timeout.connect or 30.0,
        )
    except InvalidStatus as e:
        raise AsbxError.from_problem(e.response.status_code, bytes(e.response.body or b"")) from e
    except OSError as e:
        raise httpx.ConnectError(f"could not open {url}: {e}") from e


class SocketLines:
    """One socket carrying one run, read like an NDJSON response."""

    def __init__(self, conn: Any, first: str | None, run_id: str | None, read_timeout: float | None) -> None:
        self._conn = conn
        self._first = first
        self._timeout = read_timeout
        self.headers: dict[str, str] = {"x-asbx-run-id": run_id} if run_id else {}
        self.refusals: list[tuple[str, str]] = []
        """Answers (`code`, `message`) to messages sent on the open socket."""

    @classmethod
    def open(cls, client: Endpoint, message: dict[str, Any], run_id: str | None) -> SocketLines:
        """Opens a socket, sends `message` (`dispatch` or `attach`) and waits for the first line."""
        from websockets.exceptions import ConnectionClosed

        conn = _connect(client)
        conn.send(json.dumps(message))
        timeout = client._stream_timeout.read
        try:
            while True:
                text = conn.recv(timeout=timeout)
                if not isinstance(text, str):
                    continue
                line = json.loads(text)
                if line.get("seq") == 0 and line.get("type") == "error":
                    conn.close()
                    raise AsbxError.from_problem(
                        400 if line.get("code") == "invalid_request" else 409,
                        json.dumps({"code": line.get("code"), "detail": line.get("message")}).encode(),
                    )
                sid = line.get("sessionId")
                return cls(conn, text, run_id or (sid if isinstance(sid, str) else None), timeout)
        except ConnectionClosed as e:
            if e.rcvd is not None and e.rcvd.code == 1000:
                # Nothing after `after`: an empty stream.
                return cls(conn, None, run_id, timeout)
            raise httpx.ReadError(f"the socket closed before its first line: {e}") from e
        except TimeoutError as e:
            conn.close()
            raise httpx.ReadTimeout("no line in time") from e

    def iter_lines(self) -> Iterator[str]:
        from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

        if self._first is not None:
            first, self._first = self._first, None
            yield first
        while True:
            try:
                text = self._conn.recv(timeout=self._timeout)
            except ConnectionClosedOK:
                return
            except ConnectionClosed as e:
                raise httpx.ReadError(f"the socket closed: {e}") from e
            except TimeoutError as e:
                raise httpx.ReadTimeout("no line in time") from e
            if not isinstance(text, str):
                continue
            if text.startswith('{"seq":0,'):
                line = json.loads(text)
                if line.get("seq") == 0 and line.get("type") == "error":
                    self.refusals.append((str(line.get("code")), str(line.get("message"))))
                    continue
            yield text

    def send(self, message: dict[str, Any]) -> bool:
        """Sends while the socket is open; `False` when it is not."""
        try:
            self._conn.send(json.dumps(message))
            return True
        except Exception:
            return False

    def close(self) -> None:
        self._conn.close()


class SocketRun:
    """One run's socket across reconnects: the `RunStream`'s channel
    (`_core.RunChannel`). Tool answers and `cancel` go over the socket
    open now; a dropped one is replaced by `reopen`."""

    def __init__(self, client: Endpoint, lines: SocketLines) -> None:
        self._client = client
        self.lines = lines

    def reopen(self, run_id: str, after: int) -> SocketLines:
        self.lines = SocketLines.open(self._client, {"type": "attach", "runId": run_id, "after": after}, run_id)
        return self.lines

    def answer(self, call_id: str, answer: ToolAnswer, crypto: ClientSession | None) -> bool:
        body: dict[str, Any] = {"type": "tool_result", "callId": call_id}
        if crypto is not None:
            body["encrypted"] = crypto.seal_tool_result(call_id, dict(answer))
        else:
            body.update(answer)
        return self.lines.send(body)

    def cancel(self) -> bool:
        return self.lines.send({"type": "cancel"})


def open_run(client: Endpoint, body: dict[str, Any]) -> tuple[SocketRun, str]:
    """Dispatches `body` (of `POST /api/runs`) over a socket: the socket and the run's id."""
    lines = SocketLines.open(client, {"type": "dispatch", **body}, None)
    run_id = lines.headers.get("x-asbx-run-id")
    if not run_id:
        lines.close()
        raise StreamError("no line names the run")
    return SocketRun(client, lines), run_id


def open_events(client: Endpoint, run_id: str, after: int) -> SocketRun:
    """Attaches to `run_id` after `after` over a socket."""
    return SocketRun(client, SocketLines.open(client, {"type": "attach", "runId": run_id, "after": after}, run_id))


__all__ = ["Endpoint", "SocketLines", "SocketRun", "open_run", "open_events"]


async def aopen_run(client: Any, body: dict[str, Any]) -> tuple[SocketRun, str]:
    """The asyncio client's `transport="websocket"`: not built yet (the blocking `Client` has it)."""
    raise NotImplementedError('transport="websocket" is in the blocking Client only, for now')


async def aopen_events(client: Any, run_id: str, after: int) -> SocketRun:
    """The asyncio client's `transport="websocket"` attach: not built yet (the blocking `Client` has it)."""
    raise NotImplementedError('transport="websocket" is in the blocking Client only, for now')

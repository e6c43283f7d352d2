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
from typing import TYPE_CHECKING, Any, NoReturn

import httpx

from ._errors import AsbxError, StreamError
from ._core import StreamState

if TYPE_CHECKING:
    from ._types import ToolAnswer
    from ._models import ClientTool
    from ._sync import Client

from ._sync import RunStream


def _connect(client: Client) -> Any:
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
    def open(cls, client: Client, message: dict[str, Any], run_id: str | None) -> SocketLines:
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


class WebSocketRunStream(RunStream):
    """A `RunStream` over `GET /api/runs/ws`."""

    def _socket(self) -> SocketLines:
        assert isinstance(self._response, SocketLines)
        return self._response

    def _reopen(self) -> Any:
        return SocketLines.open(
            self._client,
            {"type": "attach", "runId": self.run_id, "after": self._state.last_seq},
            self.run_id,
        )

    def _post_answer(self, call_id: str, payload: ToolAnswer) -> None:
        body: dict[str, Any] = {"type": "tool_result", "callId": call_id}
        crypto = self._state.crypto
        if crypto is not None:
            body["encrypted"] = crypto.seal_tool_result(call_id, dict(payload))
        else:
            body.update(payload)
        if not self._socket().send(body):
            super()._post_answer(call_id, payload)

    def cancel(self) -> bool:
        if self._socket().send({"type": "cancel"}):
            return True
        return super().cancel()


def run(client: Client, body: dict[str, Any], state: StreamState, tools: dict[str, ClientTool]) -> RunStream:
    """Dispatches `body` (of `POST /api/runs`) over a socket."""
    lines = SocketLines.open(client, {"type": "dispatch", **body}, None)
    run_id = lines.headers.get("x-asbx-run-id")
    if not run_id:
        lines.close()
        raise StreamError("no line names the run")
    return WebSocketRunStream(client, lines, run_id, state, tools)  # type: ignore[arg-type]


def events(client: Client, run_id: str, after: int, state: StreamState, tools: dict[str, ClientTool]) -> RunStream:
    """Attaches to `run_id` after `after` over a socket."""
    lines = SocketLines.open(client, {"type": "attach", "runId": run_id, "after": after}, run_id)
    return WebSocketRunStream(client, lines, run_id, state, tools)  # type: ignore[arg-type]


__all__ = ["SocketLines", "WebSocketRunStream", "run", "events"]


async def arun(client: Any, body: dict[str, Any], state: StreamState, tools: dict[str, ClientTool]) -> NoReturn:
    """The asyncio client's `transport="websocket"`: not built yet (the blocking `Client` has it)."""
    raise NotImplementedError('transport="websocket" is in the blocking Client only, for now')


async def aevents(client: Any, run_id: str, after: int, state: StreamState, tools: dict[str, ClientTool]) -> NoReturn:
    """The asyncio client's `transport="websocket"` attach: not built yet (the blocking `Client` has it)."""
    raise NotImplementedError('transport="websocket" is in the blocking Client only, for now')

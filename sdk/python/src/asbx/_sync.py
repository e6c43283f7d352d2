"""The blocking client, on `httpx.Client`.

Streams resume by themselves after a dropped connection: a run re-reads
`GET /api/runs/{id}/events?after=<last seq>`, a chat turn re-attaches to
`GET /api/assistant/chats/{id}/stream` with `Last-Event-ID` (docs/api-runs.md,
docs/api-assistant.md); lines already delivered are skipped by `seq`, so the
caller sees every line once, in order.
"""

from __future__ import annotations

import mimetypes
import os
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx

from . import _core
from ._core import SseDecoder, StreamState, check_status
from ._crypto import ClientSession
from ._errors import ConflictError, NotFoundError, ServerError, StreamError
from ._events import Delta, Event, TerminationInfo, ToolCall
from ._models import (
    Chat,
    ChatSummary,
    ClientTool,
    Environment,
    FileInfo,
    ModelInfo,
    RunInfo,
    WorkspaceEvent,
)


class _Stream(Iterator[Event]):
    """Events of one session, across reconnects. Iterate it; close it (or use `with`) to stop reading."""

    def __init__(
        self,
        client: Client,
        response: httpx.Response,
        state: StreamState,
        sse: bool,
    ) -> None:
        self._client = client
        self._response = response
        self._state = state
        self._sse = sse
        self._gen = self._events()
        self.resumes = 0
        """How many times the stream was re-opened after a dropped connection."""

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        return next(self._gen)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stops reading (the run or turn goes on; `cancel()` ends it)."""
        self._gen.close()
        self._response.close()

    @property
    def last_seq(self) -> int:
        return self._state.last_seq

    @property
    def termination(self) -> TerminationInfo | None:
        """`session_ended`'s fields, once it came."""
        return self._state.termination

    @property
    def result(self) -> str | None:
        """The `result` message, once it came."""
        return self._state.result

    def wait(self) -> list[Event]:
        """Reads to the end; returns every event."""
        return list(self)

    def text(self) -> str:
        """Reads to the end; returns the streamed text (the `result` when nothing streamed)."""
        parts = [e.text for e in self if isinstance(e, Delta)]
        return "".join(parts) or (self._state.result or "")

    def _finished(self) -> bool:
        return self._state.ended

    def _reopen(self) -> httpx.Response:
        raise NotImplementedError

    def _on_event(self, ev: Event) -> None:
        pass

    def _ended_elsewhere(self) -> bool:
        """After a stream closed cleanly without its last event: is there nothing more to read?"""
        return False

    def _read(self, resp: httpx.Response) -> Generator[Event, None, None]:
        """The new events of one response, until it ends or the session finishes."""
        if self._sse:
            dec = SseDecoder()
            for line in resp.iter_lines():
                frame = dec.feed(line)
                ev = None if frame is None else self._state.accept_sse(frame)
                if ev is not None:
                    self._on_event(ev)
                    yield ev
                    if self._finished():
                        return
        else:
            for line in resp.iter_lines():
                ev = self._state.accept_ndjson(line)
                if ev is not None:
                    self._on_event(ev)
                    yield ev
                    if self._finished():
                        return

    def _events(self) -> Generator[Event, None, None]:
        resp: httpx.Response | None = self._response
        failures = 0
        cause: Exception | None = None
        try:
            while True:
                before = self._state.seen
                if resp is not None:
                    cause = None
                    try:
                        yield from self._read(resp)
                    except httpx.TransportError as e:
                        cause = e
                    finally:
                        resp.close()
                    if self._finished() or (cause is None and self._ended_elsewhere()):
                        return
                # Reconnects in a row without a new line so far: one more is allowed
                # while fewer than max_attempts were made.
                failures = 0 if self._state.seen > before else failures + 1
                if failures >= self._client.retry.max_attempts:
                    raise StreamError(
                        f"the stream broke and {failures} reconnects made no progress (last: {cause!r})",
                        code="connection_lost",
                    ) from cause
                time.sleep(self._client.retry.delay(failures))
                self.resumes += 1
                resp = None
                try:
                    resp = self._reopen()
                except (httpx.TransportError, ServerError) as e:
                    # Reconnecting failed too: an attempt without progress.
                    cause = e
                    continue
                except NotFoundError as e:
                    if self._state.ended:
                        return
                    raise StreamError(
                        "the stream broke and the session is no longer followable "
                        f"(it ended while the stream was down; read it instead): {e.detail}",
                        status=e.status,
                        code=e.code,
                    ) from e
                self._response = resp
        finally:
            if resp is not None:
                resp.close()


class RunStream(_Stream):
    """A protocol 2 run: `SessionInit` first, `SessionEnded` last.

    Client tools with a handler are answered as their `ToolCall` arrives
    (before it is yielded); answer others with `answer()`.
    """

    def __init__(
        self,
        client: Client,
        response: httpx.Response,
        run_id: str,
        state: StreamState,
        tools: dict[str, ClientTool],
    ) -> None:
        super().__init__(client, response, state, sse=False)
        self.run_id = run_id
        self._tools = tools

    @property
    def crypto(self) -> ClientSession | None:
        return self._state.crypto

    def _reopen(self) -> httpx.Response:
        return self._client._open(
            "GET",
            f"/api/runs/{self.run_id}/events",
            params={"after": str(self._state.last_seq)},
            headers={"accept": "application/x-ndjson"},
        )

    def _ended_elsewhere(self) -> bool:
        # A replay after the last line, or a run settled without `session_ended`
        # (its runner was lost): the run's record says how it ended.
        info = self._client.get_run(self.run_id)
        if info.status == "running":
            return False
        if self._state.termination is None:
            self._state.termination = info.termination
        return True

    def _on_event(self, ev: Event) -> None:
        if not isinstance(ev, ToolCall):
            return
        tool = self._tools.get(ev.tool_name)
        if tool is None or tool.handler is None:
            return
        try:
            payload = _core.tool_payload(result=tool.handler(ev.args))
        except Exception as e:  # the tool's failure is the agent's to see
            payload = _core.tool_payload(error=f"{type(e).__name__}: {e}")
        # A dropped connection is retried; 409 means it was answered already.
        for attempt in range(4):
            try:
                self._post_answer(ev.call_id, payload)
                return
            except ConflictError:
                return
            except httpx.TransportError:
                if attempt == 3:
                    raise
                time.sleep(self._client.retry.delay(attempt))

    def answer(self, call_id: str, result: Any = None, *, error: str | None = None) -> None:
        """Answers a client tool call with `result`, or with `error`."""
        self._post_answer(call_id, _core.tool_payload(result, error))

    def _post_answer(self, call_id: str, payload: dict[str, Any]) -> None:
        self._client.answer_tool(self.run_id, call_id, payload, crypto=self._state.crypto)

    def cancel(self) -> bool:
        """Cancels the run; the stream still ends with `session_ended` (`terminated`)."""
        return self._client.cancel_run(self.run_id)


class ChatStream(_Stream):
    """One Assistant turn: `Turn` first, then the run's events, `Done` last."""

    def __init__(self, client: Client, response: httpx.Response, chat_id: str, turn_id: str | None) -> None:
        super().__init__(client, response, StreamState(), sse=True)
        self.chat_id = chat_id
        self.turn_id = turn_id

    def _finished(self) -> bool:
        return self._state.done

    def _reopen(self) -> httpx.Response:
        headers = {"accept": "text/event-stream"}
        if self._state.last_seq:
            headers["last-event-id"] = str(self._state.last_seq)
        return self._client._open("GET", f"/api/assistant/chats/{self.chat_id}/stream", headers=headers)

    def cancel(self) -> None:
        """Asks the runner to end the turn; `error` `cancelled` and `Done` still come."""
        self._client.cancel_chat(self.chat_id)


class Client:
    """A blocking client of one asbx workspace.

    `base_url` is what `asbx up` prints (default: `$ASBX_URL`); `api_key`
    (`asbx_key_...`, from `asbx key`; default: `$ASBX_API_KEY`) is sent as
    `Authorization: Bearer` when given; `headers` are added to every request.

    A dropped stream is resumed up to `max_attempts` times in a row without
    progress, `initial_delay_ms` apart at first, growing by `backoff_multiplier`
    up to `max_delay_ms`; past that it raises `StreamError` (`connection_lost`).
    A request answered 429 or 503 (or, for GET, PUT, DELETE, a dropped
    connection) is sent again up to `max_retries` times, after its `Retry-After`.
    `runner_public_key` pins the runner's identity key (`GET /v1/identity`): an
    encrypted run whose `session_init` it did not sign raises `SignatureError`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        stream_read_timeout: float = _core.STREAM_READ_TIMEOUT,
        max_attempts: int = _core.MAX_RESUMES,
        initial_delay_ms: float = 100.0,
        backoff_multiplier: float = 2.0,
        max_delay_ms: float = 2000.0,
        max_retries: int = 2,
        runner_public_key: str | None = None,
        max_resumes: int | None = None,
        http: httpx.Client | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url, api_key = _core.settings_from_env(base_url, api_key)
        self.retry = _core.RetryPolicy(
            max_attempts=max_attempts if max_resumes is None else max_resumes,
            initial_delay_ms=initial_delay_ms,
            backoff_multiplier=backoff_multiplier,
            max_delay_ms=max_delay_ms,
            max_retries=max_retries,
        )
        self.runner_public_key = runner_public_key
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self._own = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._headers = {**_core.auth_headers(api_key), **(headers or {})}

    def close(self) -> None:
        if self._own:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- plumbing ---------------------------------------------------------

    def _open(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        req = self._http.build_request(
            method,
            self.base_url + path,
            json=json,
            params=params,
            headers={**self._headers, **(headers or {})},
            timeout=self._stream_timeout,
        )
        resp = self._send(req, stream=True)
        if resp.status_code >= 400:
            body = resp.read()
            resp.close()
            check_status(resp.status_code, body)
        return resp

    @property
    def max_resumes(self) -> int:
        """The old name of `retry.max_attempts`."""
        return self.retry.max_attempts

    def _send(self, req: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Sends `req`, again after a 429 or 503 (or a dropped connection, when idempotent)."""
        n = 0
        while True:
            try:
                resp = self._http.send(req, stream=stream)
            except httpx.TransportError:
                wait = self.retry.retry_wait(req.method, None, {}, n)
                if wait is None:
                    raise
            else:
                wait = self.retry.retry_wait(req.method, resp.status_code, resp.headers, n)
                if wait is None:
                    return resp
                resp.close()
            time.sleep(wait)
            n += 1

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Any workspace route: the decoded JSON answer (None for an empty one); `AsbxError` on failure."""
        req = self._http.build_request(
            method,
            self.base_url + path,
            json=json,
            params=params,
            content=content,
            headers={**self._headers, **(headers or {})},
        )
        resp = self._send(req)
        check_status(resp.status_code, resp.content)
        if not resp.content:
            return None
        if "json" in resp.headers.get("content-type", ""):
            return resp.json()
        return resp.content

    # -- chats ------------------------------------------------------------

    def chat(
        self,
        message: str,
        chat_id: str | None = None,
        attachments: Iterable[str | FileInfo] | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> ChatStream:
        """Runs one Assistant turn (a new chat without `chat_id`); iterate the result for its events.

        The request is sent now: a turn already in flight on the chat raises
        `TurnInFlightError` here, and `.chat_id`/`.turn_id` are set at once.
        """
        resp = self._open(
            "POST",
            "/api/assistant/chat/stream",
            json=_core.chat_body(message, chat_id, attachments, settings),
            headers={"accept": "text/event-stream"},
        )
        return ChatStream(
            self, resp, resp.headers.get("x-asbx-chat-id", chat_id or ""), resp.headers.get("x-asbx-turn-id")
        )

    def resume_chat(self, chat_id: str, after: int = 0) -> ChatStream:
        """Re-attaches to a chat's turn in flight, after `seq` `after` (`NotFoundError` when none is)."""
        headers = {"accept": "text/event-stream"}
        if after:
            headers["last-event-id"] = str(after)
        resp = self._open("GET", f"/api/assistant/chats/{chat_id}/stream", headers=headers)
        stream = ChatStream(self, resp, chat_id, None)
        stream._state.last_seq = after
        return stream

    def cancel_chat(self, chat_id: str) -> None:
        self.request("POST", f"/api/assistant/chats/{chat_id}/cancel")

    def list_chats(self) -> list[ChatSummary]:
        return [ChatSummary.from_json(c) for c in self.request("GET", "/api/assistant/chats") or []]

    def get_chat(self, chat_id: str, *, limit: int | None = None, before: str | None = None) -> Chat:
        """The thread (the newest `limit` messages before the cursor `before`, where paged) and the bag."""
        params = _core.chat_params(limit, before)
        return Chat.from_json(self.request("GET", f"/api/assistant/chats/{chat_id}", params=params))

    def delete_chat(self, chat_id: str) -> None:
        self.request("DELETE", f"/api/assistant/chats/{chat_id}")

    def upload_file(
        self,
        data: bytes | str | os.PathLike[str] | IO[bytes],
        name: str | None = None,
        *,
        mime_type: str | None = None,
        chat_id: str | None = None,
    ) -> FileInfo:
        """Uploads an attachment (at most 16 MiB): bytes, a path, or a binary file object."""
        content, name = _read_upload(data, name)
        params = {"name": name}
        if chat_id:
            params["chatId"] = chat_id
        mime = mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return FileInfo.from_json(
            self.request(
                "POST", "/api/assistant/files", params=params, content=content, headers={"content-type": mime}
            )
        )

    def download_file(self, file_id: str) -> bytes:
        url = f"{self.base_url}/api/files/{file_id}"
        resp = self._send(self._http.build_request("GET", url, headers=self._headers))
        check_status(resp.status_code, resp.content)
        return resp.content

    # -- runs -------------------------------------------------------------

    def run(
        self,
        prompt: str,
        *,
        tools: Sequence[ClientTool] | Mapping[str, ClientTool | Callable[[Any], Any]] | None = None,
        encrypt: bool = False,
        agent_id: str | None = None,
        filter_types: Sequence[str] | None = None,
        blocked_types: Sequence[str] | None = None,
        environment: str | None = None,
        extra: Mapping[str, Any] | None = None,
        transport: str = "http",
    ) -> RunStream:
        """Starts a protocol 2 run (`POST /api/runs`, or a stored agent's); iterate it for its events.

        `transport="websocket"` streams over `GET /api/runs/ws` (needs `asbx[websocket]`)."""
        tool_map = _core.normalize_tools(tools)
        crypto = ClientSession(self.runner_public_key) if encrypt else None
        body = _core.run_body(prompt, tool_map, crypto, filter_types, blocked_types, environment, extra)
        if transport == "websocket" and agent_id is None:
            from . import _ws

            return _ws.run(self, body, StreamState(crypto=crypto), tool_map)
        path = f"/api/agents/{agent_id}/runs" if agent_id else "/api/runs"
        resp = self._open("POST", path, json=body, headers={"accept": "application/x-ndjson"})
        run_id = resp.headers.get("x-asbx-run-id")
        if not run_id:
            resp.close()
            raise StreamError("the answer has no x-asbx-run-id")
        return RunStream(self, resp, run_id, StreamState(crypto=crypto), tool_map)

    def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        tools: Sequence[ClientTool] | Mapping[str, Any] | None = None,
        crypto: ClientSession | None = None,
        transport: str = "http",
    ) -> RunStream:
        """Replays a run's lines after `seq` `after`, then follows it (`crypto`: an encrypted run's key)."""
        if transport == "websocket":
            from . import _ws

            state = StreamState(crypto=crypto, last_seq=after)
            return _ws.events(self, run_id, after, state, _core.normalize_tools(tools))
        resp = self._open(
            "GET",
            f"/api/runs/{run_id}/events",
            params={"after": str(after)},
            headers={"accept": "application/x-ndjson"},
        )
        state = StreamState(crypto=crypto, last_seq=after)
        return RunStream(self, resp, run_id, state, _core.normalize_tools(tools))

    def get_run(self, run_id: str) -> RunInfo:
        return RunInfo.from_json(self.request("GET", f"/api/runs/{run_id}"))

    def cancel_run(self, run_id: str) -> bool:
        """Cancels a run: True while it ends (202), False when it had already ended (204)."""
        url = f"{self.base_url}/api/runs/{run_id}"
        resp = self._send(self._http.build_request("DELETE", url, headers=self._headers))
        check_status(resp.status_code, resp.content)
        return resp.status_code == 202

    def answer_tool(
        self, run_id: str, call_id: str, payload: dict[str, Any], *, crypto: ClientSession | None = None
    ) -> None:
        """Posts `{"result": ..}` or `{"error": ..}` for a client tool call (sealed when `crypto`)."""
        body: dict[str, Any] = {"callId": call_id}
        if crypto is not None:
            body["encrypted"] = crypto.seal_tool_result(call_id, payload)
        else:
            body.update(payload)
        self.request("POST", f"/api/runs/{run_id}/tool-result", json=body)

    # -- stored agents (docs/api-agents.md) --------------------------------

    def create_agent(self, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Stores an agent (`name`, `systemPrompt`, `model`, `skills`, `environment`, `limits`...)."""
        out: dict[str, Any] = self.request("POST", "/api/agents", json=dict(definition))
        return out

    def get_agent(self, agent_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.request("GET", f"/api/agents/{agent_id}")
        return out

    def list_agents(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = (self.request("GET", "/api/agents") or {}).get("agents", [])
        return out

    def update_agent(self, agent_id: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Replaces the definition whole."""
        out: dict[str, Any] = self.request("PUT", f"/api/agents/{agent_id}", json=dict(definition))
        return out

    def delete_agent(self, agent_id: str) -> None:
        self.request("DELETE", f"/api/agents/{agent_id}")

    # -- environments, models, chat settings (docs/api-assistant.md) -------

    def list_models(self) -> list[ModelInfo]:
        return [ModelInfo.from_json(m) for m in (self.request("GET", "/api/models") or {}).get("models", [])]

    def list_environments(self) -> list[Environment]:
        body = self.request("GET", "/api/environments") or {}
        return [Environment.from_json(e) for e in body.get("environments", [])]

    def create_environment(
        self,
        name: str,
        *,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        setup_script: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> Environment:
        """A named environment; its secrets are set in the sandbox and never answered back."""
        body = _core.environment_body(name, variables, secrets, setup_script, allowed_hosts)
        return Environment.from_json(self.request("POST", "/api/environments", json=body))

    def get_environment(self, environment_id: str) -> Environment:
        return Environment.from_json(self.request("GET", f"/api/environments/{environment_id}"))

    def replace_environment(
        self,
        environment_id: str,
        name: str,
        *,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str | None] | None = None,
        setup_script: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> Environment:
        """Replaces everything but the secrets; `secrets`: None keeps them all, a name set to
        None deletes that one, to a string sets it."""
        body = _core.environment_body(name, variables, secrets, setup_script, allowed_hosts)
        return Environment.from_json(self.request("PUT", f"/api/environments/{environment_id}", json=body))

    def delete_environment(self, environment_id: str) -> None:
        self.request("DELETE", f"/api/environments/{environment_id}")

    def update_chat_settings(self, chat_id: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Stores a chat's settings (`model`, `systemPrompt`, `environmentId`, `skills`,
        `mcpServers`); answers them with `effective`."""
        out: dict[str, Any] = self.request(
            "PUT", f"/api/assistant/chats/{chat_id}/settings", json=dict(settings)
        )
        return out

    def workspace_events(self) -> Iterator[WorkspaceEvent]:
        """Follows `GET /api/assistant/events` (chats starting and ending turns, deleted,
        updated) until closed; re-connects after a dropped connection. Subscribed when it
        returns (a missing route raises here)."""
        first = self._open("GET", "/api/assistant/events", headers={"accept": "text/event-stream"})
        return self._workspace_events(first)

    def _workspace_events(self, resp: httpx.Response | None) -> Generator[WorkspaceEvent, None, None]:
        failures = 0
        while True:
            try:
                if resp is None:
                    resp = self._open("GET", "/api/assistant/events", headers={"accept": "text/event-stream"})
                try:
                    dec = SseDecoder()
                    for line in resp.iter_lines():
                        failures = 0  # a heartbeat comment counts: the stream is alive
                        frame = dec.feed(line)
                        if frame is not None and frame[0] == "chat":
                            yield WorkspaceEvent.from_json(_core.frame_json(frame))
                finally:
                    resp.close()
                    resp = None
            except httpx.TransportError:
                failures += 1
                if failures > self.retry.max_attempts:
                    raise
                time.sleep(self.retry.delay(failures - 1))


def _read_upload(data: bytes | str | os.PathLike[str] | IO[bytes], name: str | None) -> tuple[bytes, str]:
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


__all__ = ["ChatStream", "Client", "RunStream"]

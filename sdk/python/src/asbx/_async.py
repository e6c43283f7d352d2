"""The asyncio client, on `httpx.AsyncClient`: the API of `Client`, awaited.

Streams are async iterators and resume by themselves after a dropped
connection exactly as the blocking ones do (see `_sync`). Client tool
handlers may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import inspect
import mimetypes
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
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
from ._sync import _read_upload


class _AsyncStream(AsyncIterator[Event]):
    """Events of one session, across reconnects. `async for` it; `aclose()` or `async with` stops."""

    def __init__(self, client: AsyncClient, response: httpx.Response, state: StreamState, sse: bool) -> None:
        self._client = client
        self._response = response
        self._state = state
        self._sse = sse
        self._gen = self._events()
        self.resumes = 0

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        return await self._gen.__anext__()

    async def __aenter__(self) -> _AsyncStream:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._gen.aclose()
        await self._response.aclose()

    @property
    def last_seq(self) -> int:
        return self._state.last_seq

    @property
    def termination(self) -> TerminationInfo | None:
        return self._state.termination

    @property
    def result(self) -> str | None:
        return self._state.result

    async def wait(self) -> list[Event]:
        return [e async for e in self]

    async def text(self) -> str:
        parts = [e.text async for e in self if isinstance(e, Delta)]
        return "".join(parts) or (self._state.result or "")

    def _finished(self) -> bool:
        return self._state.ended

    async def _reopen(self) -> httpx.Response:
        raise NotImplementedError

    async def _on_event(self, ev: Event) -> None:
        pass

    async def _ended_elsewhere(self) -> bool:
        """After a stream closed cleanly without its last event: is there nothing more to read?"""
        return False

    async def _events(self) -> AsyncGenerator[Event, None]:
        resp: httpx.Response | None = self._response
        failures = 0
        cause: Exception | None = None
        try:
            while True:
                before = self._state.seen
                if resp is not None:
                    cause = None
                    try:
                        dec = SseDecoder()
                        async for line in resp.aiter_lines():
                            if self._sse:
                                frame = dec.feed(line)
                                ev = None if frame is None else self._state.accept_sse(frame)
                            else:
                                ev = self._state.accept_ndjson(line)
                            if ev is None:
                                continue
                            await self._on_event(ev)
                            yield ev
                            if self._finished():
                                return
                    except httpx.TransportError as e:
                        cause = e
                    finally:
                        await resp.aclose()
                    if self._finished() or (cause is None and await self._ended_elsewhere()):
                        return
                # Reconnects in a row without a new line so far: one more is allowed
                # while fewer than max_attempts were made.
                failures = 0 if self._state.seen > before else failures + 1
                if failures >= self._client.retry.max_attempts:
                    raise StreamError(
                        f"the stream broke and {failures} reconnects made no progress (last: {cause!r})",
                        code="connection_lost",
                    ) from cause
                await asyncio.sleep(self._client.retry.delay(failures))
                self.resumes += 1
                resp = None
                try:
                    resp = await self._reopen()
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
                await resp.aclose()


class AsyncRunStream(_AsyncStream):
    """A protocol 2 run (see `RunStream`)."""

    def __init__(
        self,
        client: AsyncClient,
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

    async def _reopen(self) -> httpx.Response:
        return await self._client._open(
            "GET",
            f"/api/runs/{self.run_id}/events",
            params={"after": str(self._state.last_seq)},
            headers={"accept": "application/x-ndjson"},
        )

    async def _ended_elsewhere(self) -> bool:
        # A replay after the last line, or a run settled without `session_ended`
        # (its runner was lost): the run's record says how it ended.
        info = await self._client.get_run(self.run_id)
        if info.status == "running":
            return False
        if self._state.termination is None:
            self._state.termination = info.termination
        return True

    async def _on_event(self, ev: Event) -> None:
        if not isinstance(ev, ToolCall):
            return
        tool = self._tools.get(ev.tool_name)
        if tool is None or tool.handler is None:
            return
        try:
            out = tool.handler(ev.args)
            if inspect.isawaitable(out):
                out = await out
            payload = _core.tool_payload(result=out)
        except Exception as e:  # the tool's failure is the agent's to see
            payload = _core.tool_payload(error=f"{type(e).__name__}: {e}")
        # A dropped connection is retried; 409 means it was answered already.
        for attempt in range(4):
            try:
                await self._client.answer_tool(self.run_id, ev.call_id, payload, crypto=self._state.crypto)
                return
            except ConflictError:
                return
            except httpx.TransportError:
                if attempt == 3:
                    raise
                await asyncio.sleep(self._client.retry.delay(attempt))

    async def answer(self, call_id: str, result: Any = None, *, error: str | None = None) -> None:
        await self._client.answer_tool(
            self.run_id, call_id, _core.tool_payload(result, error), crypto=self._state.crypto
        )

    async def cancel(self) -> bool:
        return await self._client.cancel_run(self.run_id)


class AsyncChatStream(_AsyncStream):
    """One Assistant turn (see `ChatStream`)."""

    def __init__(
        self, client: AsyncClient, response: httpx.Response, chat_id: str, turn_id: str | None
    ) -> None:
        super().__init__(client, response, StreamState(), sse=True)
        self.chat_id = chat_id
        self.turn_id = turn_id

    def _finished(self) -> bool:
        return self._state.done

    async def _reopen(self) -> httpx.Response:
        headers = {"accept": "text/event-stream"}
        if self._state.last_seq:
            headers["last-event-id"] = str(self._state.last_seq)
        return await self._client._open("GET", f"/api/assistant/chats/{self.chat_id}/stream", headers=headers)

    async def cancel(self) -> None:
        await self._client.cancel_chat(self.chat_id)


class AsyncClient:
    """An asyncio client of one asbx workspace (see `Client`: the same settings)."""

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
        http: httpx.AsyncClient | None = None,
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
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._headers = {**_core.auth_headers(api_key), **(headers or {})}

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @property
    def max_resumes(self) -> int:
        """The old name of `retry.max_attempts`."""
        return self.retry.max_attempts

    async def _send(self, req: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """Sends `req`, again after a 429 or 503 (or a dropped connection, when idempotent)."""
        n = 0
        while True:
            try:
                resp = await self._http.send(req, stream=stream)
            except httpx.TransportError:
                wait = self.retry.retry_wait(req.method, None, {}, n)
                if wait is None:
                    raise
            else:
                wait = self.retry.retry_wait(req.method, resp.status_code, resp.headers, n)
                if wait is None:
                    return resp
                await resp.aclose()
            await asyncio.sleep(wait)
            n += 1

    async def _open(
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
        resp = await self._send(req, stream=True)
        if resp.status_code >= 400:
            body = await resp.aread()
            await resp.aclose()
            check_status(resp.status_code, body)
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        req = self._http.build_request(
            method,
            self.base_url + path,
            json=json,
            params=params,
            content=content,
            headers={**self._headers, **(headers or {})},
        )
        resp = await self._send(req)
        check_status(resp.status_code, resp.content)
        if not resp.content:
            return None
        if "json" in resp.headers.get("content-type", ""):
            return resp.json()
        return resp.content

    async def chat(
        self,
        message: str,
        chat_id: str | None = None,
        attachments: Iterable[str | FileInfo] | None = None,
        *,
        settings: Mapping[str, Any] | None = None,
    ) -> AsyncChatStream:
        resp = await self._open(
            "POST",
            "/api/assistant/chat/stream",
            json=_core.chat_body(message, chat_id, attachments, settings),
            headers={"accept": "text/event-stream"},
        )
        return AsyncChatStream(
            self, resp, resp.headers.get("x-asbx-chat-id", chat_id or ""), resp.headers.get("x-asbx-turn-id")
        )

    async def resume_chat(self, chat_id: str, after: int = 0) -> AsyncChatStream:
        headers = {"accept": "text/event-stream"}
        if after:
            headers["last-event-id"] = str(after)
        resp = await self._open("GET", f"/api/assistant/chats/{chat_id}/stream", headers=headers)
        stream = AsyncChatStream(self, resp, chat_id, None)
        stream._state.last_seq = after
        return stream

    async def cancel_chat(self, chat_id: str) -> None:
        await self.request("POST", f"/api/assistant/chats/{chat_id}/cancel")

    async def list_chats(self) -> list[ChatSummary]:
        return [ChatSummary.from_json(c) for c in await self.request("GET", "/api/assistant/chats") or []]

    async def get_chat(self, chat_id: str, *, limit: int | None = None, before: str | None = None) -> Chat:
        params = _core.chat_params(limit, before)
        return Chat.from_json(await self.request("GET", f"/api/assistant/chats/{chat_id}", params=params))

    async def delete_chat(self, chat_id: str) -> None:
        await self.request("DELETE", f"/api/assistant/chats/{chat_id}")

    async def upload_file(
        self,
        data: bytes | str | os.PathLike[str] | IO[bytes],
        name: str | None = None,
        *,
        mime_type: str | None = None,
        chat_id: str | None = None,
    ) -> FileInfo:
        content, name = _read_upload(data, name)
        params = {"name": name}
        if chat_id:
            params["chatId"] = chat_id
        mime = mime_type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return FileInfo.from_json(
            await self.request(
                "POST", "/api/assistant/files", params=params, content=content, headers={"content-type": mime}
            )
        )

    async def download_file(self, file_id: str) -> bytes:
        url = f"{self.base_url}/api/files/{file_id}"
        resp = await self._send(self._http.build_request("GET", url, headers=self._headers))
        check_status(resp.status_code, resp.content)
        return resp.content

    async def run(
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
    ) -> AsyncRunStream:
        tool_map = _core.normalize_tools(tools)
        crypto = ClientSession(self.runner_public_key) if encrypt else None
        body = _core.run_body(prompt, tool_map, crypto, filter_types, blocked_types, environment, extra)
        path = f"/api/agents/{agent_id}/runs" if agent_id else "/api/runs"
        resp = await self._open("POST", path, json=body, headers={"accept": "application/x-ndjson"})
        run_id = resp.headers.get("x-asbx-run-id")
        if not run_id:
            await resp.aclose()
            raise StreamError("the answer has no x-asbx-run-id")
        return AsyncRunStream(self, resp, run_id, StreamState(crypto=crypto), tool_map)

    async def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        tools: Sequence[ClientTool] | Mapping[str, Any] | None = None,
        crypto: ClientSession | None = None,
    ) -> AsyncRunStream:
        resp = await self._open(
            "GET",
            f"/api/runs/{run_id}/events",
            params={"after": str(after)},
            headers={"accept": "application/x-ndjson"},
        )
        state = StreamState(crypto=crypto, last_seq=after)
        return AsyncRunStream(self, resp, run_id, state, _core.normalize_tools(tools))

    async def get_run(self, run_id: str) -> RunInfo:
        return RunInfo.from_json(await self.request("GET", f"/api/runs/{run_id}"))

    async def cancel_run(self, run_id: str) -> bool:
        url = f"{self.base_url}/api/runs/{run_id}"
        resp = await self._send(self._http.build_request("DELETE", url, headers=self._headers))
        check_status(resp.status_code, resp.content)
        return resp.status_code == 202

    async def answer_tool(
        self, run_id: str, call_id: str, payload: dict[str, Any], *, crypto: ClientSession | None = None
    ) -> None:
        body: dict[str, Any] = {"callId": call_id}
        if crypto is not None:
            body["encrypted"] = crypto.seal_tool_result(call_id, payload)
        else:
            body.update(payload)
        await self.request("POST", f"/api/runs/{run_id}/tool-result", json=body)

    # -- stored agents (docs/api-agents.md) --------------------------------

    async def create_agent(self, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Stores an agent (`name`, `systemPrompt`, `model`, `skills`, `environment`, `limits`...)."""
        out: dict[str, Any] = await self.request("POST", "/api/agents", json=dict(definition))
        return out

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        out: dict[str, Any] = await self.request("GET", f"/api/agents/{agent_id}")
        return out

    async def list_agents(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = (await self.request("GET", "/api/agents") or {}).get("agents", [])
        return out

    async def update_agent(self, agent_id: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Replaces the definition whole."""
        out: dict[str, Any] = await self.request("PUT", f"/api/agents/{agent_id}", json=dict(definition))
        return out

    async def delete_agent(self, agent_id: str) -> None:
        await self.request("DELETE", f"/api/agents/{agent_id}")

    # -- environments, models, chat settings (docs/api-assistant.md) -------

    async def list_models(self) -> list[ModelInfo]:
        return [
            ModelInfo.from_json(m) for m in (await self.request("GET", "/api/models") or {}).get("models", [])
        ]

    async def list_environments(self) -> list[Environment]:
        body = await self.request("GET", "/api/environments") or {}
        return [Environment.from_json(e) for e in body.get("environments", [])]

    async def create_environment(
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
        return Environment.from_json(await self.request("POST", "/api/environments", json=body))

    async def get_environment(self, environment_id: str) -> Environment:
        return Environment.from_json(await self.request("GET", f"/api/environments/{environment_id}"))

    async def replace_environment(
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
        return Environment.from_json(
            await self.request("PUT", f"/api/environments/{environment_id}", json=body)
        )

    async def delete_environment(self, environment_id: str) -> None:
        await self.request("DELETE", f"/api/environments/{environment_id}")

    async def update_chat_settings(self, chat_id: str, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Stores a chat's settings (`model`, `systemPrompt`, `environmentId`, `skills`,
        `mcpServers`); answers them with `effective`."""
        out: dict[str, Any] = await self.request(
            "PUT", f"/api/assistant/chats/{chat_id}/settings", json=dict(settings)
        )
        return out

    async def workspace_events(self) -> AsyncIterator[WorkspaceEvent]:
        """Follows `GET /api/assistant/events` (see `Client.workspace_events`); subscribed
        when it returns."""
        first = await self._open("GET", "/api/assistant/events", headers={"accept": "text/event-stream"})
        return self._workspace_events(first)

    async def _workspace_events(self, resp: httpx.Response | None) -> AsyncGenerator[WorkspaceEvent, None]:
        failures = 0
        while True:
            try:
                if resp is None:
                    resp = await self._open(
                        "GET", "/api/assistant/events", headers={"accept": "text/event-stream"}
                    )
                try:
                    dec = SseDecoder()
                    async for line in resp.aiter_lines():
                        failures = 0  # a heartbeat comment counts: the stream is alive
                        frame = dec.feed(line)
                        if frame is not None and frame[0] == "chat":
                            yield WorkspaceEvent.from_json(_core.frame_json(frame))
                finally:
                    await resp.aclose()
                    resp = None
            except httpx.TransportError:
                failures += 1
                if failures > self.retry.max_attempts:
                    raise
                await asyncio.sleep(self.retry.delay(failures - 1))

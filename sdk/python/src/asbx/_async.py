"""The asyncio client, on `httpx.AsyncClient`.

This file is the one source of both clients: `_sync.py` is generated from it
by `scripts/unasync.py` (`await` dropped, `Async` names unprefixed), and
`tests/test_generated.py` fails when the two drift.

What a route sends and how its answer is read live in `_api` (no I/O); this
file only sends.

Streams resume by themselves after a dropped connection: a run re-reads
`GET /api/runs/{id}/events?after=<last seq>`, a chat turn re-attaches to
`GET /api/assistant/chats/{id}/stream` with `Last-Event-ID` (docs/api-runs.md,
docs/api-assistant.md); lines already delivered are skipped by `seq`, so the
caller sees every line once, in order. Client tool handlers may be plain
functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect  # unasync: remove
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx

from . import _api, _core
from ._api import Answer, Call, Open, deprecated
from ._core import RunChannel, SseDecoder, StreamState, check_status
from ._crypto import ClientSession
from ._errors import ConflictError, NotFoundError, ServerError, StreamError
from ._events import Delta, Event, TerminationInfo, ToolCall
from ._models import (
    Agent,
    Chat,
    ChatSummary,
    ClientTool,
    Environment,
    FileInfo,
    ModelInfo,
    RunInfo,
    Usage,
    WorkspaceEvent,
)
from ._types import (
    AgentDefinition,
    AgentRunRequest,
    ChatSettings,
    ChatSettingsView,
    CreateRunRequest,
    McpServer,
    RunLimits,
    Skill,
    ToolAnswer,
    TurnRequest,
)
from ._unions import EventType

T = TypeVar("T")

Tools = Sequence[ClientTool] | Mapping[str, ClientTool | Callable[[Any], Any]]
Upload = bytes | str | os.PathLike[str] | IO[bytes]


class _AsyncStream(AsyncIterator[Event]):
    """Events of one session, across reconnects. Iterate it; close it (or use `with`) to stop reading."""

    def __init__(self, client: AsyncClient, response: httpx.Response, state: StreamState, sse: bool) -> None:
        self._client = client
        self._response = response
        self._state = state
        self._sse = sse
        self._gen = self._events()
        self.resumes = 0
        """How many times the stream was re-opened after a dropped connection."""

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
        """Stops reading (the run or turn goes on; `cancel()` ends it)."""
        await self._gen.aclose()
        await self._response.aclose()

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

    async def wait(self) -> list[Event]:
        """Reads to the end; returns every event."""
        return [e async for e in self]

    async def text(self) -> str:
        """Reads to the end; returns the streamed text (the `result` when nothing streamed)."""
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

    async def _read(self, resp: httpx.Response) -> AsyncGenerator[Event, None]:
        """The new events of one response, until it ends or the session finishes."""
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
                        async for ev in self._read(resp):  # noqa: UP028 (the async source has no `yield from`)
                            yield ev
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
    """A protocol 2 run: `SessionInit` first, `SessionEnded` last.

    Client tools with a handler are answered as their `ToolCall` arrives
    (before it is yielded); answer others with `answer()`.
    """

    def __init__(
        self,
        client: AsyncClient,
        response: httpx.Response,
        run_id: str,
        state: StreamState,
        tools: dict[str, ClientTool],
        *,
        channel: RunChannel | None = None,
    ) -> None:
        super().__init__(client, response, state, sse=False)
        self.run_id = run_id
        self._tools = tools
        self._channel = channel
        """The run's socket (`transport="websocket"`); None: HTTP only."""

    @property
    def crypto(self) -> ClientSession | None:
        return self._state.crypto

    async def _reopen(self) -> httpx.Response:
        if self._channel is not None:
            # A socket, read like the NDJSON response.
            socket: httpx.Response = self._channel.reopen(self.run_id, self._state.last_seq)
            return socket
        return await self._client._start(_api.open_run_events(self.run_id, self._state.last_seq))

    async def _ended_elsewhere(self) -> bool:
        # A replay after the last line, or a run settled without `session_ended`
        # (its runner was lost): the run's record says how it ended.
        info = await self._client.runs.get(self.run_id)
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
            if inspect.isawaitable(out):  # unasync: remove
                out = await out  # unasync: remove
            answer = _api.tool_answer(result=out)
        except Exception as e:  # the tool's failure is the agent's to see
            answer = _api.tool_answer(error=f"{type(e).__name__}: {e}")
        # A dropped connection is retried; 409 means it was answered already.
        for attempt in range(4):
            try:
                await self._post_answer(ev.call_id, answer)
                return
            except ConflictError:
                return
            except httpx.TransportError:
                if attempt == 3:
                    raise
                await asyncio.sleep(self._client.retry.delay(attempt))

    async def answer(self, call_id: str, result: Any = None, *, error: str | None = None) -> None:
        """Answers a client tool call with `result`, or with `error`."""
        await self._post_answer(call_id, _api.tool_answer(result, error))

    async def _post_answer(self, call_id: str, answer: ToolAnswer) -> None:
        if self._channel is not None and self._channel.answer(call_id, answer, self._state.crypto):
            return
        await self._client._call(_api.tool_result(self.run_id, call_id, answer, self._state.crypto))

    async def cancel(self) -> bool:
        """Cancels the run; the stream still ends with `session_ended` (`terminated`)."""
        if self._channel is not None and self._channel.cancel():
            return True
        return await self._client.runs.cancel(self.run_id)


class AsyncChatStream(_AsyncStream):
    """One Assistant turn: `Turn` first, then the run's events, `Done` last."""

    def __init__(
        self, client: AsyncClient, response: httpx.Response, chat_id: str, turn_id: str | None
    ) -> None:
        super().__init__(client, response, StreamState(), sse=True)
        self.chat_id = chat_id
        self.turn_id = turn_id

    def _finished(self) -> bool:
        return self._state.done

    async def _reopen(self) -> httpx.Response:
        return await self._client._start(_api.open_chat_stream(self.chat_id, self._state.last_seq))

    async def cancel(self) -> None:
        """Asks the runner to end the turn; `error` `cancelled` and `Done` still come."""
        await self._client.chats.cancel(self.chat_id)


class AsyncChats:
    """The Assistant's chats (`/api/assistant`, docs/api-assistant.md): `client.chats`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        message: str,
        *,
        attachments: Iterable[str | FileInfo] | None = None,
        settings: ChatSettings | None = None,
    ) -> AsyncChatStream:
        """Starts a new chat with its first turn; iterate the result for its events."""
        return await self._client._turn(_api.turn_body(message, None, attachments, settings))

    async def send(
        self, chat_id: str, message: str, *, attachments: Iterable[str | FileInfo] | None = None
    ) -> AsyncChatStream:
        """Runs one more turn of a chat (`TurnInFlightError` while one is in flight)."""
        return await self._client._turn(_api.turn_body(message, chat_id, attachments, None))

    async def resume(self, chat_id: str, after: int = 0) -> AsyncChatStream:
        """Re-attaches to a chat's turn in flight, after `seq` `after` (`NotFoundError` when none is)."""
        resp = await self._client._start(_api.open_chat_stream(chat_id, after))
        stream = AsyncChatStream(self._client, resp, chat_id, None)
        stream._state.last_seq = after
        return stream

    async def list(self) -> builtins.list[ChatSummary]:
        """Newest first."""
        return await self._client._call(_api.list_chats())

    async def get(self, chat_id: str, *, limit: int | None = None, before: str | None = None) -> Chat:
        """The thread (the newest `limit` messages before the cursor `before`, where paged) and the bag."""
        return await self._client._call(_api.get_chat(chat_id, limit, before))

    async def delete(self, chat_id: str) -> None:
        """Deletes a chat (a turn in flight is cancelled)."""
        await self._client._call(_api.delete_chat(chat_id))

    async def cancel(self, chat_id: str) -> None:
        """Asks the runner to end the chat's turn in flight."""
        await self._client._call(_api.cancel_chat(chat_id))

    async def fork(self, chat_id: str, after_message_id: str) -> str:
        """A new chat with the history up to an assistant message and the working directory its turn left; its id."""
        return await self._client._call(_api.fork_chat(chat_id, after_message_id))

    async def workdir_tar(self, chat_id: str, after_message_id: str | None = None) -> bytes:
        """The chat's kept working directory as a tar archive (the latest, or as an assistant message's turn left it)."""
        return await self._client._call(_api.chat_workdir_tar(chat_id, after_message_id))

    async def update_settings(self, chat_id: str, settings: ChatSettings) -> ChatSettingsView:
        """Stores a chat's settings; answers them with `effective`."""
        return await self._client._call(_api.update_chat_settings(chat_id, settings))


class AsyncFiles:
    """Files: attachments uploaded to a chat's bag, and what runs wrote: `client.files`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def upload(
        self,
        data: Upload,
        name: str | None = None,
        *,
        mime_type: str | None = None,
        chat_id: str | None = None,
    ) -> FileInfo:
        """Uploads an attachment (at most 16 MiB): bytes, a path, or a binary file object."""
        return await self._client._call(_api.upload_file(data, name, mime_type, chat_id))

    async def download(self, file_id: str) -> bytes:
        return await self._client._call(_api.download_file(file_id))

    async def delete(self, file_id: str) -> None:
        await self._client._call(_api.delete_file(file_id))


class AsyncRuns:
    """Protocol 2 runs (`/api/runs`, docs/api-runs.md): `client.runs`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(
        self,
        prompt: str,
        *,
        tools: Tools | None = None,
        encrypt: bool = False,
        agent_id: str | None = None,
        filter_types: Sequence[EventType | str] | None = None,
        blocked_types: Sequence[EventType | str] | None = None,
        environment: str | None = None,
        model: str | None = None,
        system_prompt: str | None = None,
        setup_script: str | None = None,
        variables: Mapping[str, str] | None = None,
        allowed_hosts: Sequence[str] | None = None,
        limits: RunLimits | None = None,
        skills: Sequence[Skill] | None = None,
        mcp_servers: Sequence[McpServer] | None = None,
        workdir_from: str | None = None,
        workdir_after_message_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        transport: str = "http",
    ) -> AsyncRunStream:
        """Starts a protocol 2 run (`POST /api/runs`, or a stored agent's with `agent_id`);
        iterate the result for its events. `transport="websocket"` streams it over
        `GET /api/runs/ws` (the blocking client only; needs `asbx[websocket]`).
        `workdir_from`: a chat id whose kept working directory the sandbox starts with
        (its latest, or `workdir_after_message_id`'s turn's); the run keeps nothing back."""
        body = _api.run_body(
            prompt,
            model=model,
            system_prompt=system_prompt,
            setup_script=setup_script,
            variables=variables,
            allowed_hosts=allowed_hosts,
            limits=limits,
            skills=skills,
            mcp_servers=mcp_servers,
            environment=environment,
            workdir_from=workdir_from,
            workdir_after_message_id=workdir_after_message_id,
        )
        return await self._client._run(
            body,
            tools,
            encrypt,
            filter_types,
            blocked_types,
            agent_id=agent_id,
            extra=extra,
            transport=transport,
        )

    async def attach(
        self,
        run_id: str,
        after: int = 0,
        *,
        tools: Tools | None = None,
        crypto: ClientSession | None = None,
        transport: str = "http",
    ) -> AsyncRunStream:
        """Replays a run's lines after `seq` `after`, then follows it (`crypto`: an encrypted run's key)."""
        if transport == "websocket":
            from . import _ws

            state = StreamState(crypto=crypto, last_seq=after)
            channel = await _ws.aopen_events(self._client, run_id, after)
            lines: Any = channel.lines  # read like the NDJSON response
            return AsyncRunStream(self._client, lines, run_id, state, _api.normalize_tools(tools), channel=channel)
        resp = await self._client._start(_api.open_run_events(run_id, after))
        state = StreamState(crypto=crypto, last_seq=after)
        return AsyncRunStream(self._client, resp, run_id, state, _api.normalize_tools(tools))

    async def get(self, run_id: str) -> RunInfo:
        """Status, result or error, and `termination` once ended."""
        return await self._client._call(_api.get_run(run_id))

    async def cancel(self, run_id: str) -> bool:
        """Cancels a run: True while it ends (202), False when it had already ended (204)."""
        return await self._client._call(_api.cancel_run(run_id))

    async def tool_result(
        self,
        run_id: str,
        call_id: str,
        result: Any = None,
        *,
        error: str | None = None,
        crypto: ClientSession | None = None,
    ) -> None:
        """Answers a client tool call with `result` or `error` (sealed with `crypto` when encrypted)."""
        await self._client._call(_api.tool_result(run_id, call_id, _api.tool_answer(result, error), crypto))


class AsyncAgents:
    """Stored agents (`/api/agents`, docs/api-agents.md): `client.agents`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def create(self, definition: AgentDefinition) -> Agent:
        """Stores an agent (`name`, `systemPrompt`, `model`, `skills`, `environment`, `limits`...)."""
        return await self._client._call(_api.create_agent(definition))

    async def list(self) -> builtins.list[Agent]:
        return await self._client._call(_api.list_agents())

    async def get(self, agent_id: str) -> Agent:
        return await self._client._call(_api.get_agent(agent_id))

    async def update(self, agent_id: str, definition: AgentDefinition) -> Agent:
        """Replaces the definition whole."""
        return await self._client._call(_api.update_agent(agent_id, definition))

    async def delete(self, agent_id: str) -> None:
        await self._client._call(_api.delete_agent(agent_id))

    async def run(
        self,
        agent_id: str,
        prompt: str,
        *,
        tools: Tools | None = None,
        encrypt: bool = False,
        filter_types: Sequence[EventType | str] | None = None,
        blocked_types: Sequence[EventType | str] | None = None,
        sandbox_url: str | None = None,
    ) -> AsyncRunStream:
        """Runs the stored agent on `prompt` (`POST /api/agents/{id}/runs`); `sandbox_url`: one of
        the operator's runners, before the agent environment's and the server's."""
        body: AgentRunRequest = {"prompt": prompt}
        if sandbox_url is not None:
            body["sandboxUrl"] = sandbox_url
        return await self._client._run(body, tools, encrypt, filter_types, blocked_types, agent_id=agent_id)


class AsyncEnvironments:
    """Named environments (`/api/environments`): `client.environments`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> builtins.list[Environment]:
        return await self._client._call(_api.list_environments())

    async def get(self, environment_id: str) -> Environment:
        return await self._client._call(_api.get_environment(environment_id))

    async def create(
        self,
        name: str,
        *,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        setup_script: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> Environment:
        """A named environment; its secrets are set in the sandbox and never answered back
        (a second live environment of the same name is `ConflictError`)."""
        body = _api.environment_body(name, variables, secrets, setup_script, allowed_hosts)
        return await self._client._call(_api.create_environment(body))

    async def update(
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
        body = _api.environment_body(name, variables, secrets, setup_script, allowed_hosts)
        return await self._client._call(_api.update_environment(environment_id, body))

    async def delete(self, environment_id: str) -> None:
        await self._client._call(_api.delete_environment(environment_id))


class AsyncModels:
    """`client.models.list()`: the models a chat or run can name (`provider:model`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self) -> builtins.list[ModelInfo]:
        return await self._client._call(_api.list_models())


class AsyncUsageApi:
    """`client.usage.get()`: the workspace's quotas and usage (`GET /api/usage`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def get(self) -> Usage:
        return await self._client._call(_api.get_usage())


class AsyncAudit:
    """The workspace's tamper-evident audit log (docs/api-audit.md): `client.audit`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def list(self, after: int = 0, limit: int | None = None) -> builtins.list[dict[str, Any]]:
        """The workspace's records with `id` above `after`, oldest first (at most `limit`)."""
        return await self._client._call(_api.list_audit(after, limit))

    async def of_run(self, run_id: str, after: int = 0, limit: int | None = None) -> builtins.list[dict[str, Any]]:
        """One run's records, oldest first."""
        return await self._client._call(_api.list_audit(after, limit, run_id))


class AsyncClient:
    """A client of one asbx workspace: `client.chats`, `client.runs`, `client.agents`,
    `client.environments`, `client.files`, `client.models`, `client.usage`.

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
        self.chats = AsyncChats(self)
        self.files = AsyncFiles(self)
        self.runs = AsyncRuns(self)
        self.agents = AsyncAgents(self)
        self.environments = AsyncEnvironments(self)
        self.models = AsyncModels(self)
        self.usage = AsyncUsageApi(self)
        self.audit = AsyncAudit(self)

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

    # -- the transport: sends what `_api` builds --------------------------

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

    async def _call(self, call: Call[T]) -> T:
        """Sends one `_api` call; its answer, parsed (an `AsbxError` for an error status)."""
        req = self._http.build_request(
            call.method,
            self.base_url + call.path,
            json=call.json,
            params=call.params,
            content=call.content,
            headers={**self._headers, **call.headers},
        )
        resp = await self._send(req)
        return call.parse(Answer(resp.status_code, resp.headers, resp.content))

    async def _start(self, op: Open) -> httpx.Response:
        """Opens a stream; an error status raises before any line is read."""
        return await self._open(op.method, op.path, json=op.json, params=op.params, headers=op.headers)

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

    async def _run(
        self,
        body: CreateRunRequest | AgentRunRequest,
        tools: Tools | None,
        encrypt: bool,
        filter_types: Sequence[EventType | str] | None,
        blocked_types: Sequence[EventType | str] | None,
        *,
        agent_id: str | None = None,
        extra: Mapping[str, Any] | None = None,
        transport: str = "http",
    ) -> AsyncRunStream:
        """Starts a run (a stored agent's with `agent_id`) and follows its lines."""
        tool_map = _api.normalize_tools(tools)
        crypto = ClientSession(self.runner_public_key) if encrypt else None
        _api.run_options(body, tool_map, crypto, filter_types, blocked_types)
        if extra:
            body.update(extra)  # type: ignore[typeddict-item]
        if transport == "websocket" and agent_id is None:
            from . import _ws

            channel, ws_run_id = await _ws.aopen_run(self, dict(body))
            lines: Any = channel.lines  # read like the NDJSON response
            return AsyncRunStream(self, lines, ws_run_id, StreamState(crypto=crypto), tool_map, channel=channel)
        resp = await self._start(_api.open_run(body, agent_id))
        run_id = resp.headers.get("x-asbx-run-id")
        if not run_id:
            await resp.aclose()
            raise StreamError("the answer has no x-asbx-run-id")
        return AsyncRunStream(self, resp, run_id, StreamState(crypto=crypto), tool_map)

    async def _turn(self, body: TurnRequest) -> AsyncChatStream:
        """Sends one chat turn and follows its events."""
        resp = await self._start(_api.open_turn(body))
        chat_id = resp.headers.get("x-asbx-chat-id", body.get("chatId") or "")
        return AsyncChatStream(self, resp, chat_id, resp.headers.get("x-asbx-turn-id"))

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
        """Any workspace route: the decoded JSON answer (None for an empty one); `AsbxError` on failure."""
        call = Call(
            method, path, Answer.json, dict(params) if params else None, json, content, dict(headers or {})
        )
        return await self._call(call)

    # -- what has no namespace ----------------------------------------------

    async def chat(
        self,
        message: str,
        chat_id: str | None = None,
        attachments: Iterable[str | FileInfo] | None = None,
        *,
        settings: ChatSettings | None = None,
    ) -> AsyncChatStream:
        """Runs one Assistant turn (a new chat without `chat_id`); iterate the result for its events.

        The request is sent now: a turn already in flight on the chat raises
        `TurnInFlightError` here, and `.chat_id`/`.turn_id` are set at once.
        """
        return await self._turn(_api.turn_body(message, chat_id, attachments, settings))

    async def workspace_events(self) -> AsyncIterator[WorkspaceEvent]:
        """Follows `GET /api/assistant/events` (chats starting and ending turns, deleted,
        updated) until closed; re-connects after a dropped connection. Subscribed when it
        returns (a missing route raises here)."""
        first = await self._start(_api.open_workspace_events())
        return self._workspace_events(first)

    async def _workspace_events(self, resp: httpx.Response | None) -> AsyncGenerator[WorkspaceEvent, None]:
        failures = 0
        while True:
            try:
                if resp is None:
                    resp = await self._start(_api.open_workspace_events())
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

    # -- the flat methods of 0.1, kept as deprecated aliases -------------------

    async def run(
        self,
        prompt: str,
        *,
        tools: Tools | None = None,
        encrypt: bool = False,
        agent_id: str | None = None,
        filter_types: Sequence[str] | None = None,
        blocked_types: Sequence[str] | None = None,
        environment: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> AsyncRunStream:
        """Deprecated: `runs.create()`."""
        deprecated("run", "runs.create")
        return await self.runs.create(
            prompt,
            tools=tools,
            encrypt=encrypt,
            agent_id=agent_id,
            filter_types=filter_types,
            blocked_types=blocked_types,
            environment=environment,
            extra=extra,
        )

    async def events(
        self,
        run_id: str,
        after: int = 0,
        *,
        tools: Tools | None = None,
        crypto: ClientSession | None = None,
    ) -> AsyncRunStream:
        """Deprecated: `runs.attach()`."""
        deprecated("events", "runs.attach")
        return await self.runs.attach(run_id, after, tools=tools, crypto=crypto)

    async def get_run(self, run_id: str) -> RunInfo:
        """Deprecated: `runs.get()`."""
        deprecated("get_run", "runs.get")
        return await self.runs.get(run_id)

    async def cancel_run(self, run_id: str) -> bool:
        """Deprecated: `runs.cancel()`."""
        deprecated("cancel_run", "runs.cancel")
        return await self.runs.cancel(run_id)

    async def answer_tool(
        self, run_id: str, call_id: str, payload: Mapping[str, Any], *, crypto: ClientSession | None = None
    ) -> None:
        """Deprecated: `runs.tool_result()`."""
        deprecated("answer_tool", "runs.tool_result")
        await self._call(_api.tool_result(run_id, call_id, payload, crypto))

    async def resume_chat(self, chat_id: str, after: int = 0) -> AsyncChatStream:
        """Deprecated: `chats.resume()`."""
        deprecated("resume_chat", "chats.resume")
        return await self.chats.resume(chat_id, after)

    async def cancel_chat(self, chat_id: str) -> None:
        """Deprecated: `chats.cancel()`."""
        deprecated("cancel_chat", "chats.cancel")
        await self.chats.cancel(chat_id)

    async def list_chats(self) -> list[ChatSummary]:
        """Deprecated: `chats.list()`."""
        deprecated("list_chats", "chats.list")
        return await self.chats.list()

    async def get_chat(self, chat_id: str, *, limit: int | None = None, before: str | None = None) -> Chat:
        """Deprecated: `chats.get()`."""
        deprecated("get_chat", "chats.get")
        return await self.chats.get(chat_id, limit=limit, before=before)

    async def delete_chat(self, chat_id: str) -> None:
        """Deprecated: `chats.delete()`."""
        deprecated("delete_chat", "chats.delete")
        await self.chats.delete(chat_id)

    async def update_chat_settings(self, chat_id: str, settings: ChatSettings) -> ChatSettingsView:
        """Deprecated: `chats.update_settings()`."""
        deprecated("update_chat_settings", "chats.update_settings")
        return await self.chats.update_settings(chat_id, settings)

    async def upload_file(
        self,
        data: Upload,
        name: str | None = None,
        *,
        mime_type: str | None = None,
        chat_id: str | None = None,
    ) -> FileInfo:
        """Deprecated: `files.upload()`."""
        deprecated("upload_file", "files.upload")
        return await self.files.upload(data, name, mime_type=mime_type, chat_id=chat_id)

    async def download_file(self, file_id: str) -> bytes:
        """Deprecated: `files.download()`."""
        deprecated("download_file", "files.download")
        return await self.files.download(file_id)

    async def create_agent(self, definition: AgentDefinition) -> dict[str, Any]:
        """Deprecated: `agents.create()` (which answers an `Agent`; this, its JSON)."""
        deprecated("create_agent", "agents.create")
        return (await self.agents.create(definition)).raw

    async def get_agent(self, agent_id: str) -> dict[str, Any]:
        """Deprecated: `agents.get()` (which answers an `Agent`; this, its JSON)."""
        deprecated("get_agent", "agents.get")
        return (await self.agents.get(agent_id)).raw

    async def list_agents(self) -> list[dict[str, Any]]:
        """Deprecated: `agents.list()` (which answers `Agent`s; this, their JSON)."""
        deprecated("list_agents", "agents.list")
        return [a.raw for a in await self.agents.list()]

    async def update_agent(self, agent_id: str, definition: AgentDefinition) -> dict[str, Any]:
        """Deprecated: `agents.update()` (which answers an `Agent`; this, its JSON)."""
        deprecated("update_agent", "agents.update")
        return (await self.agents.update(agent_id, definition)).raw

    async def delete_agent(self, agent_id: str) -> None:
        """Deprecated: `agents.delete()`."""
        deprecated("delete_agent", "agents.delete")
        await self.agents.delete(agent_id)

    async def list_models(self) -> list[ModelInfo]:
        """Deprecated: `models.list()`."""
        deprecated("list_models", "models.list")
        return await self.models.list()

    async def list_environments(self) -> list[Environment]:
        """Deprecated: `environments.list()`."""
        deprecated("list_environments", "environments.list")
        return await self.environments.list()

    async def create_environment(
        self,
        name: str,
        *,
        variables: Mapping[str, str] | None = None,
        secrets: Mapping[str, str] | None = None,
        setup_script: str | None = None,
        allowed_hosts: Sequence[str] | None = None,
    ) -> Environment:
        """Deprecated: `environments.create()`."""
        deprecated("create_environment", "environments.create")
        return await self.environments.create(
            name, variables=variables, secrets=secrets, setup_script=setup_script, allowed_hosts=allowed_hosts
        )

    async def get_environment(self, environment_id: str) -> Environment:
        """Deprecated: `environments.get()`."""
        deprecated("get_environment", "environments.get")
        return await self.environments.get(environment_id)

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
        """Deprecated: `environments.update()`."""
        deprecated("replace_environment", "environments.update")
        return await self.environments.update(
            environment_id,
            name,
            variables=variables,
            secrets=secrets,
            setup_script=setup_script,
            allowed_hosts=allowed_hosts,
        )

    async def delete_environment(self, environment_id: str) -> None:
        """Deprecated: `environments.delete()`."""
        deprecated("delete_environment", "environments.delete")
        await self.environments.delete(environment_id)


__all__ = [
    "AsyncAgents",
    "AsyncChatStream",
    "AsyncChats",
    "AsyncClient",
    "AsyncEnvironments",
    "AsyncFiles",
    "AsyncModels",
    "AsyncRunStream",
    "AsyncRuns",
]

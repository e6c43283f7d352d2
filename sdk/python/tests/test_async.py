"""The asyncio client against the same real `asbx up` (run with `asyncio.run`, no plugin)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import AsbxUp, CuttingProxy

import asbx
from asbx import AsyncClient, ClientTool


def script(*steps: Any) -> str:
    return json.dumps({"script": list(steps)})


def test_async_chat_turn_and_its_thread(up: AsbxUp) -> None:
    async def main() -> None:
        async with AsyncClient(up.url) as c:
            turn = await c.chat(script({"say": "hello async", "stream_ms": 5}))
            events = await turn.wait()
            assert isinstance(events[0], asbx.Turn) and isinstance(events[-1], asbx.Done)
            assert "".join(e.text for e in events if isinstance(e, asbx.Delta)) == "hello async"
            chat = await c.get_chat(turn.chat_id)
            assert chat.messages[-1].text == "hello async"
            busy = await c.chat(script({"sleep_ms": 20000}), chat_id=turn.chat_id)
            with pytest.raises(asbx.TurnInFlightError):
                await c.chat("again", chat_id=turn.chat_id)
            await busy.cancel()
            rest = await busy.wait()
            assert isinstance(rest[-1], asbx.Done) and rest[-1].status == "cancelled"
            await c.delete_chat(turn.chat_id)
            with pytest.raises(asbx.NotFoundError):
                await c.get_chat(turn.chat_id)

    asyncio.run(main())


def test_async_run_with_sync_and_coroutine_tool_handlers(up: AsbxUp) -> None:
    seen: list[Any] = []

    async def lookup(args: Any) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        seen.append(("lookup", args))
        return {"found": True}

    async def main() -> None:
        async with AsyncClient(up.url) as c:
            run = await c.run(
                script(
                    {"tool": "lookup", "args": {"k": 1}}, {"tool": "plain", "args": {"k": 2}}, {"say": "both"}
                ),
                tools=[
                    ClientTool("lookup", handler=lookup),
                    ClientTool("plain", handler=lambda a: seen.append(("plain", a))),
                ],
                encrypt=True,
            )
            events = [e async for e in run]
            assert seen == [("lookup", {"k": 1}), ("plain", {"k": 2})]
            assert sum(isinstance(e, asbx.ToolResultApplied) for e in events) == 2
            assert run.result == "both" and run.termination and run.termination.ok
            crashed = await c.run(script({"crash": 7}))
            await crashed.wait()
            t = crashed.termination
            assert t and (t.reason, t.exit_code) == ("error", 7)
            with pytest.raises(asbx.BadRequestError) as e:
                await c.run("")
            assert [f.field for f in e.value.errors] == ["prompt"]

    asyncio.run(main())


def test_async_run_resumes_after_a_dropped_connection(up: AsbxUp, proxy: CuttingProxy) -> None:
    words = [f"a{i}" for i in range(15)]

    async def main() -> None:
        host = f"{proxy.target[0]}:{proxy.target[1]}"
        async with AsyncClient(proxy.url, headers={"host": host}) as c:
            proxy.cut_once(b'"type":"delta"')
            run = await c.run(script({"say": " ".join(words), "stream_ms": 40}))
            events = await run.wait()
        assert proxy.cuts == 1 and run.resumes >= 1
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert "".join(e.text for e in events if isinstance(e, asbx.Delta)) == " ".join(words)

    asyncio.run(main())


def test_async_wrong_key_is_401(up_auth: AsbxUp) -> None:
    async def main() -> None:
        async with AsyncClient(up_auth.url, "asbx_key_wrong") as c:
            with pytest.raises(asbx.UnauthorizedError) as e:
                await c.list_chats()
            assert e.value.code == "unauthorized"
        async with AsyncClient(up_auth.url, up_auth.new_key()) as c:
            assert isinstance(await c.list_chats(), list)

    asyncio.run(main())

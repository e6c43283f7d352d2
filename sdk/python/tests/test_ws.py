"""Runs over the WebSocket transport (`transport="websocket"`, `GET /api/runs/ws`,
docs/protocol.md §13) from Python through `websockets`, against a real `asbx up`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import AsbxUp

import asbx
from asbx import Client, ClientTool


def script(*steps: Any) -> str:
    return json.dumps({"script": list(steps)})


@pytest.fixture()
def client(up: AsbxUp) -> Client:
    with Client(up.url) as c:
        yield c


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_a_run_driven_over_a_websocket_completes_with_its_client_tool(client: Client, encrypt: bool) -> None:
    calls: list[Any] = []

    def pick_color(args: Any) -> Any:
        calls.append(args)
        return {"color": "amber"}

    run = client.runs.create(
        script({"tool": "pick_color", "args": {"for": "walls"}}, {"say": "picked over ws"}),
        tools=[ClientTool("pick_color", "Asks the user for a color.", handler=pick_color)],
        encrypt=encrypt,
        transport="websocket",
    )
    events = run.wait()
    assert isinstance(events[0], asbx.SessionInit)
    assert isinstance(events[-1], asbx.SessionEnded)
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1)), "every line once, in order"
    assert calls == [{"for": "walls"}]
    assert any(isinstance(e, asbx.ToolResultApplied) for e in events)
    assert run.result == "picked over ws"
    assert run.termination is not None and run.termination.ok
    assert run.run_id == events[0].session_id

    if not encrypt:
        rest = client.runs.attach(run.run_id, after=2, transport="websocket").wait()
        assert [e.seq for e in rest] == seqs[2:]
        assert isinstance(rest[-1], asbx.SessionEnded)


def test_cancel_and_refusals_over_a_websocket(client: Client) -> None:
    run = client.runs.create(script({"tool": "ask", "args": {}}, {"say": "never"}), tools=[ClientTool("ask")], transport="websocket")
    for ev in run:
        if isinstance(ev, asbx.ToolCall):
            assert run.cancel() is True
            break
    rest = list(run)
    assert isinstance(rest[-1], asbx.SessionEnded)
    assert run.termination and (run.termination.reason, run.termination.terminated_by) == ("terminated", "daemon")

    with pytest.raises(asbx.AsbxError) as e:
        client.runs.create("hi", tools=[ClientTool("bad name!")], transport="websocket")
    assert e.value.code == "invalid_request"
    with pytest.raises(asbx.AsbxError) as e:
        client.runs.attach("0" * 32, transport="websocket")
    assert e.value.code == "not_found"


def test_the_upgrade_needs_the_api_key(up_auth: AsbxUp) -> None:
    with Client(up_auth.url, api_key="asbx_key_wrong") as c:
        with pytest.raises(asbx.UnauthorizedError):
            c.runs.create(script({"say": "never"}), transport="websocket")

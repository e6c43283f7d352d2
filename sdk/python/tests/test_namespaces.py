"""The namespaces (`client.agents`, `client.chats`, `client.files`, `client.runs`,
`client.environments`, `client.models`) and their typed answers against a real
`asbx up` (scripted model, jailed runner), blocking and async."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import AsbxUp

import asbx
from asbx import AsyncClient, Client


def script(*steps: Any) -> str:
    return json.dumps({"script": list(steps)})


@pytest.fixture()
def client(up: AsbxUp) -> Client:
    with Client(up.url) as c:
        yield c


def test_agents_create_list_get_update_run_delete(client: Client) -> None:
    agent = client.agents.create(
        {
            "name": "ns agent",
            "systemPrompt": "Be brief.",
            "environment": {"variables": {"GREETING": "hi from agent"}},
            "limits": {"max_steps": 8},
        }
    )
    assert isinstance(agent, asbx.Agent) and agent.id
    assert (agent.name, agent.system_prompt, agent.limits) == ("ns agent", "Be brief.", {"max_steps": 8})
    assert agent.environment is not None and agent.environment["variables"] == {"GREETING": "hi from agent"}
    assert agent.created_at and agent.updated_at
    assert agent.id in [a.id for a in client.agents.list()]
    assert client.agents.get(agent.id) == agent

    definition = agent.definition()
    definition["name"] = "ns agent, renamed"
    definition["environment"] = {"variables": {"GREETING": "hi again"}}
    updated = client.agents.update(agent.id, definition)
    assert (updated.id, updated.name, updated.system_prompt) == (agent.id, "ns agent, renamed", "Be brief.")
    assert client.agents.get(agent.id).name == "ns agent, renamed"

    run = client.agents.run(
        agent.id,
        script({"tool": "shell", "args": {"command": "echo $GREETING"}}, {"say": "ok"}),
        filter_types=["stdout", "result"],
    )
    events = run.wait()
    assert {e.type for e in events} <= {"stdout", "result", "session_ended"}
    assert "".join(e.chunk for e in events if isinstance(e, asbx.Stdout)) == "hi again\n"
    info = client.runs.get(run.run_id)
    assert (info.kind, info.agent_id) == ("agent", agent.id)
    assert info.status in {"succeeded", "running"}, "it settles right after relaying session_ended"

    client.agents.delete(agent.id)
    with pytest.raises(asbx.NotFoundError):
        client.agents.get(agent.id)
    assert agent.id not in [a.id for a in client.agents.list()]


def test_an_agent_definition_with_a_bad_field_is_a_typed_400(client: Client) -> None:
    with pytest.raises(asbx.BadRequestError) as e:
        client.agents.create({"name": ""})
    assert e.value.code and any(f.field == "name" for f in e.value.errors), e.value.problem


def test_chats_create_send_list_get_and_files(client: Client) -> None:
    first = client.chats.create(script({"say": "first"}))
    assert first.text() == "first" and first.chat_id
    f = client.files.upload(b"x,y\n", "ns.csv", chat_id=first.chat_id)
    assert isinstance(f, asbx.FileInfo) and f.mime_type == "text/csv" and f.size == 4
    second = client.chats.send(
        first.chat_id,
        script({"tool": "shell", "args": {"command": "cat attachments/ns.csv"}}, {"say": "second"}),
        attachments=[f],
    )
    events = second.wait()
    assert isinstance(events[-1], asbx.Done) and events[-1].status == "succeeded"
    assert "".join(e.chunk for e in events if isinstance(e, asbx.Stdout)) == "x,y\n"

    assert first.chat_id in [c.id for c in client.chats.list()]
    chat = client.chats.get(first.chat_id)
    assert isinstance(chat, asbx.Chat)
    assert [(m.role, m.text) for m in chat.messages if m.text] == [
        ("user", script({"say": "first"})),
        ("assistant", "first"),
        ("user", script({"tool": "shell", "args": {"command": "cat attachments/ns.csv"}}, {"say": "second"})),
        ("assistant", "second"),
    ]
    steps = [b for m in chat.messages for b in m.content if b["type"] == "step"]
    assert [(s["name"], s["status"]) for s in steps] == [("shell", "succeeded")]
    assert [a["name"] for m in chat.messages for a in m.file_attachments] == ["ns.csv"]
    assert chat.settings is not None and chat.settings["effective"]["model"]
    assert client.files.download(f.id) == b"x,y\n"

    view = client.chats.update_settings(first.chat_id, {"systemPrompt": "Be long."})
    assert view["systemPrompt"] == "Be long." and view["effective"]["systemPrompt"] == "Be long."
    client.chats.delete(first.chat_id)
    with pytest.raises(asbx.NotFoundError):
        client.chats.get(first.chat_id)


def test_runs_create_attach_and_cancel(client: Client) -> None:
    run = client.runs.create(
        script({"say": "hello"}), blocked_types=["log"], variables={"X": "1"}, limits={"max_steps": 4}
    )
    assert run.text() == "hello" and run.termination is not None and run.termination.ok
    replay = client.runs.attach(run.run_id, after=0).wait()
    assert isinstance(replay[0], asbx.SessionInit) and isinstance(replay[-1], asbx.SessionEnded)
    info = client.runs.get(run.run_id)
    assert isinstance(info, asbx.RunInfo) and info.kind == "run" and info.status == "succeeded"
    assert info.result == "hello" and info.error is None
    assert client.runs.cancel(run.run_id) is False, "204: it had already ended"


def test_environments_and_models(client: Client) -> None:
    models = client.models.list()
    assert models and all(isinstance(m, asbx.ModelInfo) for m in models)
    env = client.environments.create("ns-env", variables={"A": "1"}, secrets={"S": "v"})
    assert (env.name, env.variables, env.secret_names) == ("ns-env", {"A": "1"}, ["S"])
    env2 = client.environments.update(env.id, "ns-env", variables={"A": "2"})
    assert env2.variables == {"A": "2"} and env2.secret_names == ["S"]
    assert env.id in [e.id for e in client.environments.list()]
    assert client.environments.get(env.id).variables == {"A": "2"}
    client.environments.delete(env.id)
    with pytest.raises(asbx.NotFoundError):
        client.environments.get(env.id)


def test_usage(client: Client) -> None:
    usage = client.usage.get()
    assert isinstance(usage, asbx.Usage)
    names = {
        "concurrent-sandboxes",
        "requests-per-minute",
        "sandbox-seconds-per-day",
        "tokens-per-day",
        "storage-mb",
    }
    assert set(usage.quotas) == names and set(usage.used) == names
    assert all(v is None for v in usage.quotas.values()), "unlimited by default"
    assert usage.used["concurrent-sandboxes"] >= 0


def test_the_async_namespaces(up: AsbxUp) -> None:
    async def go() -> None:
        async with AsyncClient(up.url) as client:
            agent = await client.agents.create({"name": "async ns agent"})
            run = await client.agents.run(agent.id, script({"say": "from an agent"}))
            assert await run.text() == "from an agent"
            assert (await client.runs.get(run.run_id)).agent_id == agent.id
            turn = await client.chats.create(script({"say": "async chat"}))
            assert await turn.text() == "async chat"
            assert turn.chat_id in [c.id for c in await client.chats.list()]
            await client.chats.delete(turn.chat_id)
            await client.agents.delete(agent.id)
            assert agent.id not in [a.id for a in await client.agents.list()]

    asyncio.run(go())


def test_audit_lists_a_runs_records_in_one_chain(client: Client) -> None:
    run = client.runs.create(script({"tool": "shell", "args": {"command": "echo audited"}}, {"say": "ok"}))
    assert run.text() == "ok"
    records = client.audit.of_run(run.run_id)
    kinds = [r["kind"] for r in records]
    assert "tool_call" in kinds and "callback" in kinds, records
    assert all(r["runId"] == run.run_id for r in records)
    every = client.audit.list(limit=10_000)
    for prev, cur in zip(every, every[1:]):
        assert cur["prevHash"] == prev["hash"] and cur["id"] == prev["id"] + 1
    page = client.audit.list(after=every[-1]["id"] - 1, limit=1)
    assert [r["id"] for r in page] == [every[-1]["id"]]

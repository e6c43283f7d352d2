"""The namespaces and the typed models against a recording fake of the workspace
(`httpx.MockTransport`, no asbx needed): what each call sends, what it answers,
that the async and the blocking client share one core, and that the flat methods
of 0.1 still work and say they are deprecated."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

import asbx
from asbx import _api

AGENT = {
    "id": "ag_1",
    "name": "helper",
    "description": None,
    "systemPrompt": "Be brief.",
    "model": "scripted:default",
    "skills": [{"name": "s", "description": "", "files": {"SKILL.md": "x"}}],
    "mcpServers": [{"name": "m", "url": "http://127.0.0.1:1/mcp"}],
    "environment": {"variables": {"A": "1"}},
    "limits": {"max_steps": 3},
    "createdAt": 1,
    "updatedAt": 2,
}
CHAT = {
    "id": "c/1",
    "title": "t",
    "createdAt": 1,
    "updatedAt": 2,
    "messages": [
        {
            "id": "m1",
            "role": "user",
            "content": [{"type": "text", "text": "hi"}],
            "createdAt": 1,
            "fileAttachments": [{"id": "f1", "name": "a.txt", "mimeType": "text/plain", "size": 3}],
        },
        {
            "id": "m2",
            "role": "assistant",
            "content": [
                {"type": "step", "id": "s1", "name": "shell", "status": "succeeded"},
                {"type": "text", "text": "hello"},
                {"type": "text", "text": " there"},
            ],
            "createdAt": 2,
            "turnId": "t1",
        },
    ],
    "files": [],
    "settings": {"effective": {"model": "scripted:default", "systemPrompt": "x"}},
    "before": 17,
}


class Fake:
    """Answers by (method, path); records every request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        body = (
            json.loads(req.content)
            if req.content and req.headers.get("content-type") == "application/json"
            else None
        )
        path = req.url.raw_path.decode()
        self.seen.append((req.method, path, body))
        route = (req.method, req.url.path)
        if route == ("POST", "/api/agents") or route == ("PUT", "/api/agents/ag_1"):
            return httpx.Response(201, json={**AGENT, **(body or {})})
        if route == ("GET", "/api/agents"):
            return httpx.Response(200, json={"agents": [AGENT]})
        if route == ("GET", "/api/agents/ag_1"):
            return httpx.Response(200, json=AGENT)
        if route == ("GET", "/api/agents/nope"):
            return httpx.Response(
                404,
                json={
                    "type": "urn:asbx:problem:not_found",
                    "title": "t",
                    "status": 404,
                    "detail": "d",
                    "code": "not_found",
                },
                headers={"content-type": "application/problem+json"},
            )
        if req.method == "DELETE":
            return httpx.Response(202 if req.url.path.startswith("/api/runs/") else 204)
        if route == ("GET", "/api/assistant/chats/c/1"):
            return httpx.Response(200, json=CHAT)
        if route == ("PUT", "/api/assistant/chats/c1/settings"):
            return httpx.Response(
                200, json={**(body or {}), "effective": {"model": "m", "systemPrompt": "p"}}
            )
        if route == ("GET", "/api/models"):
            return httpx.Response(
                200, json={"models": [{"id": "scripted:default", "provider": "scripted", "default": True}]}
            )
        if route == ("POST", "/api/runs/r1/tool-result"):
            return httpx.Response(200, json={})
        return httpx.Response(500, json={"code": "internal", "detail": f"no fake for {route}"})


def sync_client(fake: Fake) -> asbx.Client:
    return asbx.Client("http://ws.test", http=httpx.Client(transport=httpx.MockTransport(fake)))


def test_agents_namespace_sends_and_answers_typed_agents() -> None:
    fake = Fake()
    client = sync_client(fake)
    made = client.agents.create({"name": "helper", "systemPrompt": "Be brief."})
    assert isinstance(made, asbx.Agent)
    assert (made.id, made.name, made.system_prompt, made.created_at) == ("ag_1", "helper", "Be brief.", 1)
    assert made.skills[0]["files"] == {"SKILL.md": "x"} and made.limits == {"max_steps": 3}
    assert made.environment == {"variables": {"A": "1"}}
    assert fake.seen[-1] == ("POST", "/api/agents", {"name": "helper", "systemPrompt": "Be brief."})
    assert [a.id for a in client.agents.list()] == ["ag_1"]
    assert client.agents.get("ag_1").model == "scripted:default"
    definition = made.definition()
    assert "id" not in definition and "createdAt" not in definition and definition["name"] == "helper"
    definition["name"] = "renamed"
    assert client.agents.update("ag_1", definition).name == "renamed"
    assert fake.seen[-1][:2] == ("PUT", "/api/agents/ag_1")
    client.agents.delete("ag_1")
    assert fake.seen[-1] == ("DELETE", "/api/agents/ag_1", None)
    with pytest.raises(asbx.NotFoundError) as e:
        client.agents.get("nope")
    assert e.value.code == "not_found"


def test_chats_get_escapes_the_id_and_types_the_thread() -> None:
    fake = Fake()
    chat = sync_client(fake).chats.get("c/1", limit=2, before="9")
    assert fake.seen[-1][:2] == ("GET", "/api/assistant/chats/c%2F1?limit=2&before=9")
    assert isinstance(chat, asbx.Chat) and chat.before == "17"
    user, bot = chat.messages
    assert user.file_attachments[0]["mimeType"] == "text/plain"
    assert [b["type"] for b in bot.content] == ["step", "text", "text"]
    assert bot.text == "hello there" and bot.turn_id == "t1"
    assert chat.settings is not None and chat.settings["effective"]["model"] == "scripted:default"


def test_runs_and_chats_calls_answer_what_the_route_says() -> None:
    fake = Fake()
    client = sync_client(fake)
    assert client.runs.cancel("r1") is True, "202: the run is ending"
    client.runs.tool_result("r1", "call-1", None)
    assert fake.seen[-1] == ("POST", "/api/runs/r1/tool-result", {"callId": "call-1", "result": ""})
    client.runs.tool_result("r1", "call-2", error="boom")
    assert fake.seen[-1][2] == {"callId": "call-2", "error": "boom"}
    view = client.chats.update_settings("c1", {"systemPrompt": "Be long."})
    assert view["systemPrompt"] == "Be long." and view["effective"]["systemPrompt"] == "p"
    assert [m.id for m in client.models.list()] == ["scripted:default"]


def test_the_flat_methods_still_work_and_are_deprecated() -> None:
    fake = Fake()
    client = sync_client(fake)
    with pytest.warns(
        DeprecationWarning, match=r"create_agent\(\) is deprecated, use client.agents.create\(\)"
    ):
        agent = client.create_agent({"name": "helper"})
    assert agent == {**AGENT, "name": "helper"}, "the 0.1 shape: the JSON object"
    with pytest.warns(DeprecationWarning, match="agents.list"):
        assert client.list_agents() == [AGENT]
    with pytest.warns(DeprecationWarning, match="runs.cancel"):
        assert client.cancel_run("r1") is True
    with pytest.warns(DeprecationWarning, match="models.list"):
        assert client.list_models()[0].default is True


def test_run_bodies_carry_the_protocol_2_choices() -> None:
    body = _api.run_body("hi", model="scripted:default", limits={"max_steps": 2}, environment="dev")
    tool = asbx.ClientTool("pick", "Picks.", handler=lambda a: a)
    _api.run_options(body, {"pick": tool}, None, ["delta", "result"], None)
    assert body == {
        "prompt": "hi",
        "model": "scripted:default",
        "limits": {"max_steps": 2},
        "environment": "dev",
        "protocol": 2,
        "clientTools": [
            {"name": "pick", "description": "Picks.", "parameters": {"type": "object", "properties": {}}}
        ],
        "filter": {"types": ["delta", "result"]},
    }
    with pytest.raises(ValueError):
        _api.run_options({"prompt": "x"}, {}, None, ["delta"], ["log"])
    # A run from a chat's kept working directory (CONTRACT §11).
    assert _api.run_body("x", workdir_from="c1")["workdir"] == {"from": "c1"}
    assert _api.run_body("x", workdir_from="c1", workdir_after_message_id="m1")["workdir"] == {
        "from": "c1",
        "afterMessageId": "m1",
    }
    with pytest.raises(ValueError):
        _api.run_body("x", workdir_after_message_id="m1")
    open_ = _api.open_run({"prompt": "x"}, "a b")
    assert (open_.method, open_.path, open_.headers["accept"]) == (
        "POST",
        "/api/agents/a%20b/runs",
        "application/x-ndjson",
    )


def test_the_async_client_sends_the_same_calls() -> None:
    fake = Fake()

    async def go() -> tuple[list[str], Any]:
        http = httpx.AsyncClient(transport=httpx.MockTransport(fake))
        async with asbx.AsyncClient("http://ws.test", http=http) as client:
            made = await client.agents.create({"name": "helper"})
            names = [a.name for a in await client.agents.list()]
            chat = await client.chats.get("c/1")
            with pytest.warns(DeprecationWarning, match="agents.get"):
                raw = await client.get_agent("ag_1")
            await http.aclose()
            return [made.name, *names, chat.messages[1].text, raw["id"]], fake.seen

    out, seen = asyncio.run(go())
    assert out == ["helper", "helper", "hello there", "ag_1"]
    assert [s[:2] for s in seen] == [
        ("POST", "/api/agents"),
        ("GET", "/api/agents"),
        ("GET", "/api/assistant/chats/c%2F1"),
        ("GET", "/api/agents/ag_1"),
    ]

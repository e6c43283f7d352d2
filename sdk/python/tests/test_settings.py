"""Environments, models, chat settings, the workspace's chat events and history
paging. These routes are new: against a binary without them the tests skip,
saying so."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from conftest import AsbxUp

import asbx
from asbx import Client


def script(*steps: Any) -> str:
    return json.dumps({"script": list(steps)})


@pytest.fixture()
def client(up: AsbxUp) -> Client:
    with Client(up.url) as c:
        yield c


def needs(route: str, call: Any) -> Any:
    try:
        return call()
    except asbx.NotFoundError as e:
        if "route" in e.detail and "not found" in e.detail:
            pytest.skip(f"this asbx binary has no {route} yet (rebuild: cargo build -p asbx)")
        raise


def test_models_and_environments_reach_the_sandbox(client: Client) -> None:
    models = needs("/api/models", client.list_models)
    assert any(m.default for m in models) and all(":" in m.id for m in models)
    env = client.create_environment(
        "sdk-env",
        variables={"PLAIN": "visible"},
        secrets={"TOKEN": "s3cret-value"},
        setup_script="echo set-up > setup.txt",
    )
    assert env.variables == {"PLAIN": "visible"} and env.secret_names == ["TOKEN"]
    assert "s3cret-value" not in json.dumps(env.raw)
    assert env.id in [e.id for e in client.list_environments()]
    with pytest.raises(asbx.ConflictError) as e:
        client.create_environment("sdk-env")
    assert e.value.code == "conflict"

    run = client.run(
        script({"tool": "shell", "args": {"command": "echo $PLAIN $TOKEN; cat setup.txt"}}, {"say": "ok"}),
        environment="sdk-env",
    )
    out = "".join(e.chunk for e in run if isinstance(e, asbx.Stdout))
    assert out == "visible s3cret-value\nset-up\n", out

    kept = client.replace_environment(env.id, "sdk-env", variables={"PLAIN": "changed"})
    assert kept.secret_names == ["TOKEN"], "secrets absent: kept"
    gone = client.replace_environment(env.id, "sdk-env", secrets={"TOKEN": None, "NEW": "n"})
    assert gone.secret_names == ["NEW"] and gone.variables == {}
    client.delete_environment(env.id)
    with pytest.raises(asbx.NotFoundError):
        client.get_environment(env.id)


def test_chat_settings_first_turn_and_update(client: Client) -> None:
    needs("/api/models", client.list_models)
    env = client.create_environment("chat-env", variables={"WHO": "chat settings"})
    turn = client.chat(
        script({"tool": "shell", "args": {"command": "echo $WHO"}}, {"say": "ok"}),
        settings={"environmentId": env.id, "systemPrompt": "Be brief."},
    )
    out = "".join(e.chunk for e in turn if isinstance(e, asbx.Stdout))
    assert out == "chat settings\n", out
    settings = client.get_chat(turn.chat_id).settings
    assert settings and settings["environmentId"] == env.id
    assert settings["effective"]["systemPrompt"] == "Be brief."
    updated = client.update_chat_settings(turn.chat_id, {"systemPrompt": "Be long."})
    assert updated["effective"]["systemPrompt"] == "Be long." and "environmentId" not in updated
    with pytest.raises(asbx.BadRequestError):
        client.chat("again", chat_id=turn.chat_id, settings={"systemPrompt": "no"})
    client.delete_chat(turn.chat_id)
    client.delete_environment(env.id)


def test_workspace_events_announce_a_turn(up: AsbxUp) -> None:
    with Client(up.url) as c:
        events = needs("/api/assistant/events", c.workspace_events)
        seen: list[asbx.WorkspaceEvent] = []

        def read() -> None:
            for ev in events:
                seen.append(ev)
                if ev.state == "ended":
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        turn = c.chat(script({"say": "announced"}))
        turn.wait()
        t.join(20)
        states = [(e.chat_id, e.state) for e in seen]
        assert (turn.chat_id, "started") in states and (turn.chat_id, "ended") in states, states


def test_history_pages_back_with_a_cursor(client: Client) -> None:
    turn = client.chat(script({"say": "one"}))
    turn.wait()
    for word in ("two", "three"):
        client.chat(script({"say": word}), chat_id=turn.chat_id).wait()
    page = client.get_chat(turn.chat_id, limit=2)
    if "before" not in page.raw:
        pytest.skip("this asbx binary does not page chat history yet")
    assert [m.text for m in page.messages] == [script({"say": "three"}), "three"]
    assert page.before is not None
    older = client.get_chat(turn.chat_id, limit=4, before=page.before)
    assert [m.text for m in older.messages][-1] == "two" and older.before is None
    client.delete_chat(turn.chat_id)

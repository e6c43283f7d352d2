"""The blocking client against a real `asbx up` (scripted model, jailed runner)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
from conftest import AsbxUp, CuttingProxy

import asbx
from asbx import Client, ClientSession, ClientTool


def script(*steps: Any) -> str:
    return json.dumps({"script": list(steps)})


def settled(client: Client, run_id: str) -> asbx.RunInfo:
    """The run once it reads settled (it settles right after relaying `session_ended`)."""
    deadline = time.monotonic() + 10
    while True:
        info = client.get_run(run_id)
        if info.status != "running" or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def seqs(events: list[asbx.Event]) -> list[int]:
    return [e.seq for e in events if e.seq is not None]


@pytest.fixture()
def client(up: AsbxUp) -> Client:
    with Client(up.url) as c:
        yield c


def test_chat_turns_with_an_attachment_then_read_and_delete(client: Client) -> None:
    turn = client.chat(
        script(
            {"tool": "shell", "args": {"command": "echo one; echo two"}}, {"say": "read it", "stream_ms": 5}
        )
    )
    assert turn.chat_id and turn.turn_id
    events = turn.wait()
    assert isinstance(events[0], asbx.Turn) and events[0].chat_id == turn.chat_id
    assert isinstance(events[-1], asbx.Done) and events[-1].status == "succeeded"
    assert isinstance(events[-2], asbx.SessionEnded)
    assert turn.termination is not None and turn.termination.ok
    steps = [e for e in events if isinstance(e, asbx.Step)]
    assert [(s.name, s.status) for s in steps] == [("shell", "running"), ("shell", "succeeded")]
    out = "".join(e.chunk for e in events if isinstance(e, asbx.Stdout))
    assert out == "one\ntwo\n", out
    assert "".join(e.text for e in events if isinstance(e, asbx.Delta)) == "read it"
    assert turn.result == "read it"
    assert not any(isinstance(e, asbx.Log) for e in events), "the chat stream hides log lines"
    s = seqs(events)
    assert s == sorted(set(s)), s

    # A file attached to the next turn is placed under attachments/ (the
    # message is no script any more, so the scripted model runs its demo:
    # `ls -la` of the working directory, then out/hello.txt).
    f = client.upload_file(b"a,b\n1,2\n", "table.csv")
    assert f.mime_type == "text/csv" and f.size == 8 and f.id
    again = client.chat("what is attached?", chat_id=turn.chat_id, attachments=[f])
    assert again.chat_id == turn.chat_id and again.turn_id != turn.turn_id
    listing = "".join(e.chunk for e in again if isinstance(e, asbx.Stdout))
    assert "attachments" in listing, listing
    assert again.termination and again.termination.ok

    chat = client.get_chat(turn.chat_id)
    assert [m.role for m in chat.messages] == ["user", "assistant", "user", "assistant"]
    assert chat.messages[1].text == "read it"
    assert [a.get("id") for a in chat.messages[2].file_attachments] == [f.id]
    assert f.id in [x.id for x in chat.files]
    assert "hello.txt" in [x.path.rsplit("/", 1)[-1] for x in chat.files], chat.files
    assert turn.chat_id in [c.id for c in client.list_chats()]
    assert client.download_file(f.id) == b"a,b\n1,2\n"

    client.delete_chat(turn.chat_id)
    with pytest.raises(asbx.NotFoundError) as e:
        client.get_chat(turn.chat_id)
    assert e.value.status == 404 and e.value.code == "not_found"
    assert turn.chat_id not in [c.id for c in client.list_chats()]


def test_a_second_turn_on_a_busy_chat_is_409_turn_in_flight(client: Client) -> None:
    first = client.chat(script({"sleep_ms": 20000}, {"say": "late"}))
    it = iter(first)
    assert isinstance(next(it), asbx.Turn)
    with pytest.raises(asbx.TurnInFlightError) as e:
        client.chat("another", chat_id=first.chat_id)
    assert isinstance(e.value, asbx.ConflictError)
    assert e.value.status == 409 and e.value.code == "turn_in_flight"
    assert first.turn_id and first.turn_id in json.dumps(e.value.problem)
    first.cancel()
    rest = list(it)
    assert isinstance(rest[-1], asbx.Done) and rest[-1].status == "cancelled", rest[-1]
    errors = [e for e in rest if isinstance(e, asbx.ErrorEvent)]
    assert [x.code for x in errors] == ["cancelled"]
    assert first.termination and first.termination.reason == "terminated"
    assert first.termination.terminated_by == "daemon"


def test_run_with_client_tools_answered_by_callbacks(client: Client) -> None:
    calls: list[Any] = []

    def pick_color(args: Any) -> dict[str, Any]:
        calls.append(args)
        return {"color": "amber"}

    def broken(args: Any) -> None:
        raise RuntimeError("no printer")

    run = client.run(
        script(
            {"tool": "pick_color", "args": {"for": "walls"}},
            {"tool": "print_it", "args": {}},
            {"say": "thanks"},
        ),
        tools=[
            ClientTool("pick_color", "Asks the user for a color.", handler=pick_color),
            ClientTool("print_it", "Prints.", handler=broken),
        ],
    )
    events = run.wait()
    assert calls == [{"for": "walls"}]
    tool_calls = [e for e in events if isinstance(e, asbx.ToolCall)]
    applied = [e for e in events if isinstance(e, asbx.ToolResultApplied)]
    assert [c.tool_name for c in tool_calls] == ["pick_color", "print_it"]
    assert [a.call_id for a in applied] == [c.call_id for c in tool_calls]
    assert isinstance(events[0], asbx.SessionInit) and events[0].protocol_version == 2
    assert run.result == "thanks"
    assert run.termination and run.termination.ok and run.termination.stats
    assert run.termination.stats.tool_calls == 2
    assert seqs(events) == list(range(1, len(events) + 1)), "protocol 2 lines without a filter have no gaps"
    info = settled(client, run.run_id)
    assert info.status == "succeeded" and info.termination == run.termination


def test_a_failed_runs_termination_info(client: Client) -> None:
    run = client.run(script({"crash": 3}))
    events = run.wait()
    err = [e for e in events if isinstance(e, asbx.ErrorEvent)]
    assert [e.code for e in err] == ["sandbox_crashed"]
    t = run.termination
    assert t is not None and not t.ok
    assert (t.reason, t.terminated_by, t.exit_code) == ("error", "agent", 3)
    assert t.stderr is not None and "scripted crash" in (t.stderr.head or "")
    assert t.message and "code 3" in t.message
    info = settled(client, run.run_id)
    assert info.status == "failed" and info.error and info.error["code"] == "sandbox_crashed"
    assert info.termination == t

    failed = client.run(script({"fail": "the model broke"}))
    events = failed.wait()
    err = [e for e in events if isinstance(e, asbx.ErrorEvent)]
    assert [e.code for e in err] == ["model_error"] and "the model broke" in err[0].message
    assert failed.termination and failed.termination.reason == "error"
    assert failed.termination.message == err[0].message


def test_cancel_a_run_waiting_for_its_client_tool(client: Client) -> None:
    run = client.run(script({"tool": "ask", "args": {}}, {"say": "never"}), tools=[ClientTool("ask")])
    for ev in run:
        if isinstance(ev, asbx.ToolCall):
            assert run.cancel() is True
            break
    rest = list(run)
    assert isinstance(rest[-1], asbx.SessionEnded)
    assert run.termination and (run.termination.reason, run.termination.terminated_by) == (
        "terminated",
        "daemon",
    )
    info = settled(client, run.run_id)
    assert info.status == "failed" and info.error and info.error["code"] == "cancelled"
    assert client.cancel_run(run.run_id) is False, "an ended run answers 204"


def test_problem_json_becomes_typed_errors_with_field_errors(client: Client) -> None:
    with pytest.raises(asbx.BadRequestError) as e:
        client.run("hi", tools=[ClientTool("bad name!")])
    assert e.value.status == 400 and e.value.code == "invalid_request"
    assert [f.field for f in e.value.errors] == ["clientTools[0].name"]
    with pytest.raises(asbx.NotFoundError):
        client.get_run("0" * 32)
    with pytest.raises(asbx.NotFoundError):
        client.resume_chat("0" * 32)


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_a_dropped_run_stream_resumes_with_no_gap_and_no_duplicate(
    up: AsbxUp, proxy: CuttingProxy, encrypt: bool
) -> None:
    words = [f"w{i}" for i in range(20)]
    with proxy.client() as via:
        # The first line after session_init is cut mid-way (sealed lines name only their type).
        proxy.cut_once(b'"seq":3,')
        run = via.run(script({"say": " ".join(words), "stream_ms": 40}), encrypt=encrypt)
        events = run.wait()
    assert proxy.cuts == 1 and run.resumes >= 1, "the connection was cut and the stream resumed"
    assert proxy.connections >= 2
    assert seqs(events) == list(range(1, len(events) + 1)), seqs(events)
    assert "".join(e.text for e in events if isinstance(e, asbx.Delta)) == " ".join(words)
    assert run.termination and run.termination.ok
    # What was read equals the run's stored lines, one for one.
    stored = [
        json.loads(x) for x in httpx.get(f"{up.url}/api/runs/{run.run_id}/events").text.splitlines() if x
    ]
    if encrypt:
        assert run.crypto is not None
        stored = [run.crypto.decrypt_line(x) for x in stored]
    assert [e.raw for e in events] == stored


def test_a_dropped_chat_stream_resumes_after_its_last_event_id(client: Client, proxy: CuttingProxy) -> None:
    words = [f"v{i}" for i in range(20)]
    with proxy.client() as via:
        proxy.cut_once(b"event: delta")
        turn = via.chat(script({"say": " ".join(words), "stream_ms": 40}))
        events = turn.wait()
    assert proxy.cuts == 1 and turn.resumes >= 1
    s = seqs(events)
    assert s == sorted(set(s)), s
    assert "".join(e.text for e in events if isinstance(e, asbx.Delta)) == " ".join(words)
    assert isinstance(events[-1], asbx.Done) and events[-1].status == "succeeded"
    assert sum(isinstance(e, asbx.Turn) for e in events) == 1


def test_an_encrypted_run_relays_only_ciphertext_and_opens_on_the_client(client: Client, up: AsbxUp) -> None:
    marker = "plaintext-marker-7f3a"
    got: list[Any] = []
    run = client.run(
        script({"tool": "secret_tool", "args": {"q": marker}}, {"say": marker}),
        tools={"secret_tool": lambda a: got.append(a) or {"answer": marker}},
        encrypt=True,
    )
    events = run.wait()
    assert got == [{"q": marker}], "the sealed tool call opened on the client"
    assert run.result == marker
    assert any(isinstance(e, asbx.ToolResultApplied) for e in events), (
        "the sealed answer opened in the sandbox"
    )
    assert run.termination and run.termination.ok
    init = events[0]
    assert isinstance(init, asbx.SessionInit) and init.encryption
    assert init.encryption["algorithm"] == "ECDH-P256+HKDF-SHA256+AES-256-GCM"
    # The workspace keeps and relays ciphertext only.
    raw = httpx.get(f"{up.url}/api/runs/{run.run_id}/events").text
    assert marker not in raw
    lines = [json.loads(x) for x in raw.splitlines() if x]
    assert all("encrypted" in x for x in lines[1:]) and len(lines) == len(events)
    # A replay opens with the run's key, and with no other (negative control).
    replay = client.events(run.run_id, crypto=run.crypto).wait()
    assert [e.raw for e in replay] == [e.raw for e in events]
    other = ClientSession()
    other.agree(init.encryption, run.run_id)
    with pytest.raises(asbx.DecryptionError):
        client.events(run.run_id, crypto=other).wait()
    assert (
        client.get_run(run.run_id).termination is None
        or client.get_run(run.run_id).termination.message is None
    )


def test_an_encrypted_run_verifies_against_the_pinned_runner_key(up: AsbxUp) -> None:
    pinned = (up.data / "runner" / "identity.pub").read_text().strip()
    with Client(up.url, runner_public_key=pinned) as c:
        run = c.run(script({"say": "signed"}), encrypt=True)
        events = run.wait()
        assert run.result == "signed"
        init = events[0]
        assert isinstance(init, asbx.SessionInit) and init.encryption
        assert init.encryption["identityKey"] == pinned
    # A key that is not the runner's: the session is refused before any line opens.
    stranger = ClientSession().public_key
    with Client(up.url, runner_public_key=stranger) as c:
        run = c.run(script({"say": "never read"}), encrypt=True)
        with pytest.raises(asbx.SignatureError) as e:
            run.wait()
        assert e.value.code == "signature_invalid"
        run.close()


def test_a_plain_answer_to_an_encrypted_run_is_refused(client: Client) -> None:
    run = client.run(script({"tool": "t", "args": {}}, {"say": "ok"}), tools=[ClientTool("t")], encrypt=True)
    for ev in run:
        if isinstance(ev, asbx.ToolCall):
            with pytest.raises(asbx.BadRequestError) as e:
                client.answer_tool(run.run_id, ev.call_id, {"result": 1})
            assert e.value.code == "invalid_request"
            run.answer(ev.call_id, {"sealed": True})
    assert run.result == "ok"


def test_a_wrong_key_is_401_and_the_right_one_works(up_auth: AsbxUp) -> None:
    with Client(up_auth.url, api_key="asbx_key_" + "0" * 40) as wrong:
        with pytest.raises(asbx.UnauthorizedError) as e:
            wrong.list_chats()
        assert e.value.status == 401 and e.value.code == "unauthorized"
        with pytest.raises(asbx.UnauthorizedError):
            wrong.run("hello")
    with Client(up_auth.url) as anonymous, pytest.raises(asbx.UnauthorizedError):
        anonymous.chat("hello")
    key = up_auth.new_key()
    with Client(up_auth.url, api_key=key) as right:
        assert right.chat(script({"say": "in"})).text() == "in"
        assert len(right.list_chats()) == 1


def test_streams_are_independent_across_threads(client: Client) -> None:
    results: dict[int, str] = {}

    def one(i: int) -> None:
        results[i] = client.run(script({"say": f"r{i}"})).text()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"r{i}" for i in range(3)}


def test_a_stored_agents_run_and_a_filtered_run(client: Client) -> None:
    agent = client.create_agent(
        {"name": "sdk agent", "environment": {"variables": {"GREETING": "hi from env"}}}
    )
    assert agent["id"] in [a["id"] for a in client.list_agents()]
    run = client.run(
        script({"tool": "shell", "args": {"command": "echo $GREETING"}}, {"say": "ok"}),
        agent_id=agent["id"],
        filter_types=["stdout"],
    )
    events = run.wait()
    kinds = {e.type for e in events}
    assert kinds <= {"stdout", "result", "error", "session_ended"}, kinds
    assert "".join(e.chunk for e in events if isinstance(e, asbx.Stdout)) == "hi from env\n"
    assert run.result == "ok"
    assert client.get_run(run.run_id).raw.get("kind") == "agent"
    client.delete_agent(agent["id"])
    with pytest.raises(asbx.NotFoundError):
        client.get_agent(agent["id"])


def test_an_encrypted_run_read_without_its_key_says_so(client: Client) -> None:
    run = client.run(script({"say": "sealed"}), encrypt=True)
    assert run.text() == "sealed"
    with pytest.raises(asbx.DecryptionError) as e:
        client.events(run.run_id).wait()
    assert "crypto=" in e.value.detail


def test_a_replay_past_a_finished_runs_end_is_empty(client: Client) -> None:
    run = client.run(script({"say": "done"}))
    events = run.wait()
    started = time.monotonic()
    tail = client.events(run.run_id, after=events[-1].seq or 0)
    assert tail.wait() == [] and time.monotonic() - started < 3
    assert tail.termination == run.termination, "taken from the run's record"
    again = client.events(run.run_id, after=2).wait()
    assert [e.raw for e in again] == [e.raw for e in events[2:]]


def test_a_run_starts_from_a_chats_kept_working_directory(client: Client) -> None:
    turn = client.chat(script({"tool": "shell", "args": {"command": "echo kept-7713 > notes.txt"}}, {"say": "wrote"}))
    turn.wait()
    run = client.runs.create(
        script({"tool": "shell", "args": {"command": "cat notes.txt"}}, {"say": "read"}),
        workdir_from=turn.chat_id,
    )
    out = "".join(e.chunk for e in run.wait() if isinstance(e, asbx.Stdout))
    assert "kept-7713" in out, out
    with pytest.raises(asbx.NotFoundError):
        client.runs.create("x", workdir_from="no-such-chat").wait()

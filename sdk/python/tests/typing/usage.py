"""Type-checked (not run) by tests/test_types.py with `mypy --strict`: the
namespaces answer typed models, and misuse fails to check. Each
`# type: ignore[code]` marks a line that must be an error (`--warn-unused-ignores`
fails when it is not), as `@ts-expect-error` does in the TypeScript SDK."""

from __future__ import annotations

import asbx
from asbx import AgentDefinition, AsyncClient, Client


def sync(client: Client) -> None:
    agent: asbx.Agent = client.agents.create({"name": "a", "systemPrompt": "s", "limits": {"max_steps": 3}})
    created: int | None = agent.created_at
    definition: AgentDefinition = agent.definition()
    definition["model"] = "scripted:default"
    client.agents.update(agent.id, definition)
    client.agents.create({"systemPrompt": "s"})  # type: ignore[typeddict-item]
    client.agents.create({"name": "a", "sandboxUrl": "http://x"})  # type: ignore[typeddict-unknown-key]
    client.agents.create({"name": "a", "limits": {"max_steps": "3"}})  # type: ignore[typeddict-item]
    run = client.agents.run(agent.id, "hi", filter_types=["delta"])
    for ev in run:
        if isinstance(ev, asbx.Delta):
            text: str = ev.text
    info: asbx.RunInfo = client.runs.get(run.run_id)
    if info.error is not None:
        code: str = info.error["code"]
    chat = client.chats.get("id")
    for m in chat.messages:
        for block in m.content:
            if block["type"] == "step":
                status: asbx.StepStatus = block["status"]
            block["nope"]  # type: ignore[typeddict-item]
    if chat.settings is not None:
        model: str = chat.settings["effective"]["model"]
    chats: list[asbx.ChatSummary] = client.chats.list()
    agents: list[asbx.Agent] = client.agents.list()
    envs: list[asbx.Environment] = client.environments.list()
    blob: bytes = client.files.download("f")
    bad: int = client.files.download("f")  # type: ignore[assignment]
    known: asbx.ErrorCode = "attachment_failed"
    unknown: asbx.ErrorCode = "nope"  # type: ignore[assignment]
    kind: asbx.EventType = "no_such_line"  # type: ignore[assignment]
    del created, text, code, status, model, chats, agents, envs, blob, bad, known, unknown, kind


async def not_blocking(client: AsyncClient) -> None:
    agent: asbx.Agent = await client.agents.get("a")
    run = await client.agents.run(agent.id, "hi")
    async for ev in run:
        del ev
    blocked: asbx.Agent = client.agents.get("a")  # type: ignore[assignment]
    del blocked

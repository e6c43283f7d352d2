"""What is generated stays generated: `_sync.py` from `_async.py` (scripts/unasync.py)
and `_unions.py` from the JSON Schemas under schemas/ (scripts/gen_unions.py). No
asbx needed."""

from __future__ import annotations

import importlib.util
import json
import typing
from pathlib import Path
from types import ModuleType

import asbx
from asbx._events import UnknownEvent, parse_event

SDK = Path(__file__).resolve().parents[1]
SRC = SDK / "src" / "asbx"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SDK / "scripts" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    unasync = _script("unasync")
    want = unasync.render((SRC / "_async.py").read_text("utf-8"))
    assert (SRC / "_sync.py").read_text("utf-8") == want, (
        "_sync.py drifted from _async.py: run python sdk/python/scripts/unasync.py"
    )


def test_unasync_maps_async_code_to_its_blocking_twin() -> None:
    unasync = _script("unasync")
    body = (
        "class _AsyncStream(AsyncIterator[Event]):\n"
        "    async def __anext__(self) -> Event:\n"
        "        return await self._gen.__anext__()\n"
        "    async def go(self, http: httpx.AsyncClient) -> AsyncGenerator[Event, None]:\n"
        "        out = f()\n"
        "        if inspect.isawaitable(out):  # unasync: remove\n"
        "            out = await out  # unasync: remove\n"
        "        async for line in resp.aiter_lines():\n"
        "            await asyncio.sleep(1)\n"
        "        await resp.aclose()\n"
    )
    out = unasync.render(body, module=False)
    tail = out
    assert tail == (
        "class _Stream(Iterator[Event]):\n"
        "    def __next__(self) -> Event:\n"
        "        return self._gen.__next__()\n"
        "    def go(self, http: httpx.Client) -> Generator[Event, None, None]:\n"
        "        out = f()\n"
        "        for line in resp.iter_lines():\n"
        "            time.sleep(1)\n"
        "        resp.close()\n"
    )


def test_the_unions_are_generated_from_the_schemas() -> None:
    gen = _script("gen_unions")
    assert (SRC / "_unions.py").read_text("utf-8") == gen.render(), (
        "_unions.py drifted from schemas/: run python sdk/python/scripts/gen_unions.py"
    )


def test_the_unions_hold_what_the_schemas_list() -> None:
    schemas = SDK.parents[1] / "schemas"
    line = json.loads((schemas / "line.json").read_text())
    assert list(asbx.EVENT_TYPES) == [alt["properties"]["type"]["const"] for alt in line["oneOf"]]
    assert list(asbx.LOG_LEVELS) == line["$defs"]["LogLevel"]["enum"]
    codes = json.loads((schemas / "error-code.json").read_text())
    want: list[str] = []
    for alt in codes["oneOf"]:
        want.extend(alt.get("enum") or [alt["const"]])
    assert list(asbx.ERROR_CODES) == want
    assert "attachment_failed" in asbx.ERROR_CODES
    # The Literal and its tuple name the same values.
    assert typing.get_args(asbx.ErrorCode) == asbx.ERROR_CODES
    assert typing.get_args(asbx.EventType) == asbx.EVENT_TYPES


def test_string_enums_are_read_from_enum_const_and_one_of() -> None:
    gen = _script("gen_unions")
    assert gen.string_enum({"type": "string", "enum": ["a", "b"]}) == ["a", "b"]
    assert gen.string_enum(
        {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "string", "const": "b", "description": "x"}]}
    ) == ["a", "b"]
    assert gen.string_enum({"oneOf": [{"type": "string", "const": "a"}, {"type": "object"}]}) is None
    assert gen.string_enum({"type": "object", "properties": {}}) is None
    assert gen.const_name("ErrorCode") == "ERROR_CODES"
    assert gen.const_name("StepStatus") == "STEP_STATUS_VALUES"


def test_every_event_type_of_the_schema_has_its_class() -> None:
    for kind in asbx.EVENT_TYPES:
        ev = parse_event(kind, {"type": kind, "seq": 1, "ts": 1, "sessionId": "s"})
        assert not isinstance(ev, UnknownEvent), f"{kind}: no event class parses it"
        assert ev.type == kind
    assert isinstance(parse_event("no_such_type", {}), UnknownEvent)

#!/usr/bin/env python3
"""Writes src/asbx/_sync.py, the blocking client, from src/asbx/_async.py.

One source for both clients (as httpcore does with its `unasync`): the
async file is the one edited; this drops `async`/`await`, maps the async
names of asyncio and httpx to their blocking twins, removes the
`AsyncClient`... prefix, and drops lines marked `# unasync: remove`. Needs
only Python. `python scripts/unasync.py` writes the file; `--check` exits 1
when it differs from what `_async.py` gives (tests/test_generated.py checks
the same).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src" / "asbx" / "_async.py"
OUT = HERE.parent / "src" / "asbx" / "_sync.py"

# Whole texts first (the module docstring's first lines), then words.
TEXTS = [
    ('"""The asyncio client, on `httpx.AsyncClient`.', '"""The blocking client, on `httpx.Client`.'),
    (
        " Client tool handlers may be plain\nfunctions or coroutine functions.\n",
        "\n",
    ),
    (
        "This file is the one source of both clients: `_sync.py` is generated from it\n"
        "by `scripts/unasync.py` (`await` dropped, `Async` names unprefixed), and\n"
        "`tests/test_generated.py` fails when the two drift.",
        "Generated from `_async.py` by `scripts/unasync.py`: edit that file and run\n"
        "the script (`tests/test_generated.py` fails when the two drift).",
    ),
    ("import asyncio\nimport builtins\n", "import builtins\n"),
    (
        "import os\nfrom collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, "
        "Mapping, Sequence\n",
        "import os\nimport time\nfrom collections.abc import Callable, Generator, Iterable, Iterator, "
        "Mapping, Sequence\n",
    ),
]
WORDS = [
    (r"\bAsyncGenerator\[([^\]]+), None\]", r"Generator[\1, None, None]"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\b_ws\.aopen_run\b", "_ws.open_run"),
    (r"\b_ws\.aopen_events\b", "_ws.open_events"),
    (r"\basync def\b", "def"),
    (r"\basync for\b", "for"),
    (r"\basync with\b", "with"),
    (r"\bawait ", ""),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\baiter_lines\b", "iter_lines"),
    (r"\baread\b", "read"),
    (r"(?<![A-Za-z0-9])(_?)Async([A-Z]\w*)", r"\1\2"),
]
REMOVE = "# unasync: remove"


def render(source: str, *, module: bool = True) -> str:
    """The blocking module for the async module `source` (`module` False: a snippet,
    without the rules for `_async.py`'s own text)."""
    for old, new in TEXTS if module else []:
        if old not in source:
            raise ValueError(f"_async.py no longer holds {old[:40]!r}: update scripts/unasync.py")
        source = source.replace(old, new)
    lines = [line for line in source.splitlines() if not line.rstrip().endswith(REMOVE)]
    out = "\n".join(lines) + "\n"
    for pattern, repl in WORDS:
        out = re.sub(pattern, repl, out)
    return out


def main(argv: list[str]) -> int:
    want = render(SRC.read_text("utf-8"))
    if "--check" in argv:
        have = OUT.read_text("utf-8") if OUT.exists() else ""
        if have != want:
            print(
                "sdk/python: src/asbx/_sync.py is out of date with _async.py; run python scripts/unasync.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUT.write_text(want, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

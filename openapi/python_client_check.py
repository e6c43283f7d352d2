"""Generates a Python client from a live workspace's OpenAPI document with
openapi-python-client and reads every GET route of real data through it.

    python python_client_check.py WORKSPACE_URL WORK_DIR

Run by openapi/python-client.sh (which starts `asbx up` and installs the
generator into a venv). Fails (exit 1) when the generator reports an error
or a warning about the document's schemas, when a generated module cannot be
imported, or when an answer does not parse into its generated model (or the
model does not give back the JSON it read).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

# Warnings about a route the generator cannot express, not about a schema:
# the NDJSON run streams and the raw-bytes file bodies (`*/*`). Every other
# line the generator prints beyond these fails the check.
BENIGN_REASON = re.compile(r"Unsupported content[ _]type (application/x-ndjson|application/x-tar|\*/\*)")
BENIGN_LINE = re.compile(
    r"^(Generating |Warning\(s\) encountered while generating|Skipping Integration$"
    r"|ruff is not in PATH$|If you believe this was a mistake)"
)

# GET routes not read here, and why.
SKIPPED = {
    # Bytes, not JSON: the kept working directory as a tar archive.
    "/api/assistant/chats/{id}/workdir.tar": "a tar archive",
    # NDJSON audit records, not run lines (`parse_ndjson` reads run lines);
    # docs/api-audit.md's examples run as tests.
    "/api/audit": "audit records, read by the docs' tests",
    "/api/runs/{id}/audit": "audit records, read by the docs' tests",
    # Endless by design: the workspace's chat events.
    "/api/assistant/events": "an endless event stream",
    # Answers only while a turn is in flight (a 404 after it ended).
    "/api/assistant/chats/{id}/stream": "only while a turn is in flight",
    # A WebSocket upgrade (101): an HTTP client generator has nothing to
    # call; the e2e `ws` tests and both SDKs drive it.
    "/api/runs/ws": "a WebSocket upgrade",
}


def fail(message: str) -> None:
    print(f"python-client: {message}", file=sys.stderr)
    sys.exit(1)


def generate(ws: str, work: Path) -> Path:
    out = work / "asbx_workspace_client"
    bindir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")
    proc = subprocess.run(
        [
            str(bindir / "openapi-python-client"),
            "generate",
            "--url",
            f"{ws}/openapi.json",
            "--output-path",
            str(out),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    text = proc.stdout + proc.stderr
    lines = [line.rstrip() for line in text.splitlines()]
    bad = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or BENIGN_LINE.match(line):
            i += 1
            continue
        if line.startswith("WARNING parsing "):
            # The reason is the next non-empty line.
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            reason = lines[j] if j < len(lines) else ""
            if not BENIGN_REASON.search(reason):
                bad.append(f"{line} {reason}")
            # The part of the document it is about follows, as indented JSON.
            i = j + 1
            while i < len(lines) and (not lines[i].strip() or lines[i][0] in " {}"):
                i += 1
            continue
        bad.append(line)
        i += 1
    if proc.returncode != 0 or bad:
        print(text, file=sys.stderr)
        fail(f"openapi-python-client exited {proc.returncode}; not accepted: {bad[:10]}")
    print(f"python-client: generated {out.name} with no schema warning", file=sys.stderr)
    return out


def request(ws: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
            content_type: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"{ws}{path}", data=data, method=method)
    if data is not None:
        req.add_header("content-type", content_type)
    with urllib.request.urlopen(req, timeout=120) as res:
        return res.status, {k.lower(): v for k, v in res.headers.items()}, res.read()


def make_data(ws: str) -> dict[str, str]:
    """An environment, an agent (MCP servers of both kinds, a skill), a file,
    a finished run, and a chat with a turn, its settings and attachment."""
    mcp = [
        {"name": "local", "command": "/bin/cat", "args": ["-u"], "env": {"MODE": "test"}},
        {"name": "remote", "url": "https://mcp.example.com/mcp"},
    ]
    skills = [{"name": "greet", "description": "says hello", "files": {"SKILL.md": "# Greet\n"}}]
    _, _, body = request(ws, "POST", "/api/environments",
                         {"name": "pyclient-env", "variables": {"GREETING": "hi"}})
    env_id = json.loads(body)["id"]
    _, _, body = request(ws, "POST", "/api/agents", {
        "name": "pyclient-agent",
        "description": "made by python-client.sh",
        "environmentId": env_id,
        "systemPrompt": "Be brief.",
        "mcpServers": mcp,
        "skills": skills,
        "limits": {"max_steps": 4},
    })
    agent_id = json.loads(body)["id"]
    _, _, body = request(ws, "POST", "/api/assistant/files?name=table.csv",
                         raw=b"a,b\n1,2\n", content_type="text/csv")
    file_id = json.loads(body)["id"]
    status, headers, _ = request(ws, "POST", "/api/runs", {"prompt": "hello"})
    run_id = headers.get("x-asbx-run-id", "")
    if status != 200 or not run_id:
        fail(f"POST /api/runs: {status}, no x-asbx-run-id")
    _, _, body = request(ws, "POST", "/api/assistant/chat/stream",
                         {"message": "hello", "attachmentIds": [file_id]})
    chat_id = ""
    for line in body.decode().splitlines():
        if line.startswith("data:"):
            data = json.loads(line[5:])
            if isinstance(data, dict) and "chatId" in data:
                chat_id = data["chatId"]
                break
    if not chat_id:
        fail("the chat turn's stream named no chatId")
    request(ws, "PUT", f"/api/assistant/chats/{chat_id}/settings", {
        "systemPrompt": "Be brief.", "environmentId": env_id, "mcpServers": mcp, "skills": skills,
    })
    return {
        "/api/agents/{id}": agent_id,
        "/api/environments/{id}": env_id,
        "/api/files/{id}": file_id,
        "/api/runs/{id}": run_id,
        "/api/runs/{id}/events": run_id,
        "/api/assistant/chats/{id}": chat_id,
        "/api/assistant/chats/{id}/workdir": chat_id,
    }


def to_plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value


def parse_ndjson(client: Any, pkg: str, path: str) -> None:
    models = importlib.import_module(f"{pkg}.models")
    res = client.get_httpx_client().get(path, headers={"accept": "application/x-ndjson"})
    if res.status_code != 200:
        fail(f"GET {path}: {res.status_code}: {res.content[:300]!r}")
    kinds = []
    for line in res.text.splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        name = "Line" + "".join(w.capitalize() for w in raw["type"].split("_"))
        model = getattr(models, name, None)
        if model is None:
            fail(f"GET {path}: no generated model {name} for a {raw['type']!r} line")
        have = model.from_dict(raw).to_dict()
        if have != raw:
            fail(f"GET {path}: {name} gave back other JSON:\n{have}\n!=\n{raw}")
        kinds.append(raw["type"])
    if "result" not in kinds and "error" not in kinds:
        fail(f"GET {path}: the run's lines have no end: {kinds}")
    print(f"python-client: GET {path} -> {len(kinds)} lines ({', '.join(sorted(set(kinds)))})",
          file=sys.stderr)


def read_everything(ws: str, package: Path, ids: dict[str, str]) -> None:
    sys.path.insert(0, str(package.parent))
    pkg = package.name
    client_mod = importlib.import_module(f"{pkg}.client")
    # Import every generated model: a model that names a module the
    # generator did not write fails here, whichever route returns it.
    for path in sorted((package / "models").glob("*.py")):
        importlib.import_module(f"{pkg}.models.{path.stem}")
    # Statuses the generator left out (a `*/*` download) are checked here.
    client = client_mod.Client(base_url=ws, raise_on_unexpected_status=False, timeout=120)
    doc = json.loads(request(ws, "GET", "/openapi.json")[2])
    read = 0
    for path, item in doc["paths"].items():
        op = item.get("get")
        if op is None:
            continue
        if path in SKIPPED:
            print(f"python-client: skip GET {path}: {SKIPPED[path]}", file=sys.stderr)
            continue
        if any("sandbox_token" in s for s in op.get("security", [])):
            # Sandbox callbacks: their bearer is a one-time token only a
            # running sandbox holds.
            print(f"python-client: skip GET {path}: a sandbox's one-time token", file=sys.stderr)
            continue
        content = op["responses"]["200"].get("content", {})
        if "application/x-ndjson" in content:
            # A stream, which the generator does not read: each NDJSON line
            # is parsed into its generated `Line` variant model instead.
            parse_ndjson(client, pkg, path.replace("{id}", ids.get(path, "")))
            read += 1
            continue
        found = list((package / "api").glob(f"*/{op['operationId']}.py"))
        if len(found) != 1:
            fail(f"GET {path}: no generated module for {op['operationId']}")
        mod = importlib.import_module(f"{pkg}.api.{found[0].parent.name}.{found[0].stem}")
        kwargs: dict[str, Any] = {"client": client}
        if "{" in path:
            if path not in ids:
                fail(f"GET {path}: no data made for it")
            kwargs["id"] = ids[path]
        response = mod.sync_detailed(**kwargs)
        if response.status_code != 200:
            fail(f"GET {path}: {response.status_code}: {response.content[:300]!r}")
        if "application/json" in content:
            parsed = response.parsed
            if parsed is None:
                fail(f"GET {path}: the generated client parsed nothing")
            have = to_plain(parsed)
            want = json.loads(response.content)
            if path == "/openapi.json":
                want = have  # a free-form object, checked by the Rust tests
            if have != want:
                fail(f"GET {path}: the model gave back other JSON:\n{have}\n!=\n{want}")
            print(f"python-client: GET {path} -> {type(parsed).__name__}", file=sys.stderr)
        else:
            print(f"python-client: GET {path} -> {response.status_code} "
                  f"({', '.join(content)})", file=sys.stderr)
        read += 1
    if read < 15:
        fail(f"read only {read} routes")
    print(f"python-client: {read} read routes parsed", file=sys.stderr)


def main() -> None:
    ws, work = sys.argv[1], Path(sys.argv[2])
    package = generate(ws, work)
    ids = make_data(ws)
    read_everything(ws, package, ids)


if __name__ == "__main__":
    main()

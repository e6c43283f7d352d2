#!/usr/bin/env python3
"""A tiny MCP server for tests: JSON-RPC 2.0 over stdio, one message a line.

Standard library only, so it runs wherever python3 does (also inside an asbx
sandbox). Tools:

- add {a, b}: the sum, as text and as structured content {"sum": ...}.
- fail {message}: a result with isError true and the message as text.
- info {}: the working directory, the ECHO_GREETING variable and the pid, as
  JSON text.
- sleep {seconds}: sleeps, then answers "slept" (for timeouts).

It writes a line to stderr when it starts (stderr must never reach the
agent's NDJSON stdout). With --crash it exits at once with code 3 after
writing a reason to stderr (a server that fails to start).
"""

import json
import os
import sys
import time

PROTOCOL = "2025-06-18"

TOOLS = [
    {
        "name": "add",
        "description": "Add two numbers.",
        "inputSchema": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
    {
        "name": "fail",
        "description": "Always fails with the given message.",
        "inputSchema": {
            "type": "object",
            "properties": {"message": {"type": "string"}},
        },
    },
    {
        "name": "info",
        "description": "Working directory, ECHO_GREETING and pid.",
        "inputSchema": {"type": "object", "properties": {}},
    },
    {
        "name": "sleep",
        "description": "Sleep for a number of seconds.",
        "inputSchema": {
            "type": "object",
            "properties": {"seconds": {"type": "number"}},
        },
    },
]


def call(name, args):
    if name == "add":
        total = args.get("a", 0) + args.get("b", 0)
        if isinstance(total, float) and total.is_integer():
            total = int(total)
        return {
            "content": [{"type": "text", "text": str(total)}],
            "structuredContent": {"sum": total},
            "isError": False,
        }
    if name == "fail":
        msg = args.get("message", "deliberate failure")
        return {"content": [{"type": "text", "text": msg}], "isError": True}
    if name == "info":
        info = {
            "cwd": os.getcwd(),
            "greeting": os.environ.get("ECHO_GREETING"),
            "pid": os.getpid(),
        }
        return {"content": [{"type": "text", "text": json.dumps(info)}]}
    if name == "sleep":
        time.sleep(float(args.get("seconds", 1)))
        return {"content": [{"type": "text", "text": "slept"}]}
    return None


def answer(msg):
    method = msg.get("method")
    if method == "initialize":
        return {
            "protocolVersion": PROTOCOL,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "echo-server", "version": "1.0.0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        params = msg.get("params") or {}
        return call(params.get("name"), params.get("arguments") or {})
    return None


def main():
    if "--crash" in sys.argv:
        sys.stderr.write("echo_server: crashing on purpose\n")
        sys.stderr.flush()
        sys.exit(3)
    sys.stderr.write("echo_server: ready\n")
    sys.stderr.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg or "method" not in msg:
            continue  # a notification or a response
        result = answer(msg)
        if result is None:
            out = {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32601, "message": "unknown method or tool"},
            }
        else:
            out = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Reconnect and retry settings against a local scripted HTTP server (no asbx needed):
a 503 with `Retry-After` then 200, a stream dropped several times, the settings read
from `ASBX_URL` / `ASBX_API_KEY`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import asbx
from asbx import AsyncClient, Client

Handler = Callable[[BaseHTTPRequestHandler, int], None]


class Scripted:
    """A loopback HTTP server answering `"METHOD /path?query"` with a handler; it counts calls."""

    def __init__(self, routes: dict[str, Handler]) -> None:
        self.routes = routes
        self.calls: list[str] = []
        self.auth: list[str | None] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                key = f"{self.command} {self.path}"
                n = sum(1 for c in outer.calls if c == key)
                outer.calls.append(key)
                outer.auth.append(self.headers.get("authorization"))
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                handler = outer.routes.get(key)
                if handler is None:
                    send(self, 404, {"code": "not_found", "detail": key})
                else:
                    handler(self, n)

            do_GET = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def send(h: BaseHTTPRequestHandler, status: int, body: object, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    h.send_response(status)
    h.send_header("content-type", "application/json" if status < 400 else "application/problem+json")
    h.send_header("content-length", str(len(data)))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def line(seq: int, kind: str, **extra: object) -> bytes:
    return (json.dumps({"seq": seq, "ts": 1, "sessionId": "r1", "type": kind, **extra}) + "\n").encode()


def ndjson_then_drop(h: BaseHTTPRequestHandler, data: bytes) -> None:
    """Answers `data` as the start of a longer body, then closes: a dropped connection."""
    h.send_response(200)
    h.send_header("content-type", "application/x-ndjson")
    h.send_header("x-asbx-run-id", "r1")
    h.send_header("content-length", str(len(data) + 1000))
    h.end_headers()
    h.wfile.write(data)
    h.wfile.flush()
    h.close_connection = True


def ndjson(h: BaseHTTPRequestHandler, data: bytes) -> None:
    h.send_response(200)
    h.send_header("content-type", "application/x-ndjson")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


@pytest.fixture()
def scripted() -> Iterator[Callable[[dict[str, Handler]], Scripted]]:
    servers: list[Scripted] = []

    def make(routes: dict[str, Handler]) -> Scripted:
        servers.append(Scripted(routes))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


MODELS = {"models": [{"id": "scripted:test", "default": True}]}


def busy_then_ok(h: BaseHTTPRequestHandler, n: int) -> None:
    if n == 0:
        send(h, 503, {"code": "at_capacity", "status": 503, "detail": "busy"}, {"retry-after": "1"})
    else:
        send(h, 200, MODELS)


def test_a_503_with_retry_after_is_sent_again_after_the_wait(scripted: Callable[..., Scripted]) -> None:
    srv = scripted({"GET /api/models": busy_then_ok})
    with Client(srv.url, initial_delay_ms=1) as c:
        t0 = time.monotonic()
        models = c.list_models()
        waited = time.monotonic() - t0
    assert [m.id for m in models] == ["scripted:test"]
    assert srv.calls == ["GET /api/models"] * 2
    assert waited >= 0.9, f"Retry-After: 1 honoured, waited {waited:.2f} s"
    # Without retries the 503 is the caller's, typed.
    srv2 = scripted({"GET /api/models": busy_then_ok})
    with Client(srv2.url, max_retries=0) as c, pytest.raises(asbx.ServerError) as e:
        c.list_models()
    assert e.value.status == 503 and e.value.code == "at_capacity"


def test_retries_stop_at_max_retries_and_other_errors_are_not_retried(
    scripted: Callable[..., Scripted],
) -> None:
    srv = scripted(
        {
            "GET /api/models": lambda h, n: send(h, 429, {"code": "rate_limited"}, {"retry-after": "0"}),
            "GET /api/runs/x": lambda h, n: send(h, 500, {"code": "internal"}),
        }
    )
    with Client(srv.url, max_retries=3, initial_delay_ms=1) as c:
        with pytest.raises(asbx.AsbxError) as e:
            c.list_models()
        assert e.value.status == 429
        assert srv.calls.count("GET /api/models") == 4, srv.calls
        with pytest.raises(asbx.ServerError):
            c.get_run("x")
        assert srv.calls.count("GET /api/runs/x") == 1, "a 500 is not retried"


def run_routes(drops: int) -> dict[str, Handler]:
    """A run whose first answer drops after seq 1, whose next `drops` re-reads drop
    before any line, and whose re-read after that gives the rest."""
    rest = line(2, "delta", text="hi") + line(
        3, "session_ended", reason="completed", terminatedBy="agent", stats={}
    )

    def events(h: BaseHTTPRequestHandler, n: int) -> None:
        if n < drops:
            ndjson_then_drop(h, b"")
        else:
            ndjson(h, rest)

    return {
        "POST /api/runs": lambda h, n: ndjson_then_drop(h, line(1, "session_init", protocolVersion=2, limits={})),
        "GET /api/runs/r1/events?after=1": events,
    }


def test_a_stream_dropped_several_times_resumes_within_max_attempts(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(run_routes(drops=3))
    with Client(srv.url, max_attempts=4, initial_delay_ms=1, backoff_multiplier=1.5) as c:
        run = c.run("x")
        seqs = [ev.seq for ev in run]
    assert seqs == [1, 2, 3]
    assert run.resumes == 4 and srv.calls.count("GET /api/runs/r1/events?after=1") == 4


def test_a_stream_dropped_past_max_attempts_fails_typed(scripted: Callable[..., Scripted]) -> None:
    srv = scripted(run_routes(drops=3))
    with Client(srv.url, max_attempts=3, initial_delay_ms=1) as c:
        run = c.run("x")
        seen = []
        with pytest.raises(asbx.StreamError) as e:
            for ev in run:
                seen.append(ev.seq)
    assert seen == [1]
    assert e.value.code == "connection_lost"
    assert srv.calls.count("GET /api/runs/r1/events?after=1") == 3, "max_attempts reconnects, no more"


def test_the_async_client_takes_the_same_knobs(scripted: Callable[..., Scripted]) -> None:
    ok = scripted(run_routes(drops=2))
    bad = scripted(run_routes(drops=2))

    async def main() -> None:
        async with AsyncClient(ok.url, max_attempts=3, initial_delay_ms=1) as c:
            run = await c.run("x")
            assert [ev.seq for ev in await run.wait()] == [1, 2, 3]
        async with AsyncClient(bad.url, max_attempts=2, initial_delay_ms=1) as c:
            run = await c.run("x")
            with pytest.raises(asbx.StreamError) as e:
                await run.wait()
            assert e.value.code == "connection_lost"
        srv = scripted({"GET /api/models": busy_then_ok})
        async with AsyncClient(srv.url) as c:
            assert [m.id for m in await c.list_models()] == ["scripted:test"]
        assert srv.calls == ["GET /api/models"] * 2

    asyncio.run(main())


def test_the_url_and_key_come_from_the_environment(
    scripted: Callable[..., Scripted], monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = scripted({"GET /api/models": lambda h, n: send(h, 200, MODELS)})
    monkeypatch.setenv("ASBX_URL", srv.url)
    monkeypatch.setenv("ASBX_API_KEY", "asbx_key_from_env")
    with Client() as c:
        c.list_models()
    with Client(api_key="asbx_key_given") as c:
        c.list_models()
    assert srv.auth == ["Bearer asbx_key_from_env", "Bearer asbx_key_given"]
    monkeypatch.delenv("ASBX_URL")
    with pytest.raises(ValueError, match="ASBX_URL"):
        Client()


def test_reconnect_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:9", backoff_multiplier=0.5)
    with pytest.raises(ValueError):
        Client("http://127.0.0.1:9", max_attempts=-1)

"""A real `asbx up` for the tests (scripted model, temp data dir), and a TCP
proxy that can cut a connection mid-stream.

The binary is `$ASBX_BIN`, else `target/debug/asbx` of this repository
(`cargo build -p asbx`). The jailed runner needs root. Missing either, the
tests that need a workspace skip, saying why. Every `asbx up` is ended by its
PID, and the teardown checks that no session folder and no cgroup of it is
left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asbx import Client

REPO = Path(__file__).resolve().parents[3]
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _binary() -> Path:
    return Path(os.environ.get("ASBX_BIN") or REPO / "target" / "debug" / "asbx")


def _skip_reason() -> str | None:
    if not _binary().is_file():
        return f"no asbx binary at {_binary()} (run `cargo build -p asbx` or set ASBX_BIN)"
    if os.geteuid() != 0:
        return "the jailed runner of `asbx up` needs root"
    return None


class AsbxUp:
    """`asbx up --listen 127.0.0.1:0` on a temp data dir; `url` from its banner."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.data = Path(tempfile.mkdtemp(prefix="asbx-sdk-py-"))
        full = {
            k: v
            for k, v in os.environ.items()
            if k
            not in {
                "OPENAI_API_KEY",
                "OPENAI_BASE_URL",
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_BASE_URL",
                "ASBX_MODEL",
                "ASBX_RUNNER_TOKEN",
                "ASBX_METRICS_TOKEN",
                "ASBX_REQUIRE_AUTH",
                "DATABASE_URL",
            }
        }
        full.update({"ASBX_DATA": str(self.data), "ASBX_LOG": "warn"})
        full.update(env or {})
        self.env = full
        profile = os.environ.get("ASBX_TEST_PROFILE", "strict")
        self.proc = subprocess.Popen(
            [str(_binary()), "up", "--listen", "127.0.0.1:0", "--profile", profile],
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        url = None
        deadline = time.monotonic() + 60
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            line = line.strip()
            if line.startswith("open"):
                url = line[len("open") :].strip()
                break
        if url is None:
            self.stop()
            shutil.rmtree(self.data, ignore_errors=True)
            raise RuntimeError("`asbx up` printed no `open URL` banner line")
        self.url = url
        out = self.proc.stdout
        threading.Thread(target=lambda: [None for _ in out], daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def new_key(self, workspace: str | None = None) -> str:
        """Mints an API key with `asbx key` (for the default workspace, or a new one)."""
        args = [str(_binary()), "key"] + (["--new-workspace", workspace] if workspace else [])
        out = subprocess.run(args, env=self.env, capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            if line.startswith("key"):
                return line[3:].strip()
        raise AssertionError(f"no key line in {out.stdout!r}")

    def sessions_left(self) -> list[str]:
        d = self.data / "runner" / "sessions"
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def cgroups_left(self) -> list[str]:
        mark = f"asbx-warm-{self.pid}-"
        left = []
        for ctrl in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
            d = ctrl / "asbx"
            if d.is_dir():
                left += [f"{ctrl.name}/{p.name}" for p in d.iterdir() if p.name.startswith(mark)]
        return left

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 5 s."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def close_and_check(self) -> None:
        # Teardown is asynchronous: what is checked is that nothing stays.
        deadline = time.monotonic() + 20
        while self.sessions_left() and time.monotonic() < deadline:
            time.sleep(0.05)
        sessions = self.sessions_left()
        self.stop()
        deadline = time.monotonic() + 10
        while self.cgroups_left() and time.monotonic() < deadline:
            time.sleep(0.05)
        cgroups = self.cgroups_left()
        shutil.rmtree(self.data, ignore_errors=True)
        assert not sessions, f"session folders left behind: {sessions}"
        assert not cgroups, f"cgroups left behind: {cgroups}"


def _start(env: dict[str, str] | None = None) -> Iterator[AsbxUp]:
    reason = _skip_reason()
    if reason:
        print(f"\nSKIP: {reason}")
        pytest.skip(reason)
    up = AsbxUp(env)
    try:
        yield up
    finally:
        up.close_and_check()


@pytest.fixture(scope="session")
def up() -> Iterator[AsbxUp]:
    """An open workspace (no auth)."""
    yield from _start()


@pytest.fixture(scope="session")
def up_auth() -> Iterator[AsbxUp]:
    """A workspace started with ASBX_REQUIRE_AUTH=true."""
    yield from _start({"ASBX_REQUIRE_AUTH": "true"})


class CuttingProxy:
    """A loopback TCP proxy to `target` that cuts, once, the first connection
    whose answer contains `marker`: it forwards the bytes up to a few past the
    marker (mid-line), then closes both sides, as a dropped network would."""

    def __init__(self, target_url: str) -> None:
        hostport = target_url.split("://", 1)[1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        self.target = (host, int(port))
        self.marker: bytes | None = None
        self.cuts = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def client(self) -> Client:
        """A client through this proxy (it names the workspace's own `Host`, which it checks)."""
        host = f"{self.target[0]}:{self.target[1]}"
        return Client(self.url, headers={"host": host})

    def cut_once(self, marker: bytes) -> None:
        with self._lock:
            self.marker = marker

    def close(self) -> None:
        self._closed = True
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        seen = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers and self.marker is not None:
                    seen += data
                    with self._lock:
                        marker = self.marker
                        at = seen.find(marker) if marker else -1
                        if at >= 0:
                            self.marker = None
                            self.cuts += 1
                    if marker and at >= 0:
                        # Forward up to a few bytes past the marker: the line is cut mid-way.
                        end = at + len(marker) + 8
                        keep = len(data) - (len(seen) - end)
                        dst.sendall(data[: max(0, min(len(data), keep))])
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.fixture()
def proxy(up: AsbxUp) -> Iterator[CuttingProxy]:
    p = CuttingProxy(up.url)
    try:
        yield p
    finally:
        p.close()

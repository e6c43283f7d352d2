"""The package and tests/typing/usage.py pass `mypy --strict`: the bodies are typed,
and the misuse marked in usage.py is caught. Skipped out loud without mypy
(test.sh installs it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]


def test_the_sdk_and_its_typed_usage_pass_mypy_strict() -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.skip("mypy is not installed (test.sh installs it)")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--warn-unused-ignores",
            "--no-incremental",
            "--cache-dir=/dev/null",
            str(SDK / "src" / "asbx"),
            str(SDK / "tests" / "typing" / "usage.py"),
        ],
        capture_output=True,
        text=True,
        cwd=SDK,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr

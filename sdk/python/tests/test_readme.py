"""The README's example runs as written, against a real `asbx up`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import AsbxUp

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs_as_written(up: AsbxUp) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "one python example in the README"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 10, "the example stays ten lines"
    env = {**os.environ, "ASBX_URL": up.url}
    env.pop("ASBX_API_KEY", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "This is the scripted model, not a real model." in lines[0], out.stdout
    assert lines[-1] == "thanks completed", out.stdout

"""The README's walkthrough, run top to bottom against a live stack, so it stays true.

Its shell blocks (steps 2 and 3) are taken from README.md as written and run by bash in a
scratch folder, with what a reader would have instead of the test's stack: the operator
key `make up` prints (`OP=gk_...`), `localhost:8000` (the stack's address) and the
client installed in `.venv`. The test plays the beat while they run.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from tests.factories import operator_key
from tests.worker_harness import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def walkthrough_blocks() -> list[str]:
    """The ```sh blocks of the README's walkthrough section, in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Walkthrough", 1)[1].split("\n## ", 1)[0]
    return [textwrap_dedent(block) for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def textwrap_dedent(block: str) -> str:
    lines = block.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)


def test_the_readme_walkthrough_runs_top_to_bottom(ops, tmp_path):
    blocks = walkthrough_blocks()
    assert len(blocks) >= 2, "the walkthrough's shell blocks were not found"
    host_port = ops.api_url.removeprefix("http://")
    script = "\n".join(blocks)
    assert "OP=gk_..." in script, "step 2 no longer sets OP as the reader would"
    script = script.replace("OP=gk_...", f"OP={operator_key()}")
    script = script.replace("localhost:8000", host_port)
    script = script.replace(".venv/bin/gantry", str(ROOT / ".venv" / "bin" / "gantry"))
    env = {
        **os.environ,
        "GANTRY_API_URL": ops.api_url,
        "GANTRY_CONFIG": str(tmp_path / "gantry.toml"),
    }
    env.pop("GANTRY_API_KEY", None)
    done: dict = {}

    def run():
        done["result"] = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    ops.until(lambda: "result" in done, timeout=240)
    result = done["result"]
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{ops.logs()}"
    gif = Path(tmp_path / "fox.gif")
    assert gif.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    assert "succeeded" in result.stdout + result.stderr

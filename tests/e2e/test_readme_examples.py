"""The README's Python examples that talk to the server, run as a person would run them:
each fenced ``python`` block that names the default address, in its own interpreter, against
a real server on a loopback port (the echo engine of tests/webui_fakes.py), with only the
port changed. They use the standard library and the ``openai`` client, nothing else."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from webui_fakes import app, build_daemon, daemon, fake_chat, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e
DEFAULT_URL = "http://127.0.0.1:8765"


def server_examples() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    return [b for b in blocks if DEFAULT_URL in b]


def run_example(code: str, url: str, tmp_path) -> subprocess.CompletedProcess:
    # the loopback server must not be reached through a proxy from the environment
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    # requests is in the test environment but not in a person's: make it absent here too
    code = "import sys\nsys.modules['requests'] = None\n" + code.replace(DEFAULT_URL, url)
    return subprocess.run([sys.executable, "-c", code], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_readme_has_server_examples():
    examples = server_examples()
    assert examples, "no ```python block in README.md talks to the server"
    for code in examples:
        compile(code, "README.md", "exec")
        imported = set(re.findall(r"^(?:from|import) (\w+)", code, re.M))
        # what a person has: the standard library, and the client the example is about
        assert imported <= {"json", "urllib", "openai"}, imported


def test_the_openai_example_runs_and_rates_its_reply(live, store, fake_chat, tmp_path):
    pytest.importorskip("openai")
    [code] = [c for c in server_examples() if "openai" in c]
    done = run_example(code, live.url, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "echo: Explain LoRA briefly" in done.stdout
    assert done.stdout.rstrip().endswith("echo: Hi")  # the streamed reply, printed as it came
    first, second = store.history(limit=None, oldest_first=True)
    assert first.user_message == "Explain LoRA briefly" and second.user_message == "Hi"
    assert first.rating is not None and first.rating.score == 5  # rated by its completion id
    assert second.rating is None


def test_every_server_example_runs(live, tmp_path):
    pytest.importorskip("openai")
    for code in server_examples():
        done = run_example(code, live.url, tmp_path)
        assert done.returncode == 0, f"{code}\n{done.stderr[-3000:]}"

"""`reinf rewards preview` and `reinf status` as real processes, with a real hook file."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import clean_env

pytestmark = pytest.mark.e2e


def reinf(home, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "reinf", *args], env=clean_env(home),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def rated(home, store):
    """Two rated turns and a config that switches the hook file on."""
    (home / "config.yaml").write_text(
        "rewards:\n  reward_mapper: reward_mapper.py:reward_mapper\n"
        "  hook_timeout_seconds: 0.5\n  critics: {repetition: 1.0}\n")
    for score, reply in ((5, "Boil it for nine minutes."), (2, "egg egg egg egg egg egg")):
        conv = store.create_conversation().id
        turn = store.append_turn(conv, "How long?", reply, prompt_ids=[1], reply_ids=[2, 3],
                                 logprobs=[-1.0, -1.0])
        store.rate(turn.id, score)
    return home / "reward_mapper.py"


def test_preview_follows_edits_and_fails_cleanly(rated):
    rated.write_text("def reward_mapper(score, metadata):\n    return score - 3\n")
    out = reinf(rated.parent, "rewards", "preview", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["human_reward"] for r in data["rows"]] == [-1.0, 2.0]
    assert data["rows"][0]["critics"]["repetition"] == -1.0  # "egg egg egg ..." loops
    assert data["rows"][1]["reward"] == pytest.approx((2.0 + 1.0) / 2)

    rated.write_text("def reward_mapper(score, metadata):\n    return metadata['nope']\n")
    out = reinf(rated.parent, "rewards", "preview")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(
        f"Error: reward hook {rated.resolve()}:2: KeyError: 'nope'")
    assert "Traceback" not in out.stderr and "Traceback" not in out.stdout


def test_a_hung_hook_does_not_hang_status(rated):
    rated.write_text("import time\ndef reward_mapper(score, metadata):\n    time.sleep(600)\n")
    started = time.monotonic()
    out = reinf(rated.parent, "status", "--json")
    assert time.monotonic() - started < 30
    assert out.returncode == 0, out.stderr
    hook = json.loads(out.stdout)["reward_hook"]
    assert hook["ok"] is False and hook["line"] == 3 and "hook_timeout_seconds" in hook["error"]
    text = reinf(rated.parent, "status").stdout
    assert "(BROKEN)" in text and "reward_mapper.py:3" in text

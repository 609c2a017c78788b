"""Two processes write ratings while a third reads: no 'database is locked', nothing lost."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

WRITER = textwrap.dedent("""
    import sys
    from reinf.storage.store import Store
    url, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store(url, migrate=False)
    conv = store.create_conversation(title=tag).id
    for i in range(n):
        t = store.append_turn(conv, f"{tag}-{i}", "reply", prompt_ids=[1, 2, 3],
                              reply_ids=[4, 5], logprobs=[-0.1, -0.2])
        store.rate(t.id, 1 + i % 5, tags=[tag])
        if i % 7 == 0:
            store.rate(t.id, 5)  # a re-rate in the middle of the stream
            store.rate(t.id, 1 + i % 5, tags=[tag])
    print("ok")
""")

READER = textwrap.dedent("""
    import json, sys, time
    from reinf.storage.store import Store
    store = Store(sys.argv[1], migrate=False)
    seen, reads = 0, 0
    deadline = time.time() + 60
    while time.time() < deadline:
        counts = store.counts()
        store.history(limit=50)
        store.training_samples(64)
        assert counts["ratings"] >= seen, "ratings went backwards"
        seen = counts["ratings"]
        reads += 1
        if seen >= int(sys.argv[2]):
            break
    print(json.dumps({"reads": reads, "seen": seen}))
""")


def test_two_writers_and_a_reader(store, tmp_path):
    n = 120
    url = store.url
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, url, tag, str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for tag in ("alpha", "beta")]
    reader = subprocess.Popen([sys.executable, "-c", READER, url, str(2 * n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=120) for p in writers + [reader]]
    for p, (out, err) in zip(writers + [reader], outs):
        assert p.returncode == 0, err
        assert "database is locked" not in err
    result = json.loads(outs[2][0])
    assert result["reads"] > 1
    # Count every row: nothing lost.
    assert store.counts()["turns"] == 2 * n
    assert store.counts()["ratings"] == 2 * n
    for tag in ("alpha", "beta"):
        rows = store.history(tag=tag, limit=None)
        assert sorted(r.user_message for r in rows) == sorted(f"{tag}-{i}" for i in range(n))
        assert all(r.rating.score == 1 + int(r.user_message.split("-")[1]) % 5 for r in rows)
    assert store.integrity_check() == "ok"

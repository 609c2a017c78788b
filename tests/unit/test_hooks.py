"""User hook files: loading, reloading on change, custom critics, and every way they can fail.

Hooks run in a child process (about 0.1-0.3 s each), so these tests start real children.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from reinf.errors import HookError
from reinf.rewards import hooks
from reinf.rewards.mapper import (FAILURE_FILE, check_hook, compute_rewards, hook_status,
                                  hook_template, preview)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def hook(home):
    return home / "reward_mapper.py"


@pytest.fixture
def hooked(config, hook):
    """The config with reward_mapper pointing at the hook file (relative to the data dir)."""
    return config.replace(reward_mapper="reward_mapper.py:reward_mapper",
                          hook_timeout_seconds=0.5)


def add_rated(store, score, *, tags=None, critical=False, reply="A fine reply."):
    conv = store.create_conversation().id
    turn = store.append_turn(conv, "question?", reply, prompt_ids=[1, 2], reply_ids=[3, 4, 5],
                             logprobs=[-1.0, -1.0, -1.0])
    store.rate(turn.id, score, tags=tags, critical=critical, comment=f"c{score}")
    return turn.id


def ratings(store):
    return [(t.id, t.rating.score, t.rating.tags, t.rating.comment, t.rating.critical,
             t.rating.updated_at) for t in store.history(rated=True, limit=None)]


# --- where the hook is ----------------------------------------------------------------------

def test_parse_spec(home):
    assert hooks.parse_spec("default", home) is None
    spec = hooks.parse_spec("reward_mapper.py:my_fn", home)
    assert spec.path == (home / "reward_mapper.py").resolve() and spec.function == "my_fn"
    assert hooks.parse_spec("/abs/x.py", home).function == "reward_mapper"
    assert hooks.parse_spec("/abs/x.py", home).path == Path("/abs/x.py")
    for bad in ("defualt", "x.txt:fn", ""):
        with pytest.raises(HookError, match="neither 'default'"):
            hooks.parse_spec(bad, home)


# --- a working hook -------------------------------------------------------------------------

def test_edit_changes_the_next_preview_without_restart(hooked, hook, store):
    add_rated(store, 4)
    write(hook, "def reward_mapper(score, metadata):\n    return 0.25\n")
    assert preview(hooked, store, 5)[0]["reward"] == 0.25
    assert hook_status(hooked)["ok"]
    before = os.stat(hook)
    # Same size and the same mtime: only the content differs, as with a quick editor save.
    write(hook, "def reward_mapper(score, metadata):\n    return 0.75\n")
    os.utime(hook, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert preview(hooked, store, 5)[0]["reward"] == 0.75
    write(hook, "def reward_mapper(score, metadata):\n    return score / 10 - 1\n")
    os.utime(hook, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    assert preview(hooked, store, 5)[0]["reward"] == pytest.approx(-0.6)


def test_status_revalidates_when_the_file_changes(hooked, hook, monkeypatch):
    calls = []
    real = hooks.run_hook
    monkeypatch.setattr(hooks, "run_hook", lambda *a, **k: calls.append(1) or real(*a, **k))
    write(hook, "def reward_mapper(score, metadata):\n    return 1 / 0\n")
    first = hook_status(hooked)
    assert not first["ok"] and "ZeroDivisionError" in first["error"] and first["line"] == 2
    assert hook_status(hooked) == first and len(calls) == 1  # cached: no second child
    before = os.stat(hook)
    write(hook, "def reward_mapper(score, metadata):\n    return 1 / 2\n")
    os.utime(hook, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert hook_status(hooked)["ok"] and len(calls) == 2


def test_template_switched_on_adds_a_brevity_bonus(config, hook, store):
    write(hook, hook_template())
    cfg = config.replace(reward_mapper="reward_mapper.py:reward_mapper",
                         critics={"politeness": 1.0}, critic_combine="min")
    short = add_rated(store, 5, reply="Thanks, glad to help.")
    long = add_rated(store, 5, reply="x" * 300 + ".")
    bad = add_rated(store, 1, reply="No.")
    rows = {r["turn_id"]: r for r in preview(cfg, store, 10)}
    assert rows[short]["human_reward"] == pytest.approx(1.1)  # default 1.0 + brevity 0.1
    assert rows[long]["human_reward"] == pytest.approx(1.0)
    assert rows[bad]["human_reward"] == pytest.approx(-1.0)  # no bonus for a bad reply
    assert rows[short]["critics"] == {"politeness": 0.5} and rows[short]["reward"] == 0.5
    assert rows[long]["critics"] == {"politeness": 0.0}


def test_hook_critics_and_sibling_imports(hooked, hook, store):
    write(hook.parent / "helpers.py", "def shout(text):\n    return text.isupper()\n")
    write(hook, """\
        import helpers
        def reward_mapper(score, metadata):
            print("debug output must not break anything")
            return float(score)
        def critic_shouting(prompt, response, metadata):
            return -1.0 if helpers.shout(response) else 0.5
        def critic_length(prompt, response, metadata):
            return 0.125
        """)
    loud = add_rated(store, 2, reply="STOP SHOUTING")
    calm = add_rated(store, 2, reply="Fine.")
    cfg = hooked.replace(critics={"shouting": 1.0, "length": 1.0}, critic_combine="min",
                         reward_min=-5.0, reward_max=5.0)
    rows = {r.turn_id: r for r in compute_rewards(cfg, store.training_samples(10))}
    assert rows[loud].critics == {"shouting": -1.0, "length": 0.125}  # the hook's length wins
    assert rows[calm].critics == {"shouting": 0.5, "length": 0.125}
    assert rows[loud].human_reward == 2.0 and rows[loud].reward == -1.0


# --- every way a hook can fail --------------------------------------------------------------

FAILURES = {
    "syntax error": ("def reward_mapper(score, metadata)\n    return 1\n", 1, "SyntaxError"),
    "exception": ("def reward_mapper(score, metadata):\n    x = 0\n    return score / x\n", 3,
                  "ZeroDivisionError: division by zero"),
    "exception at import": ("import no_such_module_here\n", 1, "ModuleNotFoundError"),
    "nan": ("def reward_mapper(score, metadata):\n    return float('nan')\n", 1, "returned nan"),
    "infinity": ("def reward_mapper(score, metadata):\n    return -1e999\n", 1, "returned -inf"),
    "string": ("def reward_mapper(score, metadata):\n    return 'good'\n", 1,
               "returned 'good' (str)"),
    "bool": ("def reward_mapper(score, metadata):\n    return True\n", 1, "(bool)"),
    "none": ("def reward_mapper(score, metadata):\n    pass\n", 1, "returned None"),
    "slow": ("import time\ndef reward_mapper(score, metadata):\n    time.sleep(60)\n", 3,
             "took longer than 0.5 s"),
    "exit": ("import sys\ndef reward_mapper(score, metadata):\n    sys.exit(3)\n", 3,
             "SystemExit: 3"),
    "process dies": ("import os\ndef reward_mapper(score, metadata):\n    os._exit(3)\n", None,
                     "exited with code 3"),
    "no function": ("def mapper(score, metadata):\n    return 1.0\n", None,
                    "no function reward_mapper() in the file (it defines: mapper)"),
    "bad critic": ("def reward_mapper(score, metadata):\n    return 1.0\n"
                   "def critic_politeness(prompt, response, metadata):\n    return 3\n", 3,
                   "outside [-1, 1]"),
    "missing critic": ("def reward_mapper(score, metadata):\n    return 1.0\n", None,
                       "the file has no critic_politeness()"),
}


@pytest.mark.parametrize("mode", list(FAILURES))
def test_a_broken_hook_stops_training_with_a_clear_error(mode, hooked, hook, store, caplog):
    source, line, needle = FAILURES[mode]
    write(hook, source)
    cfg = hooked.replace(critics={"politeness": 1.0}) if "critic" in mode else hooked
    add_rated(store, 5, tags="great tone")
    add_rated(store, 2, critical=True)
    before, counts = ratings(store), store.counts()
    where = f"{hook.resolve()}:{line}:" if line else f"{hook.resolve()}:"

    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="reinf.rewards.mapper"):
        with pytest.raises(HookError) as err:
            compute_rewards(cfg, store.training_samples(100))
    assert time.monotonic() - started < 8  # the child's own timer, not the parent's slack
    assert f"reward hook {where}" in err.value.message and needle in err.value.message
    assert "training is paused" in str(err.value)
    assert any(needle in r.getMessage() for r in caplog.records if r.name == "reinf.rewards.mapper")

    status = hook_status(cfg)
    assert not status["ok"] and status["path"] == str(hook.resolve())
    assert needle in status["error"] and status["line"] == line
    with pytest.raises(HookError, match="reward hook"):
        check_hook(cfg)
    with pytest.raises(HookError):
        preview(cfg, store, 10)

    assert ratings(store) == before and store.counts() == counts  # nothing lost or changed
    third = add_rated(store, 3)  # and rating still works while the hook is broken
    assert store.get_turn(third).rating.score == 3


def test_a_hung_import_is_killed(hooked, hook):
    write(hook, "import time\nwhile True:\n    time.sleep(1)\n")
    started = time.monotonic()
    status = hook_status(hooked.replace(hook_import_timeout_seconds=0.5))
    assert time.monotonic() - started < 8
    assert not status["ok"] and status["line"] == 3
    assert "took longer than 0.5 s while importing the file" in status["error"]


def test_a_hook_that_disarms_the_child_timer_is_still_killed(hooked, hook, monkeypatch, store):
    monkeypatch.setattr(hooks, "SLACK_SECONDS", 1.0)
    write(hook, """\
        import faulthandler, time
        def reward_mapper(score, metadata):
            faulthandler.cancel_dump_traceback_later()
            time.sleep(60)
        """)
    add_rated(store, 4)
    started = time.monotonic()
    with pytest.raises(HookError, match="took longer than 0.5 s while scoring turn"):
        compute_rewards(hooked, store.training_samples(10))
    assert time.monotonic() - started < 8


def test_missing_or_unreadable_file(hooked, hook):
    status = hook_status(hooked)
    assert not status["ok"] and "file not found" in status["error"]
    assert "reinf init" in status["fix"]
    hook.parent.mkdir(parents=True)
    hook.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(HookError, match="not UTF-8"):
        compute_rewards(hooked, [])


def test_a_failure_on_real_data_shows_in_status_until_fixed(hooked, hook, store):
    write(hook, """\
        def reward_mapper(score, metadata):
            if "poison" in metadata["tags"]:
                raise ValueError("cannot score this one")
            return 0.0
        """)
    add_rated(store, 4)
    bad = add_rated(store, 1, tags="poison")
    assert hook_status(hooked)["ok"]  # the example ratings do not trip it
    with pytest.raises(HookError, match=f"for turn {bad}"):
        compute_rewards(hooked, store.training_samples(10))
    status = hook_status(hooked)
    assert not status["ok"] and status["line"] == 3 and "cannot score" in status["error"]
    with pytest.raises(HookError, match="cannot score"):
        check_hook(hooked)
    store.forget_turn(bad)
    check_hook(hooked, store)  # runs on what training would use: fine now, and remembered
    assert hook_status(hooked)["ok"]
    assert not (hooked.data_dir / FAILURE_FILE).exists()


def test_failure_record_is_tied_to_the_file_content(hooked, hook, store):
    write(hook, "def reward_mapper(score, metadata):\n"
                "    return [score, 'x'][metadata['turn_id'] > 0]\n")
    add_rated(store, 4)
    with pytest.raises(HookError, match=r"returned 'x' \(str\)"):
        compute_rewards(hooked, store.training_samples(10))
    record = json.loads((hooked.data_dir / FAILURE_FILE).read_text())
    assert record["line"] == 1 and "turn" in record["message"]
    write(hook, "def reward_mapper(score, metadata):\n    return float(score)\n")
    assert hook_status(hooked)["ok"]  # an edited file is judged afresh


def test_preview_cli_exits_nonzero_with_the_error(invoke, hook, home, store):
    write(home / "config.yaml", "rewards:\n  reward_mapper: reward_mapper.py:reward_mapper\n")
    write(hook, "def reward_mapper(score, metadata):\n    return {}['missing']\n")
    add_rated(store, 4)
    result = invoke("rewards", "preview")
    assert result.exit_code == 1
    assert f"reward hook {hook.resolve()}:2: KeyError: 'missing'" in result.output
    result = invoke("rewards", "preview", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output[: result.output.rindex("}") + 1])
    assert data["ok"] is False and data["line"] == 2 and "KeyError" in data["error"]
    write(hook, "def reward_mapper(score, metadata):\n    return -0.125\n")
    result = invoke("rewards", "preview", "--json")
    assert result.exit_code == 0 and json.loads(result.output)["rows"][0]["reward"] == -0.125


def test_status_shows_the_broken_hook(invoke, hook, home):
    write(home / "config.yaml", "rewards:\n  reward_mapper: reward_mapper.py:reward_mapper\n")
    assert invoke("init", "--skip-model").exit_code == 0  # status reads a database, never makes one
    write(hook, "def reward_mapper(score, metadata):\n    return 'x'\n")
    data = json.loads(invoke("status", "--json").stdout)
    assert data["reward_hook"]["ok"] is False
    assert any("returned 'x'" in w for w in data["warnings"])


def test_ratings_are_evaluated_at_their_age(hooked, hook, store):
    write(hook, "def reward_mapper(score, metadata):\n    return metadata['age_days'] / 100\n")
    add_rated(store, 3)
    later = datetime.now(timezone.utc) + timedelta(days=12)
    row, = compute_rewards(hooked, store.training_samples(10), now=later)
    assert row.reward == pytest.approx(0.12, abs=1e-3)
    assert row.weight == pytest.approx(0.5 ** (12 / 30), abs=1e-3)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_hung_hook_dies_with_a_killed_caller(home, tmp_path):
    """A trainer killed with SIGKILL must not leave its hung hook process behind."""
    pid_file = tmp_path / "hook.pid"
    write(home / "reward_mapper.py", f"""\
        import os, time
        def reward_mapper(score, metadata):
            open({str(pid_file)!r}, "w").write(str(os.getpid()))
            time.sleep(120)
            return 0.0
        """)
    caller = textwrap.dedent(f"""
        from reinf.config import load_config
        from reinf.rewards.mapper import compute_rewards
        from reinf.storage.store import Store
        cfg = load_config(environ={{"REINF_HOME": {str(home)!r}}}).replace(
            reward_mapper="reward_mapper.py:reward_mapper", hook_timeout_seconds=300)
        store = Store.open(cfg)
        conv = store.create_conversation().id
        t = store.append_turn(conv, "q", "a", prompt_ids=[1], reply_ids=[2], logprobs=[-1.0])
        store.rate(t.id, 4)
        compute_rewards(cfg, store.training_samples(10))
    """)
    proc = subprocess.Popen([sys.executable, "-c", caller])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the hook never ran"
            time.sleep(0.1)
        hook_pid = int(pid_file.read_text())
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(hook_pid):
            assert time.monotonic() < deadline, "the hook process outlived its killed caller"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in state  # a zombie has died; only reaping is left


# --- what a hook may do to the machine ------------------------------------------------------

def run_simple(hook, source, **options):
    spec = hooks.parse_spec(f"{hook}:reward_mapper", hook.parent)
    return hooks.run_hook(spec, textwrap.dedent(source), [(4, {})], ["turn 1"], critics=[],
                          call_timeout=options.pop("call_timeout", 5.0), **options)


def test_a_huge_hook_error_is_capped_everywhere(invoke, hook, home):
    """A 5 MB exception message went whole into /api/status, /api/history and a
    5,000,176-character line of `reinf status`."""
    write(hook, "def reward_mapper(score, metadata):\n    raise ValueError('x' * 5_000_000)\n")
    with pytest.raises(HookError) as info:
        run_simple(hook, hook.read_text())
    message = str(info.value)
    assert len(message) < hooks.MAX_ERROR_CHARS + 500
    assert "ValueError: xxx" in message and "characters in all, cut" in message
    assert f"{hook}:2" in message  # the place is still named
    write(home / "config.yaml", "rewards:\n  reward_mapper: reward_mapper.py:reward_mapper\n")
    assert invoke("init", "--skip-model").exit_code == 0
    out = invoke("status").output
    assert max(len(line) for line in out.splitlines()) < hooks.MAX_ERROR_CHARS + 500
    data = json.loads(invoke("status", "--json").output)
    assert len(data["reward_hook"]["error"]) < hooks.MAX_ERROR_CHARS + 500


def gone(pid: int) -> bool:
    """Dead, or a zombie waiting for a parent (init in a container) to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("ending", ["return 0.5", "raise ValueError('no')",
                                    "import time; time.sleep(60)"])
def test_processes_a_hook_starts_die_with_it(hook, tmp_path, ending):
    """72 `sleep` processes outlived one round: the hook's process group is killed."""
    pids = tmp_path / "pids"
    source = f"""\
        import subprocess
        def reward_mapper(score, metadata):
            children = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
            open({str(pids)!r}, "w").write(" ".join(str(c.pid) for c in children))
            {ending}
        """
    write(hook, source)
    try:
        run_simple(hook, hook.read_text(), call_timeout=1.0)
    except HookError:
        pass
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in started), started


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS is enforced on Linux")
def test_a_hook_runs_under_memory_file_and_cpu_limits(hook, tmp_path):
    limits = tmp_path / "limits.json"
    write(hook, f"""\
        import json, resource
        def reward_mapper(score, metadata):
            names = ("RLIMIT_AS", "RLIMIT_FSIZE", "RLIMIT_CPU")
            json.dump({{n: resource.getrlimit(getattr(resource, n)) for n in names}},
                      open({str(limits)!r}, "w"))
            return 0.0
        """)
    assert run_simple(hook, hook.read_text(), memory_mb=512).rewards == [0.0]
    got = json.loads(limits.read_text())
    assert got["RLIMIT_AS"] == [512 * 1024 * 1024] * 2  # soft and hard: no way back up
    assert got["RLIMIT_FSIZE"] == [hooks.FILE_BYTES] * 2
    assert 0 < got["RLIMIT_CPU"][0] <= 10 + 5 + hooks.SLACK_SECONDS + 1
    write(hook, "def reward_mapper(score, metadata):\n    return len(bytearray(8 << 30))\n")
    with pytest.raises(HookError, match="MemoryError"):
        run_simple(hook, hook.read_text())
    write(hook, "def reward_mapper(score, metadata):\n"
                "    open('big', 'wb').write(bytes(100 << 20))\n    return 0.0\n")
    with pytest.raises(HookError, match="exited|File too large|OSError"):
        run_simple(hook, hook.read_text())


# --- a hook that quotes a rating's comment (forget must reach every record) -----------------

def test_a_hook_error_never_quotes_a_ratings_comment_and_forget_scrubs_old_records(hooked, hook,
                                                                                  store):
    """Forget races: a hook failing on a comment (float(metadata["comment"])) used to put the
    comment into the run's error, the logs, reward_hook_error.json and `reinf status`. The
    error names the comment instead; records written before (or quoting a tag) are scrubbed
    by the forget."""
    secret = "my secret is X-4471"
    write(hook, """\
        def reward_mapper(score, metadata):
            return float(metadata["comment"])
        """)
    conv = store.create_conversation().id
    turn = store.append_turn(conv, "q?", "a reply", prompt_ids=[1, 2], reply_ids=[3, 4],
                             logprobs=[-1.0, -1.0])
    store.rate(turn.id, 2, comment=secret, tags=["private-tag-zz"])
    with pytest.raises(HookError) as err:
        compute_rewards(hooked, store.training_samples(10))
    assert secret not in str(err.value)
    assert f"[the comment of turn {turn.id}]" in str(err.value)
    failure = hooked.data_dir / FAILURE_FILE
    assert secret not in failure.read_text()
    # records from before (or a message quoting the text some other way) are scrubbed
    record = json.loads(failure.read_text())
    record["message"] = f"ValueError: {secret!r} and private-tag-zz (for turn {turn.id})"
    failure.write_text(json.dumps(record))
    run = store.start_run("test")
    store.finish_run(run.id, "failed", error=f"reward hook broken: {secret!r} private-tag-zz")
    assert not hook_status(hooked)["ok"]
    store.forget_turn(turn.id)
    assert store.get_run(run.id).error == "reward hook broken: '[forgotten]' [forgotten]"
    assert secret not in failure.read_text() and "private-tag-zz" not in failure.read_text()
    assert json.loads(failure.read_text())["message"] == \
        f"ValueError: '[forgotten]' and [forgotten] (for turn {turn.id})"


def test_a_comment_longer_than_the_error_cap_is_not_quoted_either(hooked, hook, store):
    """An error is cut at MAX_ERROR_CHARS. A long comment quoted by the hook ran past the
    cut, so only its start was in the message, which did not match the whole comment: the
    adversarial pass found its marker in the run's row, both logs and `reinf status`."""
    secret = "my secret is zq26f4 " + "and more words " * 200
    write(hook, """\
        def reward_mapper(score, metadata):
            return float(metadata["comment"])
        """)
    conv = store.create_conversation().id
    turn = store.append_turn(conv, "q?", "a reply", prompt_ids=[1, 2], reply_ids=[3, 4],
                             logprobs=[-1.0, -1.0])
    store.rate(turn.id, 2, comment=secret)
    with pytest.raises(HookError) as err:
        compute_rewards(hooked, store.training_samples(10))
    message = str(err.value)
    assert "zq26f4" not in message and "and more words" not in message
    assert f"[the comment of turn {turn.id}]" in message and "characters in all, cut" in message
    assert "zq26f4" not in (hooked.data_dir / FAILURE_FILE).read_text()

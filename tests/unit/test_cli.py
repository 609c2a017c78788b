"""The CLI through click's runner: init, history, rate, undo, forget, export, status, config."""
from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from conftest import clean_env


def test_init_creates_the_data_dir(invoke, home):
    result = invoke("init", "--skip-model", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["data_dir"] == str(home)
    assert (home / "reinf.db").exists() and (home / "config.yaml").exists()
    assert (home / "checkpoints").is_dir() and (home / "logs").is_dir()
    again = json.loads(invoke("init", "--skip-model", "--json").output)
    assert again["created"] == []  # idempotent, never overwrites the person's files


def test_history_json_on_an_empty_home(invoke):
    assert invoke("init", "--skip-model").exit_code == 0
    result = invoke("history", "--json")
    assert result.exit_code == 0 and json.loads(result.output) == []


def test_rate_undo_history_flow(invoke, seeded):
    result = invoke("rate", "last", "4", "--tags", "too long,wrong", "--comment", "hm", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["tags"] == ["too long", "wrong"]
    assert invoke("rate", str(seeded[0].id), "2", "--critical").exit_code == 0
    rows = json.loads(invoke("history", "--json", "--limit", "5").output)
    assert [r["rating"]["score"] if r["rating"] else None for r in rows] == [4, None, 2]
    assert rows[2]["rating"]["critical"] is True
    undo = json.loads(invoke("undo", "--json").output)
    assert undo["removed"]["turn_id"] == seeded[0].id
    rated = json.loads(invoke("history", "--json", "--rated").output)
    assert [r["turn_id"] for r in rated] == [seeded[2].id]


@pytest.mark.parametrize("args,words", [
    (["rate", "last", "9"], "1 to 5"),
    (["rate", "12345", "3"], "no turn 12345"),
    (["rate", "first", "3"], "not a turn: 'first' — give `last`, a turn number, or an "
                             "OpenAI completion id `chatcmpl-…`"),
    (["rate", "chatcmpl-stream-" + "0" * 32, "3"], "no turn for the completion"),
    (["rollback", "r0009"], "no checkpoint r0009 — list them with `reinf checkpoints`"),
    (["history", "--conversation", "999"], "no conversation 999"),
    (["forget"], "exactly one"),
])
def test_bad_input_is_one_clear_line_without_traceback(invoke, seeded, args, words):
    result = invoke(*args)
    assert result.exit_code != 0
    assert words in result.output
    assert "Traceback" not in result.output


def open_store(home):
    from reinf.config import load_config
    from reinf.storage.store import Store

    return Store.open(load_config(environ={"REINF_HOME": str(home)}))


def test_rate_takes_the_completion_ids_an_openai_client_got(invoke, seeded, home):
    """`llm logs` shows chatcmpl-<turn id>, or for a streamed reply the id of its first
    chunk, chatcmpl-stream-<hex>, which the turn keeps in gen_params."""
    store = open_store(home)
    streamed = store.append_turn(seeded[0].conversation_id, "q", "a",
                                 gen_params={"stream_id": "5e" * 16})
    store.close()
    result = invoke("rate", f"chatcmpl-{seeded[1].id}", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["turn_id"] == seeded[1].id
    result = invoke("rate", "chatcmpl-stream-" + "5e" * 16, "5", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["turn_id"] == streamed.id
    undo = json.loads(invoke("undo", "--turn", "chatcmpl-stream-" + "5e" * 16, "--json").output)
    assert undo["removed"]["turn_id"] == streamed.id


def test_rollback_takes_a_unique_prefix_of_a_checkpoint_id(invoke, seeded, home, tmp_path):
    store = open_store(home)
    for ckpt in ("r0005-20261125-030648-8ce1", "r0006-20261126-101500-03af",
                 "r0006-20261126-113000-77b0"):
        store.add_checkpoint(ckpt, str(tmp_path / ckpt))
    store.close()
    result = invoke("rollback", "r0005", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["active_checkpoint"] == "r0005-20261125-030648-8ce1"
    result = invoke("rollback", "r0006")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert ("checkpoint id 'r0006' is ambiguous: 2 checkpoints start with it "
            "(r0006-20261126-101500-03af, r0006-20261126-113000-77b0)") in result.output
    assert json.loads(invoke("status", "--json").output)["active_checkpoint"] == \
        "r0005-20261125-030648-8ce1"  # unchanged by the refused one
    result = invoke("rollback", "base", "--json")
    assert json.loads(result.output)["active_checkpoint"] == "base"


def test_forget_and_export(invoke, seeded):
    invoke("rate", str(seeded[0].id), "5")
    invoke("rate", str(seeded[1].id), "1")
    kto = [json.loads(line) for line in invoke("export", "--format", "kto").output.splitlines()]
    assert [r["label"] for r in kto] == [True, False]
    result = json.loads(invoke("forget", "--turn", str(seeded[0].id), "--json").output)
    assert result["forgotten"]["turns"] == 1
    raw = invoke("export", "--format", "raw").output
    assert "question 0" not in raw and "question 1" in raw
    assert invoke("forget", "--all", "--yes").exit_code == 0
    assert json.loads(invoke("history", "--json").output) == []


def test_status_and_config_show(invoke, seeded, home):
    status = json.loads(invoke("status", "--json").output)
    assert status["data_dir"] == str(home)
    assert status["counts"]["turns"] == 3
    assert status["active_checkpoint"] == "base"
    shown = json.loads(invoke("config", "show", "--json").output)
    assert shown["storage"]["data_dir"] == str(home)
    assert shown["ppo"]["learning_rate"] == pytest.approx(1e-3)


def test_variables_set_for_other_programs_do_not_stop_status(invoke, seeded, home, monkeypatch):
    """`HOST=buildbox reinf status` failed: bare HOST was read as the bind address."""
    monkeypatch.setenv("HOST", "buildbox")
    monkeypatch.setenv("DB_URL", f"sqlite:///{home / 'elsewhere.db'}")
    monkeypatch.setenv("DATA_DIR", str(home / "elsewhere"))
    result = invoke("status", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["counts"]["turns"] == 3 and data["db_url"] == f"sqlite:///{home / 'reinf.db'}"
    assert not (home / "elsewhere.db").exists() and not (home / "elsewhere").exists()


@pytest.mark.parametrize("command", [("status",), ("history",), ("export",), ("checkpoints",),
                                     ("rewards", "preview")])
def test_read_only_commands_never_create_or_migrate_a_database(invoke, home, tmp_path,
                                                                monkeypatch, command):
    """A read-only command must not put Reinf's tables into a database db_url happens to
    point at (another application's, an empty one, an older Reinf's)."""
    import sqlite3

    from reinf.storage import db
    from reinf.config import load_config

    def tables(path):
        with sqlite3.connect(path) as conn:
            return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                                     "WHERE type = 'table'"))

    def one_line(*words):
        result = invoke(*command)
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
        for word in words:
            assert word in result.output, result.output

    one_line("there is no Reinf database at", "run `reinf init`")  # nothing there yet
    assert not (home / "reinf.db").exists()

    other = tmp_path / "shop.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    other.chmod(0o600)  # else Reinf's one-line notice about tightening it comes first
    monkeypatch.setenv("REINF_DB_URL", f"sqlite:///{other}")
    one_line("holds 1 tables but not Reinf's", "another application's database")
    assert tables(other) == ["customers"]

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    empty.chmod(0o600)
    monkeypatch.setenv("REINF_DB_URL", f"sqlite:///{empty}")
    one_line("has no Reinf tables yet", "run `reinf init`")
    assert tables(empty) == []

    monkeypatch.delenv("REINF_DB_URL")
    assert invoke("init", "--skip-model").exit_code == 0
    store = open_store(home)
    db.downgrade(store.engine, "0001")
    store.close()
    one_line("has an older schema (0001", "run `reinf db upgrade`")
    store = open_store_unmigrated(load_config(environ={"REINF_HOME": str(home)}))
    assert db.current_revision(store.engine).startswith("0001")  # not upgraded behind our back
    store.close()
    assert invoke("db", "upgrade").exit_code == 0
    assert invoke("status").exit_code == 0


def open_store_unmigrated(config):
    from reinf.storage.store import Store

    return Store.open(config, migrate=False)


def test_config_show_marks_where_each_value_came_from(invoke, home, monkeypatch):
    (home).mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("ppo:\n  batch_size: 4\n", encoding="utf-8")
    monkeypatch.setenv("REINF_TEMPERATURE", "0.5")
    text = invoke("--home", str(home), "config", "show").output
    assert "  batch_size: 4  # [file] " in text
    assert "  temperature: 0.5  # [environment REINF_TEMPERATURE] " in text
    assert f"  data_dir: \"{home}\"  # [flag] " in text
    assert "  top_p: 0.95  # [default] " in text
    shown = json.loads(invoke("config", "show", "--json").output)
    assert shown["origins"]["batch_size"] == "file" and shown["origins"]["top_p"] == "default"
    assert shown["origins"]["temperature"] == "environment"
    assert shown["environment"] == {"temperature": "REINF_TEMPERATURE", "data_dir": "REINF_HOME"}


def test_status_says_scheduled_training_is_off_under_no_train(invoke, seeded, monkeypatch):
    """Under `reinf serve --no-train`, status used to imply a round would come."""
    import reinf.daemon.remote

    schedule = {"scheduling": False, "next_run": None, "training": False, "warnings": []}
    monkeypatch.setattr(reinf.daemon.remote, "locate_server",
                        lambda config: {"running": True, "pid": 7})
    monkeypatch.setattr(reinf.daemon.remote, "fetch_schedule", lambda config: schedule)
    out = invoke("status").output
    assert "next run:           none: scheduled training is off (reinf serve --no-train)" in out
    assert "ratings waiting:    0 (scheduled training off)" in out
    assert "training after" not in out
    schedule["scheduling"] = True  # the same server, scheduling
    out = invoke("status").output
    assert "scheduled training is off" not in out and "(training after 8)" in out


def test_config_error_stops_the_command(invoke, home, monkeypatch):
    monkeypatch.setenv("REINF_PORT", "eighty")
    result = invoke("status")
    assert result.exit_code == 1
    assert "port" in result.output and "Traceback" not in result.output


def test_db_upgrade(invoke):
    first = json.loads(invoke("db", "upgrade", "--json").output)
    assert first["to"] == first["head"]
    again = json.loads(invoke("db", "upgrade", "--json").output)
    assert again["from"] == again["to"]


def test_every_command_has_help(runner):
    from reinf.cli import main

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            yield prefix + [name], cmd
            if isinstance(cmd, click.Group):
                yield from walk(cmd, prefix + [name])
    for path, cmd in walk(main, []):
        result = runner.invoke(main, path + ["--help"])
        assert result.exit_code == 0, path
        assert len((cmd.help or "").strip()) > 10, f"reinf {' '.join(path)} needs real help"


def test_real_subprocess(home):
    env = clean_env(home)
    run = lambda *a: subprocess.run([sys.executable, "-m", "reinf", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    init = run("init", "--skip-model", "--json")
    assert init.returncode == 0, init.stderr
    assert json.loads(init.stdout)["data_dir"] == str(home)
    hist = run("history", "--json")
    assert hist.returncode == 0 and json.loads(hist.stdout) == []
    bad = run("rate", "last", "3")
    assert bad.returncode == 1 and "no turns yet" in bad.stderr
    assert "Traceback" not in bad.stderr


class _StoppableReply:
    conversation_id = 7

    def __init__(self):
        self.stopped = False

    def __iter__(self):
        return iter([] if self.stopped else ["a reply nobody asked for"])

    def stop(self, shown=None):
        self.stopped = True

    def result(self):
        return {"turn_id": 1, "reply": "", "reply_tokens": 0, "interrupted": self.stopped}


class _SlowToStart:
    """A backend whose reply takes a moment to start (a long prompt being built, a busy
    server): the person presses Ctrl-C meanwhile, before the first token."""

    forgotten: list[int]

    def describe(self):
        return "fake"

    def forget(self, turn_id):
        self.forgotten.append(turn_id)

    def send_stream(self, message, conversation_id):
        import os
        import signal
        import time

        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the signal lands in here
        self.reply = _StoppableReply()
        return self.reply


def test_ctrl_c_before_the_first_token_stops_only_the_reply():
    import io
    import signal

    from reinf.cli.repl import Repl

    backend, out = _SlowToStart(), io.StringIO()
    backend.forgotten = []
    lines = iter(["hello", "/quit"])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        code = Repl(backend, read=lambda prompt: next(lines), out=out).run()
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C before the first token ended the whole session")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 0 and backend.reply.stopped
    # nothing was shown, so nothing is kept: the turn the server stored is forgotten
    assert "[stopped before any text appeared; nothing kept]" in out.getvalue()
    assert backend.forgotten == [1]
    assert "a reply nobody asked for" not in out.getvalue()
    assert signal.getsignal(signal.SIGINT) is previous  # the handler is given back


def test_status_names_the_device_auto_picks(invoke, seeded, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    data = json.loads(invoke("status", "--json").output)
    assert (data["model"]["device"], data["model"]["device_in_use"]) == ("auto", "cpu")
    assert "device:             cpu (auto)\n" in invoke("status").output
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert "device:             cuda (auto)\n" in invoke("status").output
    monkeypatch.setenv("REINF_DEVICE", "cpu")  # as set, no "(auto)"
    assert "device:             cpu\n" in invoke("status").output


def test_status_prints_the_memory_plan_and_warns_before_a_round_would_fail(
        invoke, seeded, monkeypatch):
    """From the demo model's config.json, no model load: server + trainer against the RAM."""
    import torch

    import reinf.model.memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setenv("REINF_MODEL_PATH", "reinf-demo")
    plan = json.loads(invoke("status", "--json").output)["memory"]
    assert plan["verdict"] == "fits" and 0.8e6 < plan["params"] < 1.0e6
    assert plan["peak_bytes"] == plan["server_bytes"] + plan["trainer_bytes"]
    assert plan["summary"].endswith("on cpu — fits (minibatches of 8 x 512 tokens)")
    out = invoke("status").output
    assert f"\nmemory plan:        {plan['summary']}\n" in out
    assert "warning: a training round" not in out

    monkeypatch.setattr(reinf.model.memory, "physical_memory", lambda: (2 * 2 ** 30, None))
    monkeypatch.setenv("REINF_BATCH_SIZE", "64")  # a 2 GiB machine, minibatches of 64 rows
    out = invoke("status").output
    assert "peak of 2.0 GiB on cpu — will not fit (minibatches of 64 x 512 tokens)\n" in out
    [warning] = [line for line in out.splitlines() if "a training round beside" in line]
    assert warning.startswith("warning: a training round beside the server needs about ")
    assert "which has 2.0 GiB: it will run out of memory — set gradient_checkpointing: " \
           "true, or batch_size: " in warning


def test_a_broken_hook_warning_says_training_is_paused_once(invoke, seeded, home, monkeypatch):
    (home / "mapper.py").write_text("def reward_mapper(score, metadata):\n    return undefined\n")
    monkeypatch.setenv("REINF_REWARD_MAPPER", f"{home / 'mapper.py'}:reward_mapper")
    data = json.loads(invoke("status", "--json").output)
    assert data["reward_hook"]["ok"] is False
    [warning] = [w for w in data["warnings"] if "undefined" in w]
    assert warning.count("training is paused") == 1, warning
    assert "paused until it works (training is paused" not in warning


def test_unwritable_files_and_a_locked_database_are_one_line(runner, seeded, home, monkeypatch):
    """The boundary turns what the machine causes mid-command into one line with its fix
    (a file Reinf may not write; the database locked by another program after it was
    opened); --debug still shows the traceback, and a bug stays a traceback."""
    import errno
    import sqlite3

    import reinf.daemon.status
    from sqlalchemy.exc import OperationalError

    from reinf.cli import main

    raised: list[BaseException] = []

    def fail(*args, **kwargs):
        raise raised[-1]
    monkeypatch.setattr(reinf.daemon.status, "collect_status", fail)
    log = home / "logs" / "reinf.log"
    raised.append(PermissionError(errno.EACCES, "Permission denied", str(log)))
    result = runner.invoke(main, ["status"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: cannot write {log}: Permission denied — make it writable (check its owner "
        f"and permissions with `ls -l {log}`), or set REINF_HOME to another directory"]
    assert isinstance(runner.invoke(main, ["--debug", "status"]).exception, PermissionError)

    raised.append(OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked")))
    result = runner.invoke(main, ["status"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert f"the database {home / 'reinf.db'} is locked by another process" in result.output
    assert "close that program, or wait" in result.output

    raised.append(ValueError("a bug"))
    assert isinstance(runner.invoke(main, ["status"]).exception, ValueError)


def test_status_says_when_replies_explore_styles(invoke, seeded, monkeypatch):
    # smollm2-135m, the model `reinf init` sets up, learns styles by default
    assert "exploring styles:   50% of replies" in invoke("status").output
    monkeypatch.setenv("REINF_EXPLORE_STYLES", "0")
    assert "exploring styles" not in invoke("status").output          # off: no line
    monkeypatch.setenv("REINF_EXPLORE_STYLES", "0.25")
    out = invoke("status").output
    assert "exploring styles:   25% of replies are asked for in a style from the built-in " \
           "list" in out
    assert "picked by your ratings" in out and "more often now" not in out  # none rated
    status = json.loads(invoke("status", "--json").output)
    assert status["explore_styles"]["share"] == 0.25
    assert status["explore_styles"]["styles_file"] is None
    assert status["explore_styles"]["pick"] == "ratings"
    assert status["explore_styles"]["favoured"] == []
    monkeypatch.setenv("REINF_EXPLORE_PICK", "uniform")
    assert "each equally often" in invoke("status").output
    assert json.loads(invoke("status", "--json").output)["explore_styles"]["favoured"] is None


def test_status_names_the_styles_the_ratings_have_exploring_ask_for_more(invoke, seeded, home,
                                                                         monkeypatch):
    from reinf.config import load_config
    from reinf.storage.store import Store

    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    for turn in seeded:                                 # the plain replies: rated 1
        store.rate(turn.id, 1)
    conv = store.create_conversation().id
    for style, score in (("Use a bulleted list.", 5), ("Use a bulleted list.", 4),
                         ("Be warm and encouraging.", 1), ("Use numbered steps.", 3)):
        turn = store.append_turn(conv, "q", "a", reply_ids=[1], logprobs=[-1],
                                 gen_params={"style": style})
        store.rate(turn.id, score)
    store.close()
    monkeypatch.setenv("REINF_EXPLORE_STYLES", "0.5")
    monkeypatch.setenv("REINF_EXPLORE_PICK", "ratings")
    out = invoke("status").output
    assert ('picked by your ratings (explore_styles; the reply\'s details name it); asked '
            'for more often now: "Use a bulleted list." (4.5 over 2), "Use numbered steps." '
            '(3.0 over 1)') in out
    favoured = json.loads(invoke("status", "--json").output)["explore_styles"]["favoured"]
    assert [row["style"] for row in favoured] == ["Use a bulleted list.", "Use numbered steps."]


def test_status_says_whether_best_of_n_chooses_the_replies(invoke, seeded, monkeypatch):
    assert "best-of-n" not in invoke("status").output          # off: no line
    monkeypatch.setenv("REINF_BEST_OF", "4")
    out = invoke("status").output
    assert "best-of-n:          best-of-4: waiting for a trusted rating model (the base " \
           "model is served" in out
    status = json.loads(invoke("status", "--json").output)
    assert status["best_of"]["best_of"] == 4 and status["best_of"]["active"] is False

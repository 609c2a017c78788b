"""Faults of the machine, as a person meets them: a damaged database file, one locked by
another program, a read-only data directory. Each is one line that names the problem and
its fix (README: "Errors are one line"), from real `reinf` processes; and `reinf db
recover` gets every readable row, ratings above all, out of a damaged file. Also: a kill
at any point of a round's promotion never leaves an active checkpoint beside an
unfinished run."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from conftest import REPO, clean_env
from daemonkit import free_port

pytestmark = pytest.mark.e2e


def reinf(home: Path, *args: str, env: dict | None = None, prefix: tuple = ()
          ) -> subprocess.Popen:
    """Start ``reinf ARGS`` as a person would; ``prefix`` runs it under another command."""
    return subprocess.Popen([*prefix, sys.executable, "-m", "reinf", *args], cwd=REPO,
                            env=clean_env(home, OMP_WAIT_POLICY="PASSIVE", **(env or {})),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def one_line_errors(home: Path, commands: list[tuple[str, ...]], **kwargs) -> dict:
    """Run the commands at once (each is a second of imports); each must fail with exit
    status 1 and one line on stderr, "Error: ... — fix". Returns command -> that line."""
    procs = {c: reinf(home, *c, **kwargs) for c in commands}
    results = {c: (*proc.communicate(timeout=120), proc.returncode) for c, proc in procs.items()}
    lines = {}
    for command, (out, err, code) in results.items():
        assert code == 1, (command, code, out, err)
        assert len(err.strip().splitlines()) == 1, (command, err)
        assert "Traceback" not in err + out, (command, err)
        line = err.strip()
        assert line.startswith("Error: ") and " — " in line, (command, line)
        lines[command] = line
    return lines


def make_db(home: Path, turns: int = 60) -> dict[int, int]:
    """A data directory with ``turns`` turns, every other one rated; returns the ratings."""
    from reinf.config import load_config
    from reinf.storage.store import Store

    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    ratings, conv = {}, None
    for i in range(turns):
        if i % 10 == 0:
            conv = store.create_conversation()
        turn = store.append_turn(conv.id, f"question {i} " * 20, f"reply {i} " * 60,
                                 prompt_ids=list(range(200)), reply_ids=list(range(80)),
                                 logprobs=[-0.5] * 80)
        if i % 2 == 0:
            ratings[turn.id] = store.rate(turn.id, 1 + i % 5, comment=f"c{i}").score
    store.close()
    return ratings


def damage_a_turns_page(db: Path) -> int:
    """Overwrite one leaf page of the turns table, in the middle of the file, with
    garbage; returns its page number. The header, the schema and the other tables stay
    readable: the kind of damage a server starts on and then answers 500."""
    with closing(sqlite3.connect(db)) as conn:
        try:
            pages = [p for (p,) in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = 'turns' AND pagetype = 'leaf' "
                "ORDER BY pageno")]
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no dbstat table to find a page of turns")
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    page = pages[len(pages) // 2]
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * size)
        fh.write(bytes((i * 37 + 11) % 256 for i in range(size)))
    return page


def test_a_truncated_or_headerless_database_is_one_line_with_the_fix(home):
    make_db(home)
    db = home / "reinf.db"
    intact = db.read_bytes()
    db.write_bytes(intact[: len(intact) // 3])  # truncated
    lines = one_line_errors(home, [("status",), ("history",)])
    for line in lines.values():
        assert f"the database {db} is damaged" in line
        assert "restore it from a backup" in line and "reinf db recover" in line
    db.write_bytes(bytes(100) + intact[100:])  # a zeroed header
    for line in one_line_errors(home, [("status",), ("history",)]).values():
        assert "is damaged (file is not a database)" in line and "reinf db recover" in line
    assert db.read_bytes()[100:] == intact[100:]  # nothing written to it


def test_garbage_pages_stop_serve_at_start_up_instead_of_a_500_later(home):
    make_db(home)
    damage_a_turns_page(home / "reinf.db")
    port = str(free_port())
    lines = one_line_errors(home, [("history", "--limit", "100"), ("status",),
                                   ("serve", "--port", port, "--no-train")])
    for line in lines.values():
        assert "is damaged (database disk image is malformed)" in line, line
        assert "reinf db recover" in line


def test_db_recover_keeps_every_readable_rating_and_the_damaged_file(home):
    ratings = make_db(home, turns=80)
    db = home / "reinf.db"
    damage_a_turns_page(db)
    damaged = db.read_bytes()
    proc = reinf(home, "db", "recover", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    report = json.loads(out)
    kept = Path(report["damaged_copy"])
    assert kept.parent == home and kept.name.startswith("reinf.db.damaged-")
    assert kept.read_bytes() == damaged  # kept as it was
    assert report["integrity"] == "ok"
    with closing(sqlite3.connect(db)) as conn:
        recovered = dict(conn.execute("SELECT turn_id, score FROM ratings"))
        turns = {t for (t,) in conn.execute("SELECT id FROM turns WHERE user_message != ''")}
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert recovered == ratings  # every rating: none of their pages was damaged
    assert 60 <= len(turns) < 80  # one page of turns is lost, the rest is back
    # A rating whose turn was lost keeps a placeholder turn, marked as such.
    assert report["placeholders"]["turns"] == len(set(ratings) - turns) > 0
    proc = reinf(home, "history", "--limit", "200", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert sum(1 for t in json.loads(out) if t["rating"]) == len(ratings)

    # A file whose header was zeroed comes back whole.
    intact = db.read_bytes()
    db.write_bytes(bytes(100) + intact[100:])
    proc = reinf(home, "db", "recover", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    with closing(sqlite3.connect(db)) as conn:
        assert dict(conn.execute("SELECT turn_id, score FROM ratings")) == ratings
    # A sound database is left alone.
    proc = reinf(home, "db", "recover")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "nothing to recover" in out, err


def test_db_recover_keeps_the_pairs_whose_turns_came_back_and_drops_the_others(home):
    """`reinf db recover` copies the pairs too (without `pairs` in RECOVER_TABLES it dropped
    every one). A pair that names a turn lost with the damaged page goes: a placeholder turn
    would stand for a reply nobody wrote, and the pair would teach a preference about it."""
    from reinf.config import load_config
    from reinf.storage.recover import recover
    from reinf.storage.store import Store

    make_db(home, turns=80)
    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    turns = sorted(store.history(limit=None), key=lambda t: t.id)
    rows = [dict(prompt=a.user_message, outcome="a", source="regenerate", a_turn_id=a.id,
                 b_turn_id=b.id) for a, b in zip(turns, turns[1:])
            if a.conversation_id == b.conversation_id]
    rows += [dict(prompt=t.user_message, outcome="b", prompt_turn_id=t.id, a_text="base says",
                  b_text="r1 says", b_checkpoint_id="r1", prompt_ids=[1, 2, 3],
                  a_reply_ids=[4, 5], b_reply_ids=[6], blind=True) for t in turns]
    rows.append(dict(prompt="a typed prompt", outcome="tie", a_text="x", b_text="y"))
    made = store.add_pairs(rows)
    for t in turns:  # and a rewrite of every turn: those of the lost turns go too
        store.rewrite(t.id, f"wanted {t.id}")
    store.close()
    db = home / "reinf.db"
    damage_a_turns_page(db)

    report = recover(db)
    with closing(sqlite3.connect(db)) as conn:
        back = {t for (t,) in conn.execute("SELECT id FROM turns WHERE user_message != ''")}
        kept = {p for (p,) in conn.execute("SELECT id FROM pairs")}
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert 60 <= len(back) < 80  # one page of turns is lost
    expected = {p.id for p in made
                if {p.a_turn_id, p.b_turn_id, p.prompt_turn_id} - {None} <= back}
    assert kept == expected and len(expected) < len(made)
    assert report["tables"]["pairs"] == {"rows": len(expected), "skipped": 0, "readable": True,
                                         "dropped": len(made) - len(expected)}
    assert report["integrity"] == "ok"
    assert report["tables"]["rewrites"] == {"rows": len(back), "skipped": 0, "readable": True,
                                            "dropped": len(turns) - len(back)}
    store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
    try:
        assert {r.turn_id: r.text for r in store.training_rewrites(1000)} == \
            {t: f"wanted {t}" for t in back if not store.get_turn(t).context_forgotten}
        pairs = {p.id: p for p in store.list_pairs(limit=None)}
        free = made[-1]
        assert (pairs[free.id].a_text, pairs[free.id].outcome) == ("x", "tie")
        compare = next(pairs[p.id] for p in made if p.prompt_turn_id in back)
        assert (compare.prompt_ids, compare.a_reply_ids, compare.b_checkpoint_id, compare.blind) \
            == ([1, 2, 3], [4, 5], "r1", True)
        regenerate = next(pairs[p.id] for p in made if p.a_turn_id in back and p.b_turn_id in back)
        assert regenerate.a_text == store.get_turn(regenerate.a_turn_id).reply
    finally:
        store.close()


HOLD = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("COMMIT")  # exclusive mode keeps the lock after the transaction
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_database_locked_by_another_process_is_one_line_naming_its_pid(home):
    make_db(home, turns=4)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(home / "reinf.db")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        port = str(free_port())
        lines = one_line_errors(home, [("status",), ("history",), ("rate", "last", "4"),
                                       ("serve", "--port", port, "--no-train")],
                                env={"REINF_BUSY_TIMEOUT_MS": "300"})
    finally:
        holder.communicate("", timeout=30)
    for line in lines.values():
        assert "is locked by another process" in line and f"pid {holder.pid}" in line, line
        assert "close that program, or wait" in line
    proc = reinf(home, "rate", "last", "4")  # the lock is gone: it works again
    assert proc.communicate(timeout=120)[1] == "" and proc.returncode == 0


def read_only_prefix() -> tuple:
    """Run as a process that file permissions apply to. Root ignores them, unless its
    capability to do so is dropped (setpriv)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search", "--")


def test_a_read_only_data_directory_is_one_line_naming_it(home):
    prefix = read_only_prefix()
    make_db(home, turns=4)
    port = str(free_port())
    home.chmod(0o555)
    try:
        lines = one_line_errors(home, [("status",), ("history",), ("rate", "last", "4"),
                                       ("init", "--skip-model"),
                                       ("serve", "--port", port, "--no-train")],
                                prefix=prefix)
        fresh = home / "new"  # a data directory that cannot be created
        proc = reinf(fresh, "init", "--skip-model", prefix=prefix)
        _, err = proc.communicate(timeout=120)
    finally:
        home.chmod(0o755)
    for line in lines.values():
        assert f"the data directory {home} is read-only" in line, line
        assert f"chmod u+rwx {home}" in line and "REINF_HOME" in line
    assert proc.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert f"cannot create the data directory {fresh}" in err and "REINF_HOME" in err


class Killed(BaseException):
    """Stands for kill -9: no handler runs, the open transaction never commits."""


def test_a_kill_at_any_point_of_promotion_never_leaves_an_active_checkpoint_unfinished(
        config, tmp_path):
    """The trainer's last step, killed after each of its SQL statements in turn: whatever
    was committed, the active checkpoint's run has succeeded (or nothing is active)."""
    from sqlalchemy import event

    from reinf.storage.store import Store
    from reinf.training import checkpoints
    from reinf.training.promotion import promote

    root = checkpoints.root_dir(config)
    path = root / "r0001-20300101-000000-abcd"
    path.mkdir(parents=True)
    for name in checkpoints.REQUIRED:
        (path / name).write_text("{}")
    kill_at, outcomes = 1, []
    while True:
        url = f"sqlite:///{tmp_path / f'k{kill_at}.db'}"
        store = Store(url)
        run = store.start_run("test")
        seen = {"n": 0}

        def count(conn, cursor, statement, *args, seen=seen, kill_at=kill_at):
            seen["n"] += 1
            if seen["n"] == kill_at:
                raise Killed(statement.split()[0])
        event.listen(store.engine, "before_cursor_execute", count)
        try:
            promote(config, store, run.id, path.name, path, parent_id=None,
                    metrics={"reward_mean": 0.5, "kl": 0.01}, samples=3)
            finished = True
        except Killed:
            finished = False
        store.close()
        after = Store(url)
        active = after.active_checkpoint()
        status = after.get_run(run.id).status
        after.close()
        outcomes.append((kill_at, active.id if active else None, status))
        if active is not None:
            assert status == "succeeded", outcomes
        else:
            assert status == "running", outcomes  # all or nothing
        if finished:
            break
        kill_at += 1
    assert outcomes[-1] == (kill_at, path.name, "succeeded")
    assert any(a is None for _, a, _ in outcomes)  # some kills came before the commit

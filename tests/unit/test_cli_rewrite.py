"""`reinf rewrite` through click's runner, on a real SQLite store: the reply the person
wanted, as TEXT, from a file or from standard input; --delete; `history` marks it."""
from __future__ import annotations

import json

import pytest

from reinf.storage.store import MAX_REWRITE_CHARS

SAVED = "the next training round learns from it"


@pytest.fixture
def rewrite_of(home):
    """``rewrite_of(turn_id)``: the turn's stored rewrite text (None: none), read afresh."""
    from reinf.config import load_config
    from reinf.storage.store import Store

    def read(turn_id):
        store = Store.open(load_config(environ={"REINF_HOME": str(home)}))
        try:
            record = store.get_rewrite(turn_id)
        finally:
            store.close()
        return record.text if record else None
    return read


def test_rewrite_saves_replaces_shows_in_history_and_deletes(invoke, seeded, rewrite_of):
    last, first = seeded[-1].id, seeded[0].id
    result = invoke("rewrite", "last", "A better answer.")
    assert result.exit_code == 0, result.output
    assert result.output == f"turn {last}: rewrite saved (16 characters); {SAVED}\n"
    assert rewrite_of(last) == "A better answer."

    result = invoke("rewrite", str(last), "Best.", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert list(record) == ["turn_id", "text", "created_at", "updated_at"]
    assert (record["turn_id"], record["text"]) == (last, "Best.")
    assert rewrite_of(last) == "Best."  # one per turn: replaced
    assert invoke("rewrite", "last", "Best!").output == \
        f"turn {last}: rewrite replaced (5 characters); {SAVED}\n"

    assert invoke("rewrite", f"chatcmpl-{first}", "x").exit_code == 0  # TURN as for `rate`
    assert invoke("rate", str(first), "2").exit_code == 0
    lines = invoke("history").output.splitlines()
    marks = {line.split()[0]: line for line in lines if line.startswith("#")}
    assert marks[f"#{last}"].endswith("unrated ✎  (base)")
    assert marks[f"#{first}"].endswith("★2 ✎  (base)")
    assert "✎" not in marks[f"#{seeded[1].id}"]
    rows = json.loads(invoke("history", "--json").output)
    assert [r["rewrite"]["text"] if r["rewrite"] else None for r in rows] == ["Best!", None, "x"]

    result = invoke("rewrite", "last", "--delete", "--json")
    assert result.exit_code == 0, result.output
    removed = json.loads(result.output)["removed"]
    assert (removed["turn_id"], removed["text"]) == (last, "Best!")
    assert rewrite_of(last) is None
    assert invoke("rewrite", "last", "--delete").output == \
        f"turn {last} has no rewrite to remove\n"
    assert json.loads(invoke("rewrite", "last", "--delete", "--json").output) == \
        {"removed": None}
    assert invoke("rewrite", str(first), "--delete").output == f"turn {first}: rewrite removed\n"
    assert "✎" not in invoke("history").output


def test_rewrite_reads_a_file_or_standard_input(invoke, seeded, rewrite_of, tmp_path):
    last = seeded[-1].id
    path = tmp_path / "wanted.txt"
    path.write_text("First line.\n\nSecond line, ünïcode.\n\n", encoding="utf-8")
    result = invoke("rewrite", "last", "--file", path)
    assert result.exit_code == 0, result.output
    # the line breaks the file ends with are not part of the reply
    assert rewrite_of(last) == "First line.\n\nSecond line, ünïcode."
    assert f"turn {last}: rewrite saved (34 characters)" in result.output

    result = invoke("rewrite", "last", "--file", "-", "--json", input="from\nstdin\r\n")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"] == "from\nstdin"
    assert rewrite_of(last) == "from\nstdin"

    # a TEXT that starts with a dash, after --
    assert invoke("rewrite", "last", "--", "-1 is the answer.").exit_code == 0
    assert rewrite_of(last) == "-1 is the answer."
    # exactly the longest a rewrite may be
    assert invoke("rewrite", "last", "y" * MAX_REWRITE_CHARS).exit_code == 0
    assert rewrite_of(last) == "y" * MAX_REWRITE_CHARS


@pytest.mark.parametrize("args,stdin,words", [
    (["last", ""], None, "got an empty one — write the reply you would have wanted"),
    (["last", " \n\t "], None, "got an empty one"),
    (["last", "--file", "-"], "\n\n", "got an empty one"),
    (["last", "x" * (MAX_REWRITE_CHARS + 1)], None,
     f"a rewrite holds at most {MAX_REWRITE_CHARS:,} characters, got "
     f"{MAX_REWRITE_CHARS + 1:,} — shorten it"),
    (["12345", "better"], None, "no turn 12345 — see `reinf history` for turn ids"),
    (["12345", "--delete"], None, "no turn 12345"),
    (["first", "better"], None, "not a turn: 'first' — give `last`, a turn number, or an "
                                "OpenAI completion id `chatcmpl-…`"),
    (["last", "--file", "{tmp}/missing.txt"], None,
     "cannot read {tmp}/missing.txt: No such file or directory — check the path"),
    (["last", "--file", "{tmp}"], None, "cannot read {tmp}: Is a directory"),
    (["last", "--file", "{tmp}/latin1.txt"], None,
     "{tmp}/latin1.txt is not UTF-8 text (byte 3) — save it as UTF-8"),
])
def test_bad_input_is_one_clear_line_and_stores_nothing(invoke, seeded, rewrite_of, tmp_path,
                                                        args, stdin, words):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = invoke("rewrite", *args, input=stdin)
    assert result.exit_code == 1
    assert words.replace("{tmp}", str(tmp_path)) in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert all(rewrite_of(t.id) is None for t in seeded)


@pytest.mark.parametrize("args,words", [
    (["last"], "give the reply you wanted as TEXT or with --file PATH (exactly one of them)"),
    (["last", "text", "--file", "-"], "exactly one of them"),
    (["last", "text", "--delete"], "--delete takes no text"),
    (["last", "--file", "-", "--delete"], "--delete takes no text"),
])
def test_text_file_and_delete_are_exclusive_usage_errors(invoke, seeded, rewrite_of, args,
                                                         words):
    result = invoke("rewrite", *args, input="from stdin")
    assert result.exit_code == 2
    assert words in result.output and "Usage: " in result.output
    assert "Traceback" not in result.output
    assert all(rewrite_of(t.id) is None for t in seeded)


def test_rewrite_before_any_turn_says_to_chat_first(invoke):
    assert invoke("init", "--skip-model").exit_code == 0
    result = invoke("rewrite", "last", "better")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "there are no turns yet — chat first: `reinf chat`" in result.output

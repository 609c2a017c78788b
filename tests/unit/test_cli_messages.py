"""Small things the CLI says: counts in plain English, and undo of a turn that does not
exist failing as rate does. Real SQLite store, the real CLI in-process."""
from __future__ import annotations

import pytest

from reinf.errors import NotFound


def test_forget_counts_read_as_english(store, invoke):
    conv = store.create_conversation().id
    first = store.append_turn(conv, "one", "a").id
    store.append_turn(conv, "two", "b")
    store.rate(first, 4)
    assert invoke("forget", "--turn", first).output == (
        "forgot 1 turn, 1 rating, 1 later turn untrainable\n")
    other = store.create_conversation().id
    for text in ("x", "y"):
        store.append_turn(other, text, "z")
    assert invoke("forget", "--conversation", other).output == (
        "forgot 1 conversation, 2 turns, 0 ratings\n")


def test_undo_of_a_turn_that_does_not_exist_fails_like_rate(store, invoke):
    rate = invoke("rate", "999999", "3")
    undo = invoke("undo", "--turn", "999999")
    assert (rate.exit_code, undo.exit_code) == (1, 1)
    assert "no turn 999999" in undo.output and undo.output == rate.output
    with pytest.raises(NotFound, match="no turn 999999"):
        store.undo_rating(999999)


def test_undo_of_an_unrated_turn_is_not_an_error(store, invoke):
    turn = store.append_turn(store.create_conversation().id, "q", "a").id
    out = invoke("undo", "--turn", turn)
    assert out.exit_code == 0 and out.output == "no rating to undo\n"
    store.rate(turn, 2)
    assert invoke("undo", "--turn", turn).output == f"removed rating 2 from turn {turn}\n"

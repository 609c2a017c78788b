"""`reinf forget` says what went in words, pairs and alternatives included (it printed the
raw keys: "2 pairs" read "2 pairs" by luck, "1 alternatives_kept" did not)."""
from __future__ import annotations


def test_forget_a_turn_with_an_alternative_and_a_pair_in_words(invoke, store):
    conv = store.create_conversation().id
    first = store.append_turn(conv, "a question", "one reply")
    other = store.append_turn(conv, "a question", "another reply", slot=first.index)
    store.pick_alternative(first.id)  # a regenerate pair: first over other
    result = invoke("forget", "--turn", str(other.id))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == \
        "forgot 1 turn, 0 ratings, 0 later turns untrainable, 1 pair, 1 alternative kept"
    assert "_" not in result.output

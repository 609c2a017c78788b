"""What the person's picks say about checkpoints (reinf.training.leaderboard): Bradley-Terry
scores on hand-made pairs, the record against the base, the picks rule of the gate, the status line
and GET /api/leaderboard. A real SQLite store; no model."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from reinf.training.leaderboard import (BASE, build_leaderboard, choose_start, fit_scores, games,
                                        picks_vs_base, tally)
from webui_fakes import build_daemon, client, daemon, fake_chat, app  # noqa: F401 - fixtures


def pick(store, a, b, outcome, *, blind=True, prompt="q"):
    """A compare pair of side a (checkpoint ``a``, None = base) against side b."""
    return store.add_pair(prompt, outcome, a_text="x", b_text="y", a_checkpoint_id=a,
                          b_checkpoint_id=b, blind=blind, prompt_ids=[1], a_reply_ids=[2],
                          b_reply_ids=[3])


def checkpoint(store, cid, parent=None, status="promoted", active=False):
    store.add_checkpoint(cid, f"/nowhere/{cid}", parent_id=parent, status=status)
    if active:
        store.activate_checkpoint(cid)


# --- Bradley-Terry on hand-made pairs -------------------------------------------------------

def test_one_checkpoint_against_the_base_by_hand():
    """3 wins and 1 loss against the base, plus the prior's one tie: 3.5 wins in 5 games,
    and the maximum-likelihood odds against the base are 3.5 / 1.5."""
    scores = fit_scores([("A", BASE, 1.0)] * 3 + [(BASE, "A", 1.0)])
    assert scores[BASE] == 0.0
    assert scores["A"] == pytest.approx(math.log(3.5 / 1.5), abs=1e-8)


def test_scores_satisfy_the_likelihood_equations():
    """At the maximum, each checkpoint's expected wins (ties half, the prior's tie with the
    base included) equal its actual wins."""
    played = ([("A", BASE, 1.0)] * 4 + [("A", BASE, 0.0)] + [("B", "A", 1.0)] * 2
              + [("B", "A", 0.5)] + [("C", "B", 0.0)] * 3 + [("C", BASE, 1.0)])
    scores = fit_scores(played)
    games_ = [(a, b, p) for a, b, p in played] + [(c, BASE, 0.5) for c in "ABC"]
    for c in "ABC":
        actual = expected = 0.0
        for a, b, points in games_:
            if c in (a, b):
                mine = points if a == c else 1 - points
                other = b if a == c else a
                actual += mine
                expected += 1 / (1 + math.exp(scores[other] - scores[c]))
        assert expected == pytest.approx(actual, abs=1e-6), c
    assert scores["B"] > scores["A"] > 0 > scores["C"] - scores["B"]


def test_a_checkpoint_that_won_every_pick_stays_finite_and_ties_score_zero():
    scores = fit_scores([("A", BASE, 1.0)] * 20 + [("T", BASE, 0.5)] * 6)
    assert 2 < scores["A"] < 5
    assert scores["T"] == pytest.approx(0.0, abs=1e-9)


def test_games_and_tallies_read_the_outcomes():
    pairs = [SimpleNamespace(a_checkpoint_id="A", b_checkpoint_id=None, outcome=o, blind=b)
             for o, b in (("a", True), ("b", True), ("tie", False), ("both_bad", True))]
    pairs.append(SimpleNamespace(a_checkpoint_id="A", b_checkpoint_id="A", outcome="a",
                                 blind=True))  # one checkpoint on both sides: no game
    played = games(pairs)
    assert played == [("A", BASE, 1.0), ("A", BASE, 0.0), ("A", BASE, 0.5), ("A", BASE, 0.5)]
    assert tally(played, {"A"}, {BASE}).to_dict() == {"win_rate": 0.5, "wins": 1, "losses": 1,
                                                      "ties": 2, "pairs": 4}
    assert tally(played, {BASE}, {"A"}).losses == 1
    assert len(games(pairs, blind=False)) == 1


# --- the store side ---------------------------------------------------------------------------

def test_the_leaderboard_from_stored_pairs(store):
    checkpoint(store, "r0001-a")
    checkpoint(store, "r0002-b", parent="r0001-a", active=True)
    for outcome in ("b", "b", "b", "a"):       # r0001 beats the base 3 of 4 (it is side b)
        pick(store, None, "r0001-a", outcome)
    pick(store, "r0002-b", "r0001-a", "a")
    pick(store, "r0002-b", "r0002-b", "a")     # same checkpoint: not a game
    board = build_leaderboard(store)
    assert board["pairs"] == 5
    rows = {r["checkpoint_id"]: r for r in board["leaderboard"]}
    assert [r["checkpoint_id"] for r in board["leaderboard"]] == [BASE, "r0001-a", "r0002-b"]
    assert rows["r0001-a"]["wins"] == 3 and rows["r0001-a"]["losses"] == 2
    assert rows[BASE] == {**rows[BASE], "score": 0.0, "wins": 1, "losses": 3, "pairs": 4}
    assert rows["r0002-b"]["score"] > rows["r0001-a"]["score"] > 0
    assert rows["r0002-b"]["active"] and rows["r0002-b"]["parent_id"] == "r0001-a"
    assert build_leaderboard(store, blind=False) == {"leaderboard": [], "pairs": 0,
                                                     "blind": False}


def test_picks_against_the_base_count_the_lineage(store):
    checkpoint(store, "r0001-a")
    checkpoint(store, "r0002-b", parent="r0001-a")
    checkpoint(store, "r0003-c", parent="r0002-b")
    assert picks_vs_base(store, "r0003-c") is None
    pick(store, "r0001-a", None, "a")
    pick(store, None, "r0002-b", "b")
    pick(store, None, "r0002-b", "tie")
    got = picks_vs_base(store, "r0003-c")
    assert got == {"win_rate": 2.5 / 3, "wins": 2, "losses": 0, "ties": 1, "pairs": 3,
                   "checkpoints": ["r0002-b", "r0001-a"]}
    assert picks_vs_base(store, "r0001-a")["pairs"] == 1
    assert picks_vs_base(store, None) is None


# --- the picks rule ---------------------------------------------------------------------------

def test_a_checkpoint_the_blind_picks_put_behind_its_parent_is_passed_over(store):
    checkpoint(store, "r0001-a")
    checkpoint(store, "r0002-b", parent="r0001-a", active=True)
    assert choose_start(store) == ("r0002-b", [])
    pick(store, "r0002-b", "r0001-a", "b")
    pick(store, "r0001-a", "r0002-b", "a")
    assert choose_start(store) == ("r0002-b", [])       # 2 picks: fewer than MIN_PICKS
    pick(store, "r0002-b", "r0001-a", "a", blind=False)
    pick(store, "r0002-b", "r0001-a", "b", blind=False)
    assert choose_start(store) == ("r0002-b", [])       # seen picks do not count
    pick(store, "r0002-b", "r0001-a", "tie")
    start, passed = choose_start(store)                  # lost 2 of 3 blind
    assert start == "r0001-a"
    assert passed == [{"checkpoint_id": "r0002-b", "parent_id": "r0001-a", "win_rate": 0.5 / 3,
                       "wins": 0, "losses": 2, "ties": 1, "pairs": 3}]


def test_half_the_picks_is_not_behind_and_the_walk_goes_up_to_the_base(store):
    checkpoint(store, "r0001-a", active=True)
    for outcome in ("a", "b", "b", "a"):                 # 2 of 4 lost: not behind
        pick(store, "r0001-a", None, outcome)
    assert choose_start(store) == ("r0001-a", [])
    pick(store, None, "r0001-a", "a")                    # 3 of 5 lost: behind the base
    start, passed = choose_start(store)
    assert start is None and passed[0]["parent_id"] == BASE


def test_the_walk_stops_at_a_parent_whose_files_are_gone(store):
    checkpoint(store, "r0001-a", status="deleted")
    checkpoint(store, "r0002-b", parent="r0001-a", active=True)
    for _ in range(3):
        pick(store, "r0001-a", "r0002-b", "a")
    assert choose_start(store) == ("r0002-b", [])


# --- status and the API -----------------------------------------------------------------------

def test_the_status_line(store, config):
    from reinf.cli.system import _print_status
    from reinf.daemon.status import collect_status, describe_vs_base

    assert describe_vs_base("r0007-20261125-030648-8ce1",
                            {"win_rate": 0.62, "prompts": 16}, {
                                "wins": 3, "pairs": 4, "ties": 0,
                                "checkpoints": ["r0007-20261125-030648-8ce1"]}) == \
        "r0007 vs base: wins 62% by the rating model (16 prompts), 3 of 4 by your picks"
    store.add_checkpoint("r0001-20261125-030648-8ce1", "/nowhere", metrics={"vs_base": {
        "by_rating_model": {"win_rate": 0.75, "wins": 11, "losses": 3, "ties": 2,
                            "pairs": 16, "prompts": 16}, "by_your_picks": None}})
    store.activate_checkpoint("r0001-20261125-030648-8ce1")
    pick(store, "r0001-20261125-030648-8ce1", None, "a")
    pick(store, None, "r0001-20261125-030648-8ce1", "tie")
    status = collect_status(config, store)
    assert status["vs_base"]["by_your_picks"]["pairs"] == 2
    line = status["vs_base"]["line"]
    assert line == ("r0001 vs base: wins 75% by the rating model (16 prompts), 1 of 2 by your "
                    "picks (1 tie)")


def test_status_prints_the_line(invoke, store):
    store.add_checkpoint("r0002-x", "/nowhere")
    store.activate_checkpoint("r0002-x")
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert "what changed:       r0002 vs base: not measured yet" in result.output


def test_get_leaderboard(client, store):
    checkpoint(store, "r0001-a", active=True)
    pick(store, "r0001-a", None, "a")
    body = client.get("/api/leaderboard").get_json()
    assert [r["checkpoint_id"] for r in body["leaderboard"]] == [BASE, "r0001-a"]
    assert body["leaderboard"][1]["wins"] == 1 and body["pairs"] == 1
    assert client.get("/api/leaderboard?blind=false").get_json()["pairs"] == 0
    assert client.get("/api/leaderboard?blind=maybe").status_code == 400

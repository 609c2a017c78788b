"""Styled rollouts and exploring styles (reinf.training.styles: training.styled_rollouts,
generation.explore_styles): the instruction list, the instruction spliced into a rendered
prompt, what a round samples, which served replies are styled, and how PPO reads them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from reinf.errors import BadInput
from reinf.records import StyleRatings
from reinf.training.styles import (BUILTIN_STYLES, MAX_STYLE_CHARS, Explorer,
                                   favoured_by_ratings, instruction_ids, load_styles,
                                   pick_style, styled_contexts, template_tail, with_instruction)
from tiny import build_tiny_tokenizer

pytestmark = pytest.mark.stack  # see pyproject.toml's markers


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def render(tokenizer, message: str) -> list[int]:
    from reinf.model.modeling import render_chat

    return render_chat(tokenizer, [], message)


# --- the list ---------------------------------------------------------------------------------

def test_null_means_the_builtin_list():
    assert load_styles(None) == list(BUILTIN_STYLES)
    assert len(set(BUILTIN_STYLES)) == len(BUILTIN_STYLES) >= 8


def test_a_styles_file_is_one_instruction_a_line(tmp_path):
    f = tmp_path / "styles.txt"
    f.write_text("# mine\n\nAnswer like a pirate.\n  Use a table.  \n", encoding="utf-8")
    assert load_styles(str(f)) == ["Answer like a pirate.", "Use a table."]


@pytest.mark.parametrize("content, says", [
    (None, "cannot be read"),
    ("# only a comment\n\n", "has no instructions"),
    ("x" * (MAX_STYLE_CHARS + 1), "longer than"),
    (b"\xff\xfe bad", "cannot be read"),
])
def test_a_bad_styles_file_names_the_setting_and_the_fix(tmp_path, content, says):
    f = tmp_path / "styles.txt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content, encoding="utf-8")
    with pytest.raises(BadInput, match=says) as err:
        load_styles(str(f))
    assert "training.styles_file" in str(err.value) and "null" in err.value.fix


# --- the instruction in the prompt -----------------------------------------------------------

def test_the_instruction_lands_at_the_end_of_the_last_user_message(tokenizer):
    tail = template_tail(tokenizer)
    assert "assistant" in tokenizer.decode(tail)  # the end of the user turn, the header
    assert "rain" not in tokenizer.decode(tail)
    plain = render(tokenizer, "What is rain?")
    extra = tokenizer.encode("\n\nUse a list.", add_special_tokens=False)
    styled = with_instruction(plain, extra, tail)
    # the same text the template gives the message written with the instruction
    assert tokenizer.decode(styled) == tokenizer.decode(render(tokenizer,
                                                               "What is rain?\n\nUse a list."))
    assert styled[:len(plain) - len(tail)] == plain[:len(plain) - len(tail)]
    assert styled[-len(tail):] == tail


def test_a_prompt_that_does_not_end_with_the_template_is_left_alone(tokenizer):
    tail = template_tail(tokenizer)
    assert with_instruction([5, 6, 7], [9], tail) is None
    assert with_instruction(tail, [9], tail) is None  # nothing before the tail
    assert with_instruction([5, 6], [9], []) is None


def test_styled_contexts_keep_the_plain_replies_first_and_draw_no_instruction_twice(tokenizer):
    prompts = [render(tokenizer, "What is rain?"), render(tokenizer, "How do I boil an egg?")]
    styles = ["Use a list.", "Be brief.", "Give an example."]
    contexts, owners, used = styled_contexts(tokenizer, prompts, 4, 2, styles, seed=3,
                                             limit=10_000)
    assert owners == [0, 0, 0, 0, 1, 1, 1, 1]
    for g in (0, 1):
        mine = [i for i, o in enumerate(owners) if o == g]
        assert [used[i] for i in mine[:2]] == [None, None]
        assert [contexts[i] for i in mine[:2]] == [prompts[g]] * 2
        drawn = [used[i] for i in mine[2:]]
        assert len(set(drawn)) == 2 and set(drawn) <= set(styles)
        for i in mine[2:]:
            assert used[i] in tokenizer.decode(contexts[i])
            assert len(contexts[i]) > len(prompts[g])
    # the same seed draws the same instructions; another seed, in general, others
    assert styled_contexts(tokenizer, prompts, 4, 2, styles, seed=3, limit=10_000)[2] == used


def test_more_styled_replies_than_instructions_repeat_them(tokenizer):
    prompts = [render(tokenizer, "Hi")]
    _, _, used = styled_contexts(tokenizer, prompts, 3, 3, ["Be brief."], seed=0, limit=10_000)
    assert used == ["Be brief."] * 3


def test_a_styled_context_too_long_for_the_model_is_sampled_plainly(tokenizer):
    prompts = [render(tokenizer, "Hi")]
    contexts, _, used = styled_contexts(tokenizer, prompts, 2, 1, ["Be brief."], seed=0,
                                        limit=len(prompts[0]))
    assert used == [None, None] and contexts == [prompts[0]] * 2


# --- what the round reports ------------------------------------------------------------------

def test_the_styled_reply_imitated_is_a_prompt_s_best_and_clears_the_margin():
    """training.imitate_styled: per prompt, at most its best-scored styled reply, and only
    where that beats the mean of the plain replies to it by the margin."""
    from reinf.training.plan import styled_to_imitate

    r = [SimpleNamespace(group=g) for g in (0, 0, 0, 0, 1, 1, 1, 2, 2)]
    scores = [2.0, 2.0, 3.5, 4.0, 3.0, 3.5, 3.6, 4.0, 4.5]
    styles = [None, None, "list", "brief", None, "list", "brief", "list", "brief"]
    # prompt 0: brief 4.0 beats plain 2.0 by 2; prompt 1: +0.6 only; prompt 2: no plain reply
    assert styled_to_imitate(r, scores, styles, 1.0) == {3}
    assert styled_to_imitate(r, scores, styles, 0.5) == {3, 6}
    assert styled_to_imitate(r, scores, styles, 2.5) == set()
    assert styled_to_imitate(r, scores, styles, 0.0) == set()          # 0 = off
    assert styled_to_imitate(r, scores, [None] * 9, 0.5) == set()      # nothing styled


def test_a_style_the_ratings_lift_is_imitated_where_the_rating_model_alone_would_not():
    """The ratings of explored replies add each style's lift to its styled replies' scores:
    the rating model, flat after a few ratings, does not hold back a style the person has
    rated well, and a style rated badly is not imitated on the rating model's word."""
    from reinf.training.plan import styled_to_imitate

    r = [SimpleNamespace(group=g) for g in (0, 0, 0, 0, 1, 1, 1, 1)]
    scores = [1.5, 1.5, 1.6, 1.7, 2.0, 2.0, 2.8, 2.1]   # a rating model that barely tells
    styles = [None, None, "list", "brief", None, None, "formal", "list"]
    assert styled_to_imitate(r, scores, styles, 0.5) == {6}
    lifts = {"list": 1.0, "formal": -1.0}
    # prompt 0: list 1.6 + 1.0 beats brief 1.7 and plain 1.5 by 1.1; prompt 1: the list
    # (2.1 + 1.0) beats the formal reply (2.8 - 1.0) and clears the margin
    assert styled_to_imitate(r, scores, styles, 0.5, lifts) == {2, 7}
    assert styled_to_imitate(r, scores, styles, 1.5, lifts) == set()


def test_a_style_s_lift_is_its_ratings_over_the_usual_shrunk_and_needs_two_ratings():
    from reinf.training.styles import style_lifts

    ones = (1,) * 20
    lifts = style_lifts(StyleRatings(
        scores=ones + (5, 5, 1, 1, 5),
        by_style={"list": (5, 5), "warm": (1, 1), "formal": (5,)}))
    assert set(lifts) == {"list", "warm"}                       # one rating is not counted
    assert 1.0 < lifts["list"] < 2.0 and lifts["warm"] < 0
    more = style_lifts(StyleRatings(scores=ones + (5,) * 4, by_style={"list": (5,) * 4}))
    assert more["list"] > lifts["list"]                          # more 5s, a surer lift
    usual = style_lifts(StyleRatings(scores=(3,) * 10, by_style={"list": (3, 3)}))
    assert usual["list"] == pytest.approx(0.0)                  # rated as usual: no lift


def test_a_style_rated_as_the_usual_is_not_lifted_at_either_end_of_the_scale():
    """The lift does not lean towards the middle of the scale: for a person who rates
    nearly everything 5, a style rated 5 (a little above their usual) is lifted by less
    than imitate_styled's 0.5, and for one who rates nearly everything 1, a style rated 1
    is not held back."""
    from reinf.training.styles import style_lifts

    generous = (5,) * 15 + (4,) * 3 + (5,) * 4                    # usual 4.86
    lifts = style_lifts(StyleRatings(scores=generous, by_style={"formal": (5,) * 4,
                                                                 "brief": (5, 4, 5, 5)}))
    assert 0 < lifts["formal"] < 0.15 and lifts["brief"] < 0.0
    harsh = style_lifts(StyleRatings(scores=(1,) * 20, by_style={"warm": (1, 1, 1)}))
    assert harsh["warm"] == pytest.approx(0.0)
    # n / (n + 2) of the difference: three 5s against a usual of 2.2 lift a style by 1.68
    three = style_lifts(StyleRatings(scores=(1,) * 7 + (5,) * 3, by_style={"list": (5,) * 3}))
    assert three["list"] == pytest.approx(3 / 5 * (5 - 2.2))


def test_styled_figures_compare_each_styled_reply_with_the_plain_ones_to_its_prompt():
    from reinf.training.plan import styled_figures

    r = [SimpleNamespace(group=g) for g in (0, 0, 0, 1, 1, 1)]
    scores = [2.0, 4.0, 5.0, 1.0, 3.0, 1.5]
    styles = [None, None, "list", None, "list", "brief"]
    f = styled_figures(r, scores, styles)
    assert f["styled_rollouts"] == 3
    # list: 5 - 3 = +2 and 3 - 1 = +2; brief: 1.5 - 1 = +0.5
    assert f["style_gains"] == {"list": 2.0, "brief": 0.5}
    assert list(f["style_gains"]) == ["list", "brief"]  # best first
    assert f["style_counts"] == {"list": 2, "brief": 1}
    assert f["styled_score_gain"] == pytest.approx((2 + 2 + 0.5) / 3)
    assert styled_figures(r, scores, [None] * 6) == {}


def test_reinf_status_names_the_styles_the_ratings_favour():
    from reinf.cli.system import _describe_training
    from reinf.daemon.status import favoured_styles

    gains = {"Use a list.": 0.4, "Be brief.": -0.2, "Give an example.": 0.1, "Be warm.": 0.05,
             "Use steps.": 0.3}
    assert favoured_styles(gains) == [["Use a list.", 0.4], ["Use steps.", 0.3],
                                      ["Give an example.", 0.1]]
    assert favoured_styles(None) is None and favoured_styles({"Be brief.": -1.0}) == []
    line = _describe_training({"method": "rollouts", "favoured_styles": favoured_styles(gains)})
    assert 'styles your ratings favour: "Use a list." (+0.40), "Use steps." (+0.30)' in line
    none = _describe_training({"method": "rollouts", "favoured_styles": []})
    assert "none above the plain replies" in none
    assert "styles" not in _describe_training({"method": "rollouts", "favoured_styles": None})
    assert "; 3 styled replies imitated" in _describe_training(
        {"method": "rollouts", "favoured_styles": [], "styled_imitated": 3})
    assert "imitated" not in line                     # imitate_styled off


# --- exploring styles: which served replies carry an instruction ------------------------------

def test_the_explorer_styles_about_its_share_of_replies_and_repeats_a_seeded_draw(tokenizer):
    plain = render(tokenizer, "What is rain?")
    styles = ["Use a list.", "Be brief."]
    half = Explorer(tokenizer, styles, 0.5)
    drawn = [half.draw(plain, seed=seed) for seed in range(200)]
    styled = [(ids, style) for ids, style in drawn if style is not None]
    assert 60 <= len(styled) <= 140
    assert {style for _, style in styled} == set(styles)
    for ids, style in styled:  # the instruction where a styled rollout has it
        assert ids == with_instruction(plain, instruction_ids(tokenizer, style),
                                       template_tail(tokenizer))
    assert all(ids == plain for ids, style in drawn if style is None)
    assert [half.draw(plain, seed=s) for s in range(20)] == drawn[:20]  # seeded: repeatable
    # the replies of one seeded call (send_many's batch) draw apart, by their key
    assert any(half.draw(plain, seed=s, key="0") != half.draw(plain, seed=s, key="1")
               for s in range(10))
    assert all(Explorer(tokenizer, styles, 1.0).draw(plain)[1] for _ in range(20))
    assert not any(Explorer(tokenizer, styles, 0.0).draw(plain)[1] for _ in range(20))


# a person who rates most replies 1, and liked the two replies asked for as a list
LIST_LIKED = StyleRatings(scores=(1,) * 20 + (5, 5, 1),
                          by_style={"Use a bulleted list.": (5, 5), "Be warm and encouraging.": (1,)})


def test_picking_by_ratings_asks_more_often_for_a_style_rated_above_the_usual():
    import random

    rng = random.Random(0)
    picks = [pick_style(BUILTIN_STYLES, LIST_LIKED, rng) for _ in range(3000)]
    share = {style: picks.count(style) / len(picks) for style in BUILTIN_STYLES}
    assert share["Use a bulleted list."] > 0.25              # uniform: 1/16 = 0.06
    assert max(v for k, v in share.items() if k != "Use a bulleted list.") < 0.1
    assert share["Be warm and encouraging."] < 1 / 16       # rated below the usual: less
    assert len({p for p in picks}) == len(BUILTIN_STYLES)   # the unrated are still tried
    # a third 5 for the list, more often still
    more = StyleRatings(scores=LIST_LIKED.scores + (5,),
                        by_style={**LIST_LIKED.by_style, "Use a bulleted list.": (5, 5, 5)})
    again = [pick_style(BUILTIN_STYLES, more, rng) for _ in range(3000)]
    assert again.count("Use a bulleted list.") / 3000 > share["Use a bulleted list."] + 0.03


def test_the_explorer_picks_by_ratings_only_when_asked_and_once_there_are_ratings(tokenizer):
    plain = render(tokenizer, "What is rain?")

    def styles_drawn(explorer, rated):
        return [explorer.draw(plain, seed=s, rated=rated)[1] for s in range(400)]

    by_ratings = Explorer(tokenizer, BUILTIN_STYLES, 1.0, pick="ratings")
    drawn = styles_drawn(by_ratings, LIST_LIKED)
    assert drawn.count("Use a bulleted list.") > 80                 # uniform: about 25
    assert drawn == styles_drawn(by_ratings, LIST_LIKED)            # seeded: repeatable
    for explorer, rated in ((by_ratings, StyleRatings()),           # nothing rated yet
                            (Explorer(tokenizer, BUILTIN_STYLES, 1.0), LIST_LIKED)):  # uniform
        assert styles_drawn(explorer, rated).count("Use a bulleted list.") < 50


def test_styled_rollouts_draw_by_the_ratings_without_repeats_within_a_prompt(tokenizer):
    """training.styled_pick: ratings. Every prompt's first styled rollout asks for the
    style rated furthest above the person's usual (rated twice at least), the next one
    for another, drawn by Thompson sampling; with nothing rated above the usual, all are
    drawn that way, and with nothing served in a style rated, or `uniform`, uniformly."""
    prompts = [render(tokenizer, f"Question number {i}?") for i in range(200)]

    def drawn(rated):
        used = styled_contexts(tokenizer, prompts, 4, 2, BUILTIN_STYLES, seed=1,
                               limit=10_000, rated=rated)[2]
        for g in range(len(prompts)):                       # two different styles a prompt
            assert len({u for u in used[4 * g + 2:4 * g + 4]}) == 2
        return used

    by_ratings = drawn(LIST_LIKED)
    assert by_ratings[2::4] == ["Use a bulleted list."] * 200  # the first: the favoured one
    second = by_ratings[3::4]
    assert len(set(second)) == len(BUILTIN_STYLES) - 1          # the others still tried
    assert second.count("Be warm and encouraging.") < 200 / 15  # rated below the usual
    assert by_ratings == drawn(LIST_LIKED)                     # the seed repeats it
    once = StyleRatings(scores=(1,) * 20 + (5,), by_style={"Use a bulleted list.": (5,)})
    assert drawn(once)[2::4].count("Use a bulleted list.") < 100     # one 5: drawn, 35 here
    disliked = StyleRatings(scores=(5,) * 10 + (1,), by_style={"Use a bulleted list.": (1,)})
    assert 0 < drawn(disliked).count("Use a bulleted list.") < 25   # nothing favoured
    for rated in (None, StyleRatings(scores=(1, 5, 3))):      # uniform; nothing styled rated
        assert drawn(rated).count("Use a bulleted list.") < 50


def test_the_favoured_styles_are_those_rated_above_the_usual_best_first():
    rated = StyleRatings(scores=(1,) * 20 + (5, 5, 1, 3),
                         by_style={"Use a bulleted list.": (5, 5), "Be warm and encouraging.": (1,),
                                   "Use numbered steps.": (3,)})
    assert favoured_by_ratings(rated) == [
        {"style": "Use a bulleted list.", "ratings": 2, "mean": 5.0},
        {"style": "Use numbered steps.", "ratings": 1, "mean": 3.0}]
    assert favoured_by_ratings(rated, n=1)[0]["style"] == "Use a bulleted list."
    assert favoured_by_ratings(StyleRatings()) == []


def test_a_styled_prompt_that_would_not_fit_is_sampled_plainly(tokenizer):
    plain = render(tokenizer, "What is rain?")
    always = Explorer(tokenizer, ["Use a list."], 1.0)
    assert always.draw(plain, limit=len(plain))[1] is None
    assert always.draw(plain, limit=len(plain))[0] == plain
    assert always.draw([5, 6, 7])[1] is None  # a prompt the template did not make


def test_ppo_reads_a_reply_served_in_a_style_as_the_round_start_policy_s(tokenizer):
    """Its stored log-probs are of the styled prompt: the episode carries None, and
    build_rollout takes the round-start pass as its behaviour policy (as for a rollout)."""
    from datetime import datetime, timezone

    from reinf.records import Sample
    from reinf.training.session import select_episodes

    embeddings = SimpleNamespace(num_embeddings=len(tokenizer))
    model = SimpleNamespace(get_input_embeddings=lambda: embeddings)
    session = SimpleNamespace(policy=SimpleNamespace(model=model), context_limit=512)
    now = datetime.now(timezone.utc)

    def sample(styled: bool) -> Sample:
        return Sample(turn_id=1, conversation_id=1, turn_index=0, user_id="local",
                      prompt="What is rain?", response="Water.",
                      prompt_ids=render(tokenizer, "What is rain?"), reply_ids=[5, 6],
                      logprobs=[-0.5, -0.25], checkpoint_id=None, score=5, tags=[],
                      comment="", critical=False, rated_at=now, created_at=now,
                      temperature=0.8, styled=styled)
    row = SimpleNamespace(reward=1.0, weight=1.0)
    episodes, skipped = select_episodes(session, [(sample(False), row), (sample(True), row)])
    assert not skipped
    assert episodes[0][2] == [-0.5, -0.25]
    assert episodes[1][2] is None


def test_the_usual_rating_is_the_recent_mean_held_to_the_scale_and_the_lifts_start_from_it():
    from reinf.training.styles import style_lifts, usual_rating
    assert usual_rating(StyleRatings((), {})) == 3.0          # before any rating
    assert usual_rating(StyleRatings((5, 1, 9), {})) == pytest.approx(11 / 3)  # 9 held to 5
    rated = StyleRatings((2,) * 10 + (4, 4), {"Be brief.": (4, 4)})
    lift = style_lifts(rated)["Be brief."]
    assert lift == pytest.approx(2 / 4 * (4 - usual_rating(rated)))

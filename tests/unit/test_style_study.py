"""``reinf bench styles``: the simulated person and what a rated round would imitate, through
the product's own style sampler and lifts."""
from __future__ import annotations

import json

from reinf.bench.style_study import (StylePlan, imitated, knowing_pick, run_style_study,
                                     simulate)
from reinf.records import StyleRatings
from reinf.training.styles import BUILTIN_STYLES

STYLES = list(BUILTIN_STYLES)
LIST = "Use a bulleted list."


def test_a_style_rated_well_above_the_usual_is_imitated_and_none_below_the_margin():
    rated = StyleRatings((1,) * 20 + (5, 5, 5), {LIST: (5, 5, 5), "Be brief.": (1, 1)})
    assert imitated(rated, 0.5) == LIST
    assert imitated(rated, 5.0) is None           # no lift reaches a 5-point margin


def test_the_simulated_person_rates_every_reply_and_only_the_explored_ones_by_style():
    plan = StylePlan(liked=LIST, ratings=(10, 48), draws=1)
    seen = simulate(plan, STYLES, LIST, __import__("random").Random(0))
    assert set(seen) == {10, 48}
    assert len(seen[48].scores) == 48 and set(seen[48].scores) <= {1, 2, 3, 5}
    explored = sum(len(v) for v in seen[48].by_style.values())
    assert 10 < explored < 38                     # about half of 48, by explore_styles 0.5


def test_a_strong_preference_is_found_and_a_person_without_one_only_passes_by_chance():
    plan = StylePlan(liked=LIST, base=0.05, liked_p=0.95, ratings=(32, 40),
                     margins=(0.5, 1.0), draws=60)
    report = json.loads(json.dumps(run_style_study(plan, STYLES)))  # JSON as --json writes it
    liked = report["people"]["liked"]["by_margin"]
    assert liked["0.5"]["40"]["right"] > 2 * liked["0.5"]["40"]["wrong"]
    nobody = report["people"]["no preference"]["by_margin"]
    for margin in ("0.5", "1.0"):
        for n in ("32", "40"):
            assert nobody[margin][n]["right"] == 0.0
            # a higher margin passes a subset of the same draws
            assert nobody["1.0"][n]["wrong"] <= nobody["0.5"][n]["wrong"]
            assert liked["1.0"][n]["wrong"] <= liked["0.5"][n]["wrong"]
    assert nobody["0.5"]["40"]["wrong"] > 0.2     # chance passes are what it measures


def test_the_rule_that_knows_the_person_weighs_fives_against_the_person_s_rates():
    strong = StylePlan(liked=LIST, base=0.05, liked_p=0.95)
    rated = StyleRatings((1,) * 20 + (5, 5, 5), {LIST: (5, 5, 5), "Be brief.": (5, 1)})
    assert knowing_pick(rated, strong, STYLES, 0.5) == LIST
    # one 5 in two is little evidence among 16 styles, and none where a 5 is common
    one = StyleRatings((1,) * 20 + (5, 1), {LIST: (5, 1)})
    assert knowing_pick(one, StylePlan(liked=LIST), STYLES, 0.5) is None
    generous = StylePlan(liked=LIST, base=0.9, liked_p=0.95)
    assert knowing_pick(StyleRatings((5,) * 23, {LIST: (5, 5, 5)}), generous, STYLES, 0.5) is None


def test_the_knowing_rule_finds_a_strong_preference_and_seldom_imitates_for_nobody():
    plan = StylePlan(liked=LIST, base=0.05, liked_p=0.95, ratings=(40,), margins=(0.5,),
                     posteriors=(0.5,), draws=60)
    people = run_style_study(plan, STYLES)["people"]
    knows = people["liked"]["by_posterior"]["0.5"]["40"]
    assert knows["right"] > 0.2 and knows["wrong"] < 0.1
    nobody = people["no preference"]
    assert nobody["by_posterior"]["0.5"]["40"]["wrong"] < nobody["by_margin"]["0.5"]["40"]["wrong"]


def test_the_command_prints_a_table_and_names_a_bad_style(invoke, home):
    result = invoke("bench", "styles", "--draws", "5", "--liked", "3")
    assert result.exit_code == 0, result.output
    assert "likes 'Use a bulleted list.'" in result.output and "likes no style" in result.output
    bad = invoke("bench", "styles", "--liked", "Write a sonnet.")
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "not one of the styles" in bad.output
    bad = invoke("bench", "styles", "--ratings", "60")
    assert bad.exit_code != 0 and "from 1 to 48" in bad.output
    bad = invoke("bench", "styles", "--posteriors", "2")
    assert bad.exit_code != 0 and "--posteriors" in bad.output and "Traceback" not in bad.output
    none = invoke("bench", "styles", "--draws", "5", "--posteriors", "none")
    assert none.exit_code == 0 and "P>=" not in none.output

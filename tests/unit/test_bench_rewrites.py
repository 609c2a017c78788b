"""The simulated person's rewrites for `reinf bench learn --rewrite-every`: an edit of the
model's reply that its own rater rates well, or None where no edit can meet the rule."""
from __future__ import annotations

import pytest

from reinf.bench.learn import LearnPlan, run_learn
from reinf.bench.raters import load_rater
from reinf.bench.text_raters import REWRITERS
from reinf.errors import BadInput

CHATTY = ("Paris is the capital of France! It has about 2.1 million people, and many more in "
          "its metropolitan area. The city is known for the Eiffel Tower, the Louvre and its "
          "cafes! It sits on the Seine, in the north of the country, and it has been the "
          "capital for most of the last thousand years. Would you like to know more about "
          "its history?")
CASES = [  # rater, prompt, a reply it dislikes
    ("bullets", "What is the capital of France?", CHATTY),
    ("length-graded", "What is the capital of France?", CHATTY),
    ("noisy-graded", "What is the capital of France?", CHATTY),
    ("no-question-back", "What is the capital of France?", CHATTY),
    ("no-exclamation", "What is the capital of France?", CHATTY),
    ("context-length", "What is the capital of France?", CHATTY),
    ("arithmetic", "What is 17 + 25?", "17 plus 25 is 43, I think."),
    ("arithmetic", "What is 1200 * 3000?", "That would be 360,000."),
]


@pytest.mark.parametrize("name, prompt, reply", CASES)
def test_a_rewrite_is_an_edit_its_rater_likes(name, prompt, reply):
    rater = load_rater(name, seed=0)
    assert rater(prompt, reply) <= 3, "the case must be a reply the rater dislikes"
    text = rater.rewrite(prompt, reply)
    assert text and text != reply
    assert load_rater(name.replace("noisy-graded", "length-graded"))(prompt, text) >= 4, text


def test_the_edits_keep_the_replys_own_words():
    as_list = REWRITERS["bullets"]("q", CHATTY)
    assert as_list.startswith("- Paris is the capital of France!") and as_list.count("\n- ") == 4
    assert REWRITERS["no-question-back"]("q", CHATTY).endswith("thousand years.")
    assert "!" not in REWRITERS["no-exclamation"]("q", CHATTY)
    assert REWRITERS["arithmetic"]("What is 1200 * 3000?", "x") == "The answer is 3600000."


@pytest.mark.parametrize("name, prompt, reply", [
    ("bullets", "q", "One sentence only."),             # nothing to make a list of
    ("no-exclamation", "q", "Calm."),                     # nothing to edit
    ("no-question-back", "q", "Why?"),                    # nothing left without it
    ("arithmetic", "Tell me a joke", "Knock knock."),     # not a sum
    ("context-length", "How do I bake bread?", "Mix."),  # a fuller how-to needs content
    ("length-graded", "q", "Short already."),
])
def test_no_rewrite_where_an_edit_cannot_meet_the_rule(name, prompt, reply):
    assert load_rater(name).rewrite(prompt, reply) is None


def test_raters_without_a_rewrite_are_refused_before_anything_runs(config):
    for name in ("formal", "gives-example", "answer-first", "prefers-terse"):
        assert load_rater(name).rewrite is None
        with pytest.raises(BadInput, match="cannot rewrite") as info:
            run_learn(config, LearnPlan(rater=name, rewrite_every=2, methods=("reinf",)))
        assert "bullets" in info.value.fix
    with pytest.raises(BadInput, match="baselines do not read rewrites"):
        run_learn(config, LearnPlan(rater="bullets", rewrite_every=2,
                                    methods=("reinf", "sft")))

"""The raters over real text (reinf.bench.text_raters): each on hand-written replies, the
arithmetic and context-dependent ones on their prompts, the noisy one's slips, and which
raters are unseen (no model load)."""
from __future__ import annotations

import random

import pytest

from reinf.bench.prompts import load_builtin
from reinf.bench.raters import NAMES, SLIP, TUNED_ON, load_rater
from reinf.bench.text_raters import (TEXT_RATERS, classify_prompt, parse_arithmetic,
                                     rate_length_graded, stated_number)
from reinf.catalog import PROJECT_ROOT

TUNING_RATERS = PROJECT_ROOT / "docs" / "benchmarks" / "tuning_raters.py"

NEW = tuple(TEXT_RATERS) + ("noisy-graded",)


def words(n: int) -> str:
    return " ".join(["word"] * n) + "."


def rate(name: str, reply: str, prompt: str = "Tell me about it.") -> int:
    return load_rater(name)(prompt, reply)


def test_there_are_ten_new_raters_and_every_name_is_in_the_help():
    from reinf.cli.bench import learn

    assert len(NEW) >= 10 and set(NEW) <= set(NAMES)
    help_text = next(p.help for p in learn.params if p.name == "rater")
    for name in NAMES:
        assert name in help_text, name


def test_new_raters_are_unseen_and_the_tuning_raters_are_not():
    # the real model's settings sweep, and the raters that rate by those two's rules
    # and those the real model's style learning was built and turned on reading
    looked_at = ("length-graded", "formal", "noisy-graded", "casual", "bullets",
                 "gives-example", "no-question-back")
    assert all(load_rater(n).unseen for n in NEW if n not in looked_at)
    for name in ("prefers-terse", "prefers-chatty", "prefers-bullets", "prefers-plain",
                 "dislikes-questions", "noisy") + looked_at:
        assert not load_rater(name).unseen, name
    for function in ("length_graded", "no_bang_q", "second_person", "short_sentences",
                     "with_numbers", "plain_words", "you_for_advice", "numbers_when_counting",
                     "together"):
        rater = load_rater(f"{TUNING_RATERS}:{function}")
        assert rater.name in TUNED_ON and not rater.unseen
        assert 1 <= rater("How?", "You can do it: 2 steps, 3 minutes. Short words.") <= 5


@pytest.mark.parametrize("name", NEW)
def test_an_empty_reply_gets_1_from_every_new_rater(name):
    assert rate(name, "   \n") == 1


@pytest.mark.parametrize("n, score", [(1, 5), (30, 5), (31, 4), (60, 4), (61, 3), (100, 3),
                                      (101, 2), (160, 2), (161, 1), (400, 1)])
def test_length_graded_uses_the_whole_scale(n, score):
    assert rate("length-graded", words(n)) == score


@pytest.mark.parametrize("reply, score", [
    ("Paris is the capital.", 1),
    ("Two options:\n- tea", 2),
    ("- tea\n- coffee", 4),
    ("Options:\n- tea\n- coffee\n- water", 5),
    ("Steps:\n1. Boil water.\n2) Add tea.\n3. Wait.", 5),
    ("```\n- not a list\n- in code\n```", 1),
])
def test_bullets_likes_a_list(reply, score):
    assert rate("bullets", reply) == score


@pytest.mark.parametrize("reply, score", [
    ("Paris is the capital of France.", 5),
    ("Paris. Would you like to know more?", 1),
    ("Do you mean France? It is Paris, in any case.", 2),
    ("Why does ice float? Because it is less dense than water.", 4),
    ("Use this:\n```\nx = a ? b : c\n```\nThat is all.", 5),
])
def test_no_question_back(reply, score):
    assert rate("no-question-back", reply) == score


@pytest.mark.parametrize("reply, score", [
    ("It is Paris.", 5), ("It is Paris!", 3), ("Wow! Paris!", 2), ("Wow! It is Paris! Go!", 1),
    ("Check `a != b` and a != b, or run:\n```\nif (!ok) exit(1);\n```", 5),
])
def test_no_exclamation(reply, score):
    assert rate("no-exclamation", reply) == score


@pytest.mark.parametrize("reply, score", [
    ("Paris is the capital of France.", 5),
    ("Great question! The capital is Paris.", 1),
    ("What a good question. Paris.", 1),
    ("I'd be happy to help with that. The capital is Paris.", 1),
    ("As an AI, I do not travel, but the capital is Paris.", 1),
    ("Sure! I'd be happy to help. Paris.", 1),
    ("Sure! The capital is Paris.", 2),
    ("Certainly, the capital of France is Paris.", 3),
    ("Here's the answer: Paris.", 4),
    ("Well-known fact: it is Paris.", 5),
])
def test_answer_first(reply, score):
    assert rate("answer-first", reply, "What is the capital of France?") == score


def test_answer_first_lets_a_greeting_answer_a_greeting():
    assert rate("answer-first", "Hello! Nice to hear from you.", "Hi there!") == 5
    assert rate("answer-first", "Hello! It is Paris.", "What is the capital of France?") == 2


FORMAL = ("The capital of France is Paris. It has been the seat of government for many "
          "centuries, and it remains the largest city in the country.")


@pytest.mark.parametrize("reply, formal", [
    (FORMAL, 5),
    (FORMAL + " " + " ".join(["It is known for its museums and parks."] * 8)
     + " That's all.", 4),
    ("It's Paris. The city has been the capital for many centuries, and it remains the "
     "largest city in the country, with museums and parks that you'll enjoy.", 2),
    ("Yeah, it's Paris lol \U0001F600 gonna love it!!", 1),
])
def test_formal_and_casual_mirror_each_other(reply, formal):
    assert rate("formal", reply) == formal
    assert rate("casual", reply) == 6 - formal


CODE_PROMPT = "Write a Python function that reverses a string."


@pytest.mark.parametrize("prompt, reply, score", [
    ("How do I save money?", "For example, cook at home.", 5),
    ("How do I save money?", "Cut small costs, e.g. coffee.", 5),
    ("How do I save money?", "Cut small costs such as coffee.", 3),
    ("How do I save money?", "Spend less.", 1),
    (CODE_PROMPT, "Like this:\n```python\ndef rev(s):\n    return s[::-1]\n```", 5),
    (CODE_PROMPT, "Return `s[::-1]`.", 3),
    (CODE_PROMPT, "Slice it backwards.", 1),
])
def test_gives_example(prompt, reply, score):
    assert rate("gives-example", reply, prompt) == score


@pytest.mark.parametrize("prompt, reply, score", [
    ("What is 17 + 25?", "42", 5),
    ("What is 17 + 25?", "17 + 25 = 42.", 5),
    ("What is 17 + 25?", "What is 17 + 25? It's 42.", 5),
    ("What is 17 + 25?", "Adding 17 and 25 gives **42**.", 5),
    ("What is 17 + 25?", "43", 1),
    ("What is 17 + 25?", "17 + 25 is 43, I think.", 1),
    ("What is 17 + 25?", "I am not sure, sorry.", 2),
    ("Quick math: 5 minus 12?", "5 - 12 = -7", 5),
    ("Quick math: 5 minus 12?", "It is 7.", 1),
    ("What do you get if you subtract 9 from 15?", "You get 6.", 5),
    ("What do you get if you subtract 9 from 15?", "-6", 1),
    ("Multiply 5 by 7.", "5 times 7 is 35.", 5),
    ("Quick question, what's 13 \u00d7 3?", "13 \u00d7 3 = 39", 5),
    ("What's the product of 7 and 9?", "The answer: 64", 1),
    ("What is the capital of France?", "Paris, founded 2000 years ago.", 3),
    ("What is 10 / 2?", "5", 3),                  # division is not checked: neutral
    ("What is 2 + 3 + 4?", "9", 3),               # nor a chain
])
def test_arithmetic_checks_the_number(prompt, reply, score):
    assert rate("arithmetic", reply, prompt) == score


def test_arithmetic_reads_every_sum_of_the_prompt_set_and_nothing_else():
    truth = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    words_to_op = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*",
                   "\u00d7": "*", "r-": "-"}
    checked = 0
    for p in load_builtin():
        parsed = parse_arithmetic(p.text)
        assert (parsed is not None) == (p.category == "arithmetic"), p.text
        if parsed is None:
            continue
        a, op, b = parsed
        a, b = (b, a) if op == "r-" else (a, b)
        right = truth[words_to_op.get(op, op)](a, b)
        assert rate("arithmetic", f"The answer is {right:g}.", p.text) == 5, p.text
        assert rate("arithmetic", f"The answer is {right + 1:g}.", p.text) == 1, p.text
        checked += 1
    assert checked >= 30
    assert stated_number("5 \u2212 9 = \u22124") == -4 and stated_number("no number") is None


FACT, HOWTO, OTHER = ("What is the capital of Portugal?", "How do I boil an egg?",
                      "Write a haiku about the sea.")


@pytest.mark.parametrize("prompt, reply, score", [
    (FACT, words(10), 5), (FACT, words(40), 5), (FACT, words(55), 4), (FACT, words(200), 1),
    (HOWTO, words(10), 1), (HOWTO, words(40), 3), (HOWTO, words(85), 5),
    (HOWTO, "Do this:\n1. Boil water.\n2. Add the egg.\n3. Wait six minutes.", 5),
    (HOWTO, "- Boil water.\n- Add the egg for six minutes.", 4),
    (OTHER, words(10), 3), (OTHER, words(200), 3),
])
def test_context_length_wants_short_facts_and_full_how_tos(prompt, reply, score):
    assert rate("context-length", reply, prompt) == score


def test_context_length_classifies_prompts_by_their_own_text():
    prompts = load_builtin()
    kinds = {c: [classify_prompt(p.text) for p in prompts if p.category == c]
             for c in ("fact", "howto", "writing", "chitchat")}
    assert kinds["fact"].count("fact") >= 0.9 * len(kinds["fact"])
    assert kinds["howto"].count("howto") == len(kinds["howto"])
    assert not any(kinds["writing"]) and "fact" not in kinds["chitchat"]
    assert classify_prompt("I'm reading about Rome. When did the Western Empire fall?") == "fact"
    assert classify_prompt("What do you think is the best season?") is None


def test_a_rater_neutral_outside_its_kind_of_prompt_says_its_best_there_is_3():
    """Rater.best_score: the highest rating any reply to the prompt can get, which bounds the
    probe mean (reinf bench learn reports it beside the rise goal)."""
    arithmetic, context = load_rater("arithmetic"), load_rater("context-length")
    assert arithmetic.best_score("What is 12 + 30?") == 5
    assert arithmetic.best_score("Write a haiku about rain.") == 3
    assert arithmetic("Write a haiku about rain.", "Rain falls.") == 3
    assert context.best_score("How do I boil an egg?") == 5
    assert context.best_score("Write a haiku about rain.") == 3
    assert load_rater("bullets").best_score("Write a haiku about rain.") == 5
    # on the built-in prompts, the best of each neutral prompt is what any reply gets there
    for prompt in [p.text for p in load_builtin()][:120]:
        for rater in (arithmetic, context):
            if rater.best_score(prompt) == 3:
                assert {rater(prompt, r) for r in ("- a\n- b\n- c", "42", words(90))} == {3}


def test_noisy_graded_is_off_by_one_about_a_tenth_of_the_time_and_seeded():
    rng = random.Random(0)
    replies = [words(rng.randint(1, 220)) for _ in range(4000)]
    truth = [rate_length_graded("p", r) for r in replies]
    rater = load_rater("noisy-graded", seed=3)
    scores = [rater("p", r) for r in replies]
    again, other = load_rater("noisy-graded", seed=3), load_rater("noisy-graded", seed=4)
    assert [again("p", r) for r in replies] == scores       # a fresh rater replays its slips
    assert [other("p", r) for r in replies] != scores
    diffs = [abs(s - t) for s, t in zip(scores, truth)]
    assert set(diffs) == {0, 1}                              # never more than one off
    assert abs(sum(diffs) / len(diffs) - SLIP) < 0.02
    assert set(scores) == {1, 2, 3, 4, 5}
    # the preferred share follows the truth (rated 4-5 without the slips)
    assert all(rater.is_preferred(r, 1, prompt="p") == (t >= 4)
               for r, t in zip(replies[:200], truth))


def test_a_new_rater_without_preferred_counts_ratings_of_4_and_5():
    arithmetic = load_rater("arithmetic")
    assert arithmetic.is_preferred("42", 5, prompt="What is 17 + 25?")
    assert not arithmetic.is_preferred("Paris", 3, prompt="What is the capital of France?")


def test_a_file_raters_preferred_may_take_the_prompt(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def rate(prompt, reply):\n    return 3\n"
                    "rate.preferred = lambda prompt, reply: prompt in reply\n")
    rater = load_rater(str(path))
    assert rater.unseen and rater.is_preferred("say hi back", 3, prompt="hi")
    assert not rater.is_preferred("hello", 3, prompt="hi")


def test_the_prompt_dependent_tuning_raters_want_opposite_things_for_two_kinds_of_prompt():
    advice = load_rater(f"{TUNING_RATERS}:you_for_advice")
    spoken = "You can start small: your first week sets the habit."
    assert advice("How do I start running?", spoken) == 5
    assert advice("Write a haiku about rain.", spoken) == 1
    counting = load_rater(f"{TUNING_RATERS}:numbers_when_counting")
    figures = "About 8 minutes, or 480 seconds."
    assert counting("How long does light take to reach Earth?", figures) == 5
    assert counting("Write a haiku about rain.", figures) == 1


def test_the_rare_style_tuning_rater_likes_working_through_it_together():
    together = load_rater(f"{TUNING_RATERS}:together")
    assert together("How do I boil an egg?", "Let's start: we put the egg in water.") == 5
    assert together("How do I boil an egg?", "Put the egg in our pot.") == 4
    assert together("How do I boil an egg?", "Put the egg in water for 8 minutes.") == 2
    assert together("How do I boil an egg?", "Use the bus.") == 2   # 'us' is a word, not a part
    assert together("How do I boil an egg?", "  ") == 1

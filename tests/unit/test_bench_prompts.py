"""`reinf bench learn`'s prompts (reinf.bench.prompts): the built-in set, the split rule, a
person's files, the training streams, and a probe that is held out, on a real model and on
the demo model (no model load)."""
from __future__ import annotations

import fnmatch
import json
import tomllib
from collections import Counter

import pytest

from reinf.bench.learn import LearnPlan, format_prompts, plan_prompts
from reinf.bench.prompts import (CATEGORIES, PROBE_SHARE, Prompt, build_prompt_plan, check_disjoint,
                                 demo_training_prompts, in_probe, load_builtin, load_prompt_file,
                                 normalise, order_probe, repeat_to, split_prompts, stream_prompts,
                                 unique)
from reinf.catalog import PROJECT_ROOT
from reinf.demo.corpus import generate_corpus, sample_prompts, split_corpus
from reinf.errors import BadInput

DEMO_DIR = PROJECT_ROOT / "models" / "reinf-demo"


@pytest.fixture(scope="module")
def builtin():
    return load_builtin()


def test_the_builtin_set_has_enough_prompts_in_every_category(builtin):
    assert len(builtin) >= 300
    counts = Counter(p.category for p in builtin)
    assert set(counts) == set(CATEGORIES)
    assert all(counts[c] >= 30 for c in CATEGORIES), counts
    assert len(unique(builtin)) == len(builtin)            # no near-duplicates inside it
    # short prompts and multi-sentence ones
    assert sum(len(p.text.split()) <= 4 for p in builtin) >= 30
    assert sum(len([s for s in p.text.replace("?", ".").split(". ") if s.strip()]) >= 2
               for p in builtin) >= 30


def test_the_wheel_ships_the_prompt_set():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "reinf.bench" in project["tool"]["setuptools"]["packages"]
    patterns = project["tool"]["setuptools"]["package-data"]["reinf.bench"]
    assert any(fnmatch.fnmatch("data/prompts.jsonl", p) for p in patterns)
    assert (PROJECT_ROOT / "reinf" / "bench" / "data" / "prompts.jsonl").is_file()


def test_normalise_keeps_digits_and_drops_case_space_and_punctuation():
    assert normalise("  What IS 17 + 25?!  ") == "what is 17 25"
    assert normalise("what's\tthe   capital\nof France") == "what s the capital of france"
    assert normalise("Hello, world.") == normalise("hello world")
    assert normalise("Tabs or spaces\u2014really?") == "tabs or spaces really"


def test_the_split_is_disjoint_and_a_quarter_is_probe(builtin):
    train, probe = split_prompts(builtin)
    assert len(train) + len(probe) == len(builtin)
    assert abs(len(probe) / len(builtin) - PROBE_SHARE) < 0.05
    assert not {normalise(p.text) for p in train} & {normalise(p.text) for p in probe}
    check_disjoint([p.text for p in train], [p.text for p in probe])
    by_train, by_probe = Counter(p.category for p in train), Counter(p.category for p in probe)
    assert all(by_probe[c] >= 8 and by_train[c] >= 30 for c in CATEGORIES), (by_train, by_probe)


def test_near_duplicates_land_on_the_same_side():
    for text in [p.text for p in load_builtin()[::7]] + ["What is 2+2?", "Hi!"]:
        variants = [text.upper(), f"  {text.lower()}  ", text.replace(" ", "   "),
                    text.rstrip("?.!") + "?!", text.replace(",", "")]
        assert {in_probe(v) for v in variants} == {in_probe(text)}, text
    train, probe = split_prompts([Prompt("What is 2 + 2?"), Prompt("what is 2+2"),
                                  Prompt("WHAT IS 2 2 ?!")])
    assert len(train) + len(probe) == 1                     # one of the three is kept
    with pytest.raises(AssertionError, match="also training prompts"):
        check_disjoint(["How do I tie a tie?"], ["how do i TIE a tie"])


def test_a_stream_is_seeded_and_draws_from_the_training_side(builtin):
    train, _ = split_prompts(builtin)
    a = stream_prompts(train, 0, 96)
    assert a == stream_prompts(train, 0, 96) and a != stream_prompts(train, 1, 96)
    assert len(a) == 96 and len(set(a)) == 96               # no repeat before the side is used up
    assert set(a) <= {p.text for p in train}
    long = stream_prompts(train, 0, 2 * len(train) + 5)
    assert Counter(long).most_common(1)[0][1] == 3 and min(Counter(long).values()) == 2


def test_the_probe_order_is_fixed_and_mixes_every_category(builtin):
    _, probe = split_prompts(builtin)
    ordered = order_probe(probe)
    assert ordered == order_probe(list(reversed(probe)))
    assert {p.category for p in ordered[:len(CATEGORIES)]} == set(CATEGORIES)
    assert repeat_to([1, 2, 3], 7) == [1, 2, 3, 1, 2, 3, 1] and repeat_to([], 3) == []


def test_a_real_model_trains_on_one_side_and_probes_on_the_other(builtin):
    plan = build_prompt_plan(demo=False, seeds=[0, 1, 2], ratings=96)
    train, probe = split_prompts(builtin)
    assert plan.probe == [p.text for p in order_probe(probe)]
    trained = {normalise(t) for s in plan.streams.values() for t in s}
    assert not trained & {normalise(p) for p in plan.probe}
    assert all(len(s) == 96 for s in plan.streams.values())
    info = plan.info
    assert info["probe_disjoint"] is True and info["overlaps_removed"] == 0
    assert (info["train_prompts"], info["probe_prompts"]) == (len(train), len(probe))
    assert sum(info["train_by_category"].values()) == len(train)
    assert "prompts.jsonl" in info["train_source"] and "probe side" in info["probe_source"]


def test_the_demo_probe_is_disjoint_from_its_streams_and_its_training_split():
    seeds = [0, 1, 2]
    plan = build_prompt_plan(demo=True, seeds=seeds, ratings=96, model_dir=DEMO_DIR)
    # worked out here independently: the demo build's corpus (models/reinf-demo says how)
    built = json.loads((DEMO_DIR / "reinf_demo.json").read_text())
    corpus_train, held = split_corpus(generate_corpus(seed=built["seed"],
                                                      n=built["corpus_size"]),
                                      seed=built["seed"])
    trained_on = {normalise(it["prompt"]) for it in corpus_train}
    assert demo_training_prompts(DEMO_DIR) == trained_on
    streams = {s: sample_prompts(s, 96) for s in seeds}
    assert plan.streams == streams                          # the demo keeps its corpus prompts
    probe = {normalise(p) for p in plan.probe}
    assert len(plan.probe) >= 128 and len(probe) == len(plan.probe)
    assert not probe & trained_on
    assert not probe & {normalise(p) for s in streams.values() for p in s}
    assert {normalise(it["prompt"]) for it in held} & probe  # unseen questions get in
    info = plan.info
    assert info["probe_disjoint"] is True and info["overlaps_removed"] > 0
    assert info["overlaps_removed"] == (info["overlaps_removed_training"]
                                        + info["overlaps_removed_demo_split"])


def test_bench_learn_picks_the_demo_or_the_prompt_set_by_model(config):
    demo = plan_prompts(config, LearnPlan(seeds=2, ratings=16), [0, 1])
    assert demo.streams[0] == sample_prompts(0, 16)
    assert not {normalise(p) for p in demo.probe} & demo_training_prompts(DEMO_DIR)
    real = plan_prompts(config.replace(model_path="smollm2-135m"), LearnPlan(ratings=16), [0])
    assert real.info["train_source"].endswith("training side")
    assert set(real.streams[0]) <= {p.text for p in split_prompts(load_builtin())[0]}


@pytest.mark.parametrize("suffix", [".txt", ".jsonl"])
def test_a_persons_file_alone_is_split_by_the_same_rule(tmp_path, suffix):
    texts = [p.text for p in load_builtin()[:60]]
    path = tmp_path / f"mine{suffix}"
    if suffix == ".txt":
        path.write_text("# my prompts\n\n" + "\n".join(texts) + "\n")
    else:
        path.write_text("\n".join(json.dumps({"prompt": t}) for t in texts) + "\n\n")
    assert [p.text for p in load_prompt_file(path)] == texts
    plan = build_prompt_plan(demo=False, seeds=[0], ratings=10, prompts_file=path)
    assert sorted(plan.probe) == sorted(t for t in texts if in_probe(t))
    assert set(plan.streams[0]) <= {t for t in texts if not in_probe(t)}
    assert plan.info["train_source"] == f"{path}, training side"


def test_both_files_drop_probe_prompts_that_are_training_prompts(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("How do I tie a tie?\nWhat is 2 + 2?\nWrite a haiku.\n")
    probe = tmp_path / "probe.jsonl"
    probe.write_text('{"prompt": "how do I tie a TIE"}\n{"prompt": "What is 2+2", '
                     '"category": "arithmetic"}\n{"prompt": "Who wrote Hamlet?", '
                     '"category": "fact"}\n')
    plan = build_prompt_plan(demo=False, seeds=[0, 1], ratings=5, prompts_file=train,
                             probe_file=probe)
    assert plan.probe == ["Who wrote Hamlet?"]
    assert plan.info["overlaps_removed"] == 2 and plan.info["probe_disjoint"] is True
    assert plan.info["train_prompts"] == 3 and plan.info["probe_by_category"] == {"fact": 1}
    # a probe file alone is checked against the built-in training side
    alone = build_prompt_plan(demo=False, seeds=[0], ratings=5, probe_file=probe)
    assert alone.info["train_source"].endswith("training side")
    overlap = tmp_path / "overlap.txt"
    overlap.write_text("how do i tie a tie\n")
    with pytest.raises(BadInput) as info:
        build_prompt_plan(demo=False, seeds=[0], ratings=5, prompts_file=train,
                          probe_file=overlap)
    assert "no probe prompt is left" in info.value.message and "--probe-prompts" in info.value.fix


@pytest.mark.parametrize("name, text, words", [
    ("bad.jsonl", '{"prompt": "fine"}\n{"prompt": \n', "line 2: not JSON"),
    ("bad.jsonl", '{"prompt": "fine"}\n\n["a list"]\n', "line 3: not a JSON object"),
    ("bad.jsonl", '{"text": "no prompt key"}\n', 'line 1: no "prompt"'),
    ("bad.jsonl", '{"prompt": "x", "category": 3}\n', 'line 1: "category" must be text'),
    ("empty.txt", "# only a comment\n\n", "holds no prompts"),
    ("prompts.csv", "a,b\n", "neither .txt nor .jsonl"),
    ("missing.txt", None, "not found"),
])
def test_a_bad_prompt_file_is_one_line_naming_file_and_line(tmp_path, name, text, words):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(BadInput) as info:
        load_prompt_file(path)
    assert words in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_the_cli_refuses_a_bad_prompt_file_before_loading_anything(invoke, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\nnot json\n')
    result = invoke("bench", "learn", "--prompts", bad, "--baselines", "none")
    assert result.exit_code == 1
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{bad}, line 2: not JSON" in lines[0], result.output
    help_text = invoke("bench", "learn", "--help").output
    assert "--prompts" in help_text and "--probe-prompts" in help_text


def test_the_text_report_names_the_prompts_and_whether_the_rater_is_unseen():
    report = {"rater": {"name": "bullets", "unseen": True},
              "prompts": {"train_prompts": 290, "train_source": "set, training side",
                          "probe_prompts": 94, "probe_source": "set, probe side",
                          "probe_replies": 128, "overlaps_removed": 0, "split": "rule"}}
    text = format_prompts(report)
    assert "290 training (set, training side)" in text and "94 probe" in text
    assert "held out" in text and "unseen" in text
    report["rater"] = {"name": "prefers-terse", "unseen": False}
    assert "used to choose the defaults" in format_prompts(report)


def test_a_rater_read_to_choose_the_rewrite_rule_is_not_unseen_in_a_run_with_rewrites():
    from reinf.bench.learn import LearnPlan, rater_record
    from reinf.bench.raters import REWRITE_TUNED_ON, load_rater

    assert "arithmetic" in REWRITE_TUNED_ON
    arithmetic, other = load_rater("arithmetic"), load_rater("answer-first")
    assert rater_record(arithmetic, LearnPlan())["unseen"]       # ratings alone: still unseen
    with_rewrites = LearnPlan(rewrite_every=2)
    record = rater_record(arithmetic, with_rewrites)
    assert not record["unseen"] and record["rewrites"]
    assert rater_record(other, with_rewrites)["unseen"]
    report = {"rater": record, "prompts": {
        "train_prompts": 290, "train_source": "set", "probe_prompts": 94,
        "probe_source": "set", "probe_replies": 64, "overlaps_removed": 0}}
    assert "REWRITE_TUNED_ON" in format_prompts(report)

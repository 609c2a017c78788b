"""`reinf bench learn --prompts` on the demo model, tiny: the chat is fed the file's training
side only, the probe is held out, and the report says so."""
from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
import trainkit as tk

from reinf.bench.prompts import in_probe, load_builtin, normalise

pytestmark = pytest.mark.e2e


restore_threads = pytest.fixture(autouse=True)(tk.threads_restored)


def test_learn_trains_on_the_file_and_probes_on_held_out_prompts(invoke, tmp_path):
    texts = [p.text for p in load_builtin()[::6]]
    path = tmp_path / "mine.txt"
    path.write_text("\n".join(texts) + "\n")
    result = invoke("bench", "learn", "--json", "--threads", "1", "--heldout", "24", "--plot",
                    tmp_path / "p.png",
                    "--prompts", path, "--rater", "answer-first", "--ratings", "4",
                    "--train-after", "4", "--window", "4", "--probe", "2", "--final-probe",
                    "3", "--seeds", "1", "--baselines", "none", "--keep")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    prompts = report["prompts"]
    train = {normalise(t) for t in texts if not in_probe(t)}
    probe = {normalise(t) for t in texts if in_probe(t)}
    assert prompts["probe_disjoint"] is True and prompts["overlaps_removed"] >= 0
    assert prompts["train_source"] == f"{path}, training side"
    assert prompts["train_prompts"] == len(train) and prompts["probe_replies"] == 3
    # the demo model's training split is kept out of the probe as well
    assert prompts["probe_prompts"] == len(probe) - prompts["overlaps_removed_demo_split"]
    assert report["rater"] == {"name": "answer-first", "description": report["rater"][
        "description"], "unseen": True, "rewrites": False}
    run = report["methods"]["reinf"]["seeds"][0]
    try:
        db = sqlite3.connect(f"{run['data_dir']}/reinf.db")
        asked = [row[0] for row in db.execute("SELECT user_message FROM turns ORDER BY id")]
        db.close()
    finally:
        shutil.rmtree(run["data_dir"], ignore_errors=True)
    assert len(asked) == 4 and {normalise(a) for a in asked} <= train
    assert not {normalise(a) for a in asked} & probe


def test_learn_with_rewrites_stores_what_the_simulated_person_wrote(invoke, tmp_path):
    """--rewrite-every 1: every reply rated 2 or below that the rater can edit toward its
    rule (bullets: its sentences as a list) is stored as a rewrite, and the round reads it."""
    from reinf.bench.text_raters import rate_bullets

    result = invoke("bench", "learn", "--json", "--threads", "1", "--heldout", "24", "--plot",
                    tmp_path / "p.png", "--rater", "bullets", "--ratings", "8",
                    "--train-after", "8", "--window", "8", "--probe", "2", "--final-probe",
                    "2", "--seeds", "1", "--baselines", "none", "--rewrite-every", "1",
                    "--keep")
    assert result.exit_code == 0, result.output
    run = json.loads(result.stdout)["methods"]["reinf"]["seeds"][0]
    try:
        db = sqlite3.connect(f"{run['data_dir']}/reinf.db")
        rows = db.execute("SELECT t.user_message, t.reply, w.text, r.score FROM rewrites w "
                          "JOIN turns t ON t.id = w.turn_id "
                          "JOIN ratings r ON r.turn_id = t.id").fetchall()
        db.close()
    finally:
        shutil.rmtree(run["data_dir"], ignore_errors=True)
    assert run["rewrites"] == len(rows) > 0
    for prompt, reply, text, score in rows:
        assert score <= 2 and text != reply and rate_bullets(prompt, text) >= 4
    assert run["rounds"][0]["rewrites"] == len(rows)

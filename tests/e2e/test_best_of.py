"""Best-of-n at serve time (generation.best_of): the engine samples N replies to a message in
one batch and the active checkpoint's rating model keeps one, on a tiny random Qwen2."""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from safetensors.torch import save_file
from test_engine import fresh_model, reforward
from tiny import make_adapter, make_tiny_model

import reinf.serving.engine as engine_module
from reinf.model.sampling import decode
from reinf.serving.chat import ChatService
from reinf.serving.engine import Engine
from reinf.training.checkpoints import RATING_MODEL
from reinf.training.rating_model import fit_rating_model

pytestmark = pytest.mark.e2e
PROMPT = "Tell me about the sea"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bestof")
    tiny = make_tiny_model(root / "tiny", seed=0)
    return {"tiny": tiny, "root": root,
            **{name: make_adapter(tiny, root / name, seed=seed)
               for name, seed in (("trusted", 1), ("untrusted", 2), ("bare", 3),
                                  ("broken", 4))}}


@pytest.fixture(scope="module")
def rating_models(models, tmp_path_factory):
    """A rating model fitted as the trainer fits one, on replies of varied length rated by
    shortness (a clear preference: the features carry the length), saved beside the
    adapters as the trainer saves it; an untrusted copy (Spearman below
    training.min_consistency) and a damaged file beside the others."""
    from reinf.config import load_config

    home = tmp_path_factory.mktemp("fit-home")
    config = load_config(environ={"REINF_HOME": str(home)}).replace(
        model_path=str(models["tiny"]))
    engine = Engine(engine_module.load_model(config), config)
    prompt = engine.build_prompt([], PROMPT)
    gen = torch.Generator().manual_seed(0)
    lengths = [1 + (i * 5) % 23 for i in range(64)]
    replies = [torch.randint(10, 300, (n,), generator=gen).tolist() for n in lengths]
    features = engine.rating_features([(prompt, r) for r in replies])
    scores = [max(1.0, min(5.0, 5.0 - (n - 1) / 5.5)) for n in lengths]
    model = fit_rating_model(features, scores, heads=5, seed=0)
    assert model.consistency is not None and model.consistency > 0.5, model.consistency
    save_file(model.state_dict(), str(models["trusted"] / RATING_MODEL))
    weak = dataclasses.replace(model, consistency=0.1)
    save_file(weak.state_dict(), str(models["untrusted"] / RATING_MODEL))
    (models["broken"] / RATING_MODEL).write_bytes(b"not a safetensors file")
    return {"trusted": model, "untrusted": weak}


def make_engine(models, config, best_of):
    return Engine.load(config.replace(model_path=str(models["tiny"]), max_new_tokens=12,
                                      best_of=best_of, temperature=1.0, top_p=1.0))


def capture_candidates(monkeypatch):
    """Record the rows the engine's decode samples: {row: [(token, logprob, live)]}."""
    seen: list[dict] = []

    def recording(model, prompts, **kwargs):
        rows = {i: [] for i in range(len(prompts))}
        seen.append(rows)
        for step in decode(model, prompts, **kwargs):
            for i, row in rows.items():
                if bool(step.live[i]):
                    row.append(int(step.tokens[i]))
            yield step
    monkeypatch.setattr(engine_module, "decode", recording)
    return seen


def test_best_of_keeps_the_candidate_the_rating_model_scores_highest(
        models, rating_models, config, store, monkeypatch):
    engine = make_engine(models, config, 4)
    engine.request_swap("trusted", models["trusted"])
    assert engine.best_of_status()["active"]
    seen = capture_candidates(monkeypatch)
    chat = ChatService(engine, store, engine.config)
    stream = chat.stream(PROMPT, seed=11)
    deltas = list(stream)
    turn = stream.wait()
    params = turn.gen_params
    assert params["best_of"] == 4 and params["best_of_checkpoint_id"] == "trusted"
    scores, chosen = params["best_of_scores"], params["best_of_chosen"]
    assert len(seen) == 1 and len(seen[0]) == 4 and len(scores) == 4
    candidates = [seen[0][i] for i in range(4)]
    # the candidates' scores, by compare's path: engine features + the checkpoint's model
    features = engine.rating_features([(turn.prompt_ids, c) for c in candidates])
    expected = rating_models["trusted"].score(features, config.training.pessimism).tolist()
    assert scores == pytest.approx(expected, abs=1e-3)
    assert len(set(scores)) > 1  # the choice means something
    assert chosen == max(range(4), key=lambda i: (scores[i], -i))
    assert turn.reply_ids == candidates[chosen] and turn.checkpoint_id == "trusted"
    assert deltas == [turn.reply]  # the text in one piece, after the choice
    # PPO's invariant: a plain forward under the same adapter gives the stored log-probs
    again = reforward(fresh_model(models["tiny"], models["trusted"]), turn.prompt_ids,
                      turn.reply_ids, 1.0)
    assert torch.allclose(again, torch.tensor(turn.logprobs), atol=1e-4, rtol=0)
    # the history shows it
    assert store.get_turn(turn.id).gen_params["best_of_chosen"] == chosen


def test_best_of_one_is_the_plain_streamed_reply(models, config):
    engine = make_engine(models, config, 1)
    engine.request_swap("trusted", models["trusted"])
    stream = engine.stream([], PROMPT, seed=5)
    deltas = list(stream)
    reply = stream.wait()
    assert "best_of" not in reply.gen_params and "best_of_used" not in reply.gen_params
    assert "".join(deltas) == reply.text
    # the plain path by hand: a batch of one, the same seed
    gen = torch.Generator().manual_seed(5)
    plain = []
    for step in decode(engine.model, [reply.prompt_ids], temperature=1.0, top_p=1.0,
                       max_new_tokens=12, generator=gen, eos_ids=engine.eos_ids):
        plain.append(int(step.tokens[0]))
        if bool(step.ended[0]):
            break
    assert reply.reply_ids == plain
    assert engine.best_of_status()["reason"].startswith("off")


@pytest.mark.parametrize("checkpoint, words", [
    (None, "base model is served"),
    ("untrusted", "below training.min_consistency"),
    ("bare", "carries no rating model"),
    ("broken", "cannot be read"),
])
def test_without_a_trusted_rating_model_one_streamed_reply_says_why(
        models, rating_models, config, checkpoint, words, caplog):
    engine = make_engine(models, config, 4)
    with caplog.at_level(logging.WARNING, logger="reinf.serving.engine"):
        if checkpoint is not None:
            engine.request_swap(checkpoint, models[checkpoint])
    assert (checkpoint == "broken") == any("cannot be read" in r.getMessage()
                                           for r in caplog.records)
    status = engine.best_of_status()
    assert not status["active"] and words in status["reason"]
    stream = engine.stream([], PROMPT, seed=5)
    deltas = list(stream)
    reply = stream.wait()
    assert reply.gen_params["best_of"] == 4 and reply.gen_params["best_of_used"] == 1
    assert words in reply.gen_params["best_of_reason"]
    assert "".join(deltas) == reply.text and reply.checkpoint_id == checkpoint
    # the same reply as best_of 1 gives
    plain = make_engine(models, config, 1)
    if checkpoint is not None:
        plain.request_swap(checkpoint, models[checkpoint])
    assert plain.generate([], PROMPT, seed=5).reply_ids == reply.reply_ids


def test_a_swap_to_base_and_back_follows_the_rating_model(models, rating_models, config,
                                                          store):
    from reinf.daemon.status import best_of_status

    engine = make_engine(models, config, 3)
    engine.request_swap("trusted", models["trusted"])
    assert best_of_status(engine.config, None, engine)["line"] == \
        "best-of-3: on (rating model of trusted)"
    engine.request_swap(None)
    line = best_of_status(engine.config, None, engine)["line"]
    assert line.startswith("best-of-3: waiting for a trusted rating model")
    engine.request_swap("trusted")  # rollback: loaded, no directory given
    assert engine.best_of_status()["active"]
    reply = engine.generate([], PROMPT, seed=2)
    assert reply.gen_params["best_of_checkpoint_id"] == "trusted"
    # an adapter borrowed for one reply (compare) is never reranked
    borrowed = engine.stream_prompt(reply.prompt_ids, engine.generation_params(seed=2),
                                    adapter=engine.borrow(None)).wait()
    assert "best_of" not in borrowed.gen_params


def test_stop_during_best_of_keeps_the_first_candidate_interrupted(
        models, rating_models, config, monkeypatch):
    from enginekit import hold_after_first_token

    engine = make_engine(models, config, 4)
    engine.request_swap("trusted", models["trusted"])
    gate, held = hold_after_first_token(engine, monkeypatch)
    stream = engine.stream([], PROMPT, seed=3)
    assert held.wait(30)
    stream.stop()
    gate.set()
    reply = stream.wait(30)
    assert reply.interrupted and reply.finish_reason == "interrupted"
    assert reply.gen_params["best_of_used"] == 1 and 1 <= len(reply.reply_ids) <= 2
    assert len(reply.logprobs) == len(reply.reply_ids)

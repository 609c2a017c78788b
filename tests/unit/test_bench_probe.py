"""reinf.bench.probe's general-text perplexity: the passages it reads and the figure it
computes, checked against the model's own loss on the same tokens."""
from __future__ import annotations

import json
import math
from collections import Counter
from importlib import resources

import pytest
import torch

from reinf.bench.probe import load_general_text, load_heldout, measure_policy
from reinf.catalog import PROJECT_ROOT

pytestmark = pytest.mark.stack

DEMO = PROJECT_ROOT / "models" / "reinf-demo"


@pytest.fixture(scope="module")
def demo():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(DEMO).float().eval()
    return model, AutoTokenizer.from_pretrained(DEMO)


def passages() -> list[dict]:
    text = resources.files("reinf.bench").joinpath("data", "general_text.jsonl").read_text(
        encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_the_general_text_is_plain_prose_of_eight_kinds():
    items = passages()
    assert len(items) == 64
    assert set(Counter(i["kind"] for i in items).values()) == {8}
    for item in items:
        words = len(item["text"].split())
        assert 80 <= words <= 180, (words, item["text"][:60])
        # not written in any assistant style: no list, heading or bold
        assert "\n- " not in item["text"] and "**" not in item["text"]
        assert not item["text"].lstrip().startswith(("-", "#", "1."))


def test_each_passage_is_scored_from_its_second_token(demo):
    _, tokenizer = demo
    general = load_general_text(tokenizer)
    assert len(general.episodes) == 64 and len(set(general.kinds)) == 8
    for (prompt, reply, logprobs, temperature, *_), item in zip(general.episodes, passages()):
        assert len(prompt) == 1 and len(logprobs) == len(reply) and temperature == 1.0
        assert tokenizer.decode(prompt + reply) == item["text"]


def test_general_perplexity_is_the_models_own_loss_on_the_passages(demo):
    from reinf.training.ppo import Policy, ValueHead

    model, tokenizer = demo
    general = load_general_text(tokenizer)
    general.episodes = general.episodes[:6]
    policy = Policy(model, ValueHead(model.config.hidden_size))
    m = measure_policy(policy, [], load_heldout(tokenizer, 4), adapter=False, batch_size=4,
                       general=general)
    nll = tokens = 0.0
    with torch.no_grad():
        for prompt, reply, *_ in general.episodes:
            ids = torch.tensor([prompt + reply])
            logp = model(ids).logits.float().log_softmax(-1)[0, :-1]
            nll -= float(logp.gather(1, ids[0, 1:, None]).sum())
            tokens += len(reply)
    assert m["perplexity_general"] == pytest.approx(math.exp(nll / tokens), rel=1e-4)
    # without passages the figure is not measured at all
    assert "perplexity_general" not in measure_policy(
        policy, [], load_heldout(tokenizer, 4), adapter=False, batch_size=4)

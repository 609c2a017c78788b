"""reinf.bench.probe's general-text perplexity on the demo model: the passages are scored
from their second token, and the figure is the model's own loss on those tokens."""
from __future__ import annotations

import json
import math
from importlib import resources

import pytest
import torch

from reinf.bench.probe import load_general_text, load_heldout, measure_policy
from reinf.catalog import PROJECT_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers

DEMO = PROJECT_ROOT / "models" / "reinf-demo"


@pytest.fixture(scope="module")
def demo():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(DEMO).float().eval()
    return model, AutoTokenizer.from_pretrained(DEMO)


def test_each_passage_is_scored_from_its_second_token(demo):
    _, tokenizer = demo
    general = load_general_text(tokenizer)
    assert len(general.episodes) == 64 and len(set(general.kinds)) == 8
    lines = resources.files("reinf.bench").joinpath("data", "general_text.jsonl").read_text(
        encoding="utf-8").splitlines()
    texts = [json.loads(line)["text"] for line in lines if line.strip()]
    for (prompt, reply, logprobs, temperature, *_), text in zip(general.episodes, texts):
        assert len(prompt) == 1 and len(logprobs) == len(reply) and temperature == 1.0
        assert tokenizer.decode(prompt + reply) == text


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

"""The one scoring path (reinf.model.sampling.token_logprobs) against the plain definition, on
tiny random models: left padding, per-row temperatures, the model's own soft cap, the
hand-written backward, and the exact KL."""
from __future__ import annotations

import pytest
import torch

from reinf.model.sampling import _LogProbAt, kl_per_token, token_logprobs
from reinf.training.ppo import build_rollout

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers

SIZE = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128)


def tiny(family: str):
    import transformers

    torch.manual_seed(0)
    if family == "gemma2":
        config = transformers.Gemma2Config(**SIZE, head_dim=8, final_logit_softcapping=0.5,
                                           query_pre_attn_scalar=8)
    else:
        config = transformers.LlamaConfig(**SIZE)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


EPISODES = [([5, 6, 7, 8], [9, 10], [0.0, 0.0], 0.7, 0.0, 1.0),
            ([3], [4, 5, 6, 7, 8], [0.0] * 5, 1.0, 0.0, 1.0),
            ([11, 12], [13], [0.0], 1.3, 0.0, 1.0)]


def plain_logprobs(model, prompt, reply, temperature) -> torch.Tensor:
    """Each row alone, the whole sequence, every column's logits: the definition."""
    ids = torch.tensor([list(prompt) + list(reply)])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # (r, V)
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(1, torch.tensor(reply)[:, None]).squeeze(1)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_token_logprobs_equal_each_row_scored_alone(family):
    model = tiny(family)
    b = build_rollout(EPISODES)
    with torch.no_grad():
        out = token_logprobs(model, b.input_ids, b.attention_mask, b.positions, b.actions,
                             b.mask, b.temperature, hidden=True)
        for i, (prompt, reply, _, temperature, *_rest) in enumerate(EPISODES):
            expected = plain_logprobs(model, prompt, reply, temperature)
            assert torch.allclose(out.logp[i, :len(reply)], expected, atol=1e-5), family
    assert out.entropy.shape == b.mask.shape and bool((out.entropy[b.mask > 0] > 0).all())
    assert out.hidden.shape == (*b.mask.shape, SIZE["hidden_size"])


def test_the_soft_cap_is_applied_by_the_models_own_forward():
    """A Gemma 2 forward caps the logits at 0.5: no log-prob can be below what a cap of 0.5
    over 97 tokens allows, which an uncapped head would break."""
    model = tiny("gemma2")
    b = build_rollout(EPISODES[:1])
    with torch.no_grad():
        out = token_logprobs(model, b.input_ids, b.attention_mask, b.positions, b.actions,
                             b.mask, torch.ones(1))
    floor = -1.0 - torch.log(torch.tensor(96 * torch.e ** 1.0 + torch.e ** -1.0)).item() - 0.01
    assert float(out.logp[0, :2].min()) > floor


def test_the_hand_written_backward_matches_autograd():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 13, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([[0, 1, 2, 2], [1, 2, 3, 0]])  # row 0's last entry is padding
    actions = torch.tensor([[3, 5, 7, 0], [1, 2, 12, 0]])
    temp = torch.tensor([[0.7] * 4, [1.3] * 4], dtype=torch.float64)
    weights = torch.randn(2, 4, dtype=torch.float64)

    ours = _LogProbAt.apply(logits, index, actions, temp)
    (ours * weights).sum().backward()
    grad_ours = logits.grad.clone()
    logits.grad = None
    picked = logits[torch.arange(2)[:, None], index] / temp[..., None]       # (2, 4, 13)
    plain = torch.log_softmax(picked, -1).gather(-1, actions[..., None]).squeeze(-1)
    (plain * weights).sum().backward()
    assert torch.allclose(ours.double(), plain, atol=1e-6)
    assert torch.allclose(grad_ours, logits.grad, atol=1e-6)


def test_kl_per_token_is_the_exact_kl_and_zero_against_itself():
    model, other = tiny("llama"), tiny("llama")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    b = build_rollout(EPISODES)
    args = (b.input_ids, b.attention_mask, b.positions, b.actions, b.mask, b.temperature)
    with torch.no_grad():
        new = token_logprobs(model, *args, keep_logits=True)
        ref = token_logprobs(other, *args, keep_logits=True)
        kl = kl_per_token(new, ref, b.temperature)
        assert torch.allclose(kl_per_token(new, new, b.temperature), torch.zeros_like(kl),
                              atol=1e-6)
        prompt, reply, _, temperature, *_ = EPISODES[1]
        ids = torch.tensor([list(prompt) + list(reply)])
        p = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / temperature, -1)
        q = torch.log_softmax(other(input_ids=ids).logits[0, :-1].float() / temperature, -1)
        expected = (p.exp() * (p - q)).sum(-1)[len(prompt) - 1:]
    assert torch.allclose(kl[1], expected, atol=1e-5) and bool((kl[1] > 0).all())
    assert not kl.requires_grad
    # as a loss: differentiable, the same figure, and its gradient moves ``other`` towards
    # ``model`` (KL(model || other) falls after one step on other's parameters)
    opt = torch.optim.SGD(other.parameters(), lr=0.5)
    loss_kl = kl_per_token(new, token_logprobs(other, *args, keep_logits=True),
                           b.temperature, grad=True)
    assert loss_kl.requires_grad and torch.allclose(loss_kl.detach(), kl, atol=1e-6)
    (loss_kl * b.mask).sum().backward()
    opt.step()
    with torch.no_grad():
        after = kl_per_token(new, token_logprobs(other, *args, keep_logits=True), b.temperature)
    assert float((after * b.mask).sum()) < float((kl * b.mask).sum())


def test_a_served_adapter_has_no_dropout(tmp_path):
    """The engine's adapters (reinf.model.adapters) come from checkpoints saved with
    lora.dropout 0.05; new LoRA layers start in train mode. Served, they must not drop
    anything: two forwards agree, and agree with plain PEFT in eval mode."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from reinf.model.adapters import Adapters, read_adapter

    trained = get_peft_model(tiny("llama"), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5,
                                                       target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at 0: give the adapter something to do
    trained.save_pretrained(tmp_path / "ckpt", save_embedding_layers=False)  # no hub lookup
    served = tiny("llama")  # eval(), as load_model leaves it
    adapters = Adapters(served)
    adapters.add("r0001", *read_adapter(tmp_path / "ckpt", "r0001"))
    adapters.activate("r0001")
    plain = PeftModel.from_pretrained(tiny("llama"), tmp_path / "ckpt").eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        first, second = adapters.peft(input_ids=ids).logits, adapters.peft(input_ids=ids).logits
        expected = plain(input_ids=ids).logits
        bare = tiny("llama")(input_ids=ids).logits
    assert torch.equal(first, second)
    assert torch.allclose(first, expected, atol=1e-6)
    assert not torch.allclose(first, bare, atol=1e-3)  # the adapter acts

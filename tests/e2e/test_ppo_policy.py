"""The policy forward and the update loop on a tiny LoRA model: off-policy ratios,
temperature, dropout off, gradient checkpointing, the RLOO baseline."""
import math

import pytest
import torch
from peft import LoraConfig, get_peft_model

import trainkit as tk
from reinf.training.ppo import (Hyper, KLController, Policy, ValueHead, build_rollout, train_policy,
                                update_mode)

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers
single_thread = pytest.fixture(autouse=True)(tk.one_thread)
PROMPT, REPLY, T = [1, 17, 23, 54, 9, 1], [tk.GOOD, 77, 12, 2], 0.7


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


def build_policy(model_dir, dropout=0.0, seed=0) -> Policy:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(seed)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout,
                                            target_modules=tk.ALL_LINEAR))
    set_adapter(peft, seed)
    return Policy(peft, ValueHead(model.config.hidden_size))


def set_adapter(peft, seed: int) -> None:
    """Random non-zero LoRA weights: a stand-in for 'the adapter after some training'."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def run_round(policy, logprobs_per_sample, lr=0.0):
    b = build_rollout([(PROMPT, REPLY, lps, T, 1.0, 1.0) for lps in logprobs_per_sample])
    opt = torch.optim.AdamW(policy.parameters(), lr=lr)
    hp = Hyper(batch_size=1, ppo_epochs=1, ppo_clip=0.2, dual_clip=0.0)
    return train_policy(policy, opt, b, KLController(0.05, 0.05), hp)


def test_ratio_is_taken_against_the_stored_behaviour_logprobs(model_dir):
    policy = build_policy(model_dir)
    policy.model.eval()
    current = tk.reply_logprobs(policy.model, PROMPT, REPLY, T)
    set_adapter(policy.model, seed=7)              # an older adapter sampled this reply
    older = tk.reply_logprobs(policy.model, PROMPT, REPLY, T)
    set_adapter(policy.model, seed=0)              # and the current one is back
    assert max(abs(a - b) for a, b in zip(current, older)) > 0.1

    # A re-forward with the adapter that sampled the reply reproduces its log-probs,
    # at the reply's own temperature: the ratio is 1.
    b = build_rollout([(PROMPT, REPLY, current, T, 1.0, 1.0), (PROMPT, REPLY, older, T, 1.0, 1.0)])
    with update_mode(policy.model):
        out = policy.forward(b)
    ratio = (out.logp - b.logp_behaviour).exp()
    assert torch.allclose(ratio[0], torch.ones(4), atol=1e-5)
    assert (ratio[1] - 1).abs().max() > 0.1          # the same reply, an older behaviour
    at_t1 = build_rollout([(PROMPT, REPLY, current, 1.0, 1.0, 1.0)])
    with update_mode(policy.model):
        assert not torch.allclose(policy.forward(at_t1).logp[0], torch.tensor(current), atol=1e-3)

    # Through the update loop (learning rate 0): identical samples, different stored
    # log-probs -> different clip fractions and losses. approx_kl measures this round's
    # own movement, which is none.
    fresh = run_round(policy, [current, current])
    stale = run_round(policy, [older, older])
    assert fresh["clipfrac"] == 0.0
    assert stale["clipfrac"] > 0.0
    assert fresh["policy_loss"] != pytest.approx(stale["policy_loss"])
    assert fresh["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stale["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stale["old_approx_kl"] == pytest.approx(0.0, abs=1e-6)
    # staleness: how far the round-start adapter is from the one that sampled the reply
    assert fresh["staleness"] == pytest.approx(0.0, abs=1e-5)
    gap = sum(abs(a - b) for a, b in zip(current, older)) / len(current)
    assert stale["staleness"] == pytest.approx(gap, rel=1e-3)


def test_a_fresh_rollouts_behaviour_is_the_round_start_policy(model_dir):
    """A rollout sampled by the adapter the round starts from carries no log-probs (None):
    its ratio is taken against the round-start pass, so a sampler whose numerics differ
    (batched bf16 on a GPU: 0.02-0.04 nats a token) does not read as staleness or clip."""
    policy = build_policy(model_dir)
    policy.model.eval()
    current = tk.reply_logprobs(policy.model, PROMPT, REPLY, T)
    noisy = [lp + (0.25 if i % 2 else -0.25) for i, lp in enumerate(current)]  # a sampler's
    as_sampled = run_round(policy, [noisy, noisy])
    fresh = run_round(policy, [None, None])
    exact = run_round(policy, [current, current])
    assert as_sampled["staleness"] == pytest.approx(0.25, rel=1e-3)
    assert as_sampled["clipfrac"] > 0.0
    assert fresh["staleness"] == 0.0 and fresh["clipfrac"] == 0.0
    for key in ("policy_loss", "approx_kl", "kl"):
        assert fresh[key] == pytest.approx(exact[key], abs=1e-6), key
    assert math.isfinite(fresh["policy_loss"])
    # and a real update moves the adapter as the exact stored log-probs would, not as the
    # sampler's would
    after = {}
    for name, stored in (("fresh", None), ("exact", current), ("noisy", noisy)):
        p = build_policy(model_dir)
        moved = run_round(p, [stored, stored], lr=1e-2)
        assert moved["steps"] == 2 and math.isfinite(moved["policy_loss"])
        p.model.eval()
        after[name] = tk.reply_logprobs(p.model, PROMPT, REPLY, T)
    assert after["fresh"] != pytest.approx(current, abs=1e-3)       # it moved
    assert after["fresh"] == pytest.approx(after["exact"], abs=1e-5)
    assert after["noisy"] != pytest.approx(after["exact"], abs=1e-3)


def test_update_changes_the_adapter_and_value_head(model_dir):
    policy = build_policy(model_dir)
    with update_mode(policy.model):
        behaviour = tk.reply_logprobs(policy.model, PROMPT, REPLY, T)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = run_round(policy, [behaviour] * 4, lr=1e-2)
    after = policy.parameters()
    assert metrics["steps"] == 4 and not metrics["nan"]
    assert any(not torch.equal(a, b) for a, b in zip(before[:-2], after[:-2]))  # LoRA
    assert not torch.equal(before[-2], after[-2])                               # value head
    assert metrics["kl"] > 0 and metrics["approx_kl"] > 0


def test_rloo_trains_the_adapter_towards_the_reward_and_leaves_the_value_head(model_dir):
    policy = build_policy(model_dir)
    good, bad, other = [tk.GOOD, 77, 12, 2], [tk.BAD, 70, 12, 2], [1, 5, 6, 1]
    policy.model.eval()
    eps = [(prompt, reply, tk.reply_logprobs(policy.model, prompt, reply, T), T, reward, 1.0)
           for prompt in (PROMPT, other) for reply, reward in ((good, 1.0), (bad, -1.0))]

    def preference() -> float:  # log p(good reply) - log p(bad reply), on both prompts
        return sum(sum(tk.reply_logprobs(policy.model, p, good, T))
                   - sum(tk.reply_logprobs(policy.model, p, bad, T)) for p in (PROMPT, other))

    before, pref_before = [p.detach().clone() for p in policy.parameters()], preference()
    b = build_rollout(eps, groups=[0, 0, 1, 1])
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)  # weight decay would move a zero grad
    metrics = train_policy(policy, opt, b, KLController(0.05, 0.05),
                           Hyper(batch_size=2, ppo_epochs=2, advantage="rloo"))
    after = policy.parameters()
    assert not metrics["nan"] and metrics["steps"] == 4
    assert any(not torch.equal(x, y) for x, y in zip(before[:-2], after[:-2]))  # LoRA moved
    assert all(torch.equal(x, y) for x, y in zip(before[-2:], after[-2:]))      # value head not
    assert all(p.grad is None for p in policy.value_head.parameters())
    # no value head in the round: its figures are nan (null), not a perfect-looking 0
    assert math.isnan(metrics["value_loss"]) and math.isnan(metrics["explained_variance"])
    policy.model.eval()
    assert preference() > pref_before + 0.1


def test_non_finite_gradient_stops_the_round(model_dir):
    policy = build_policy(model_dir)
    lora = next(p for n, p in policy.model.named_parameters() if "lora_B" in n)
    lora.register_hook(lambda grad: grad * float("nan"))  # finite loss, nan gradient
    b = build_rollout([(PROMPT, REPLY, [-1.0] * 4, T, 1.0, 1.0)] * 2)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = train_policy(policy, torch.optim.AdamW(policy.parameters(), lr=1e-2), b,
                           KLController(0.05, 0.05), Hyper(batch_size=1))
    assert metrics["nan"] and metrics["steps"] == 0 and metrics["epochs_run"] == 1
    assert metrics["nan_reason"] == "gradient norm is nan at epoch 1, step 1"
    assert math.isfinite(metrics["policy_loss"])  # the losses were fine, the gradient was not
    assert all(torch.equal(x, y) for x, y in zip(before, policy.parameters()))
    assert all(p.grad is None for p in policy.parameters())


def test_dropout_is_off_during_update_passes_even_with_checkpointing(model_dir):
    policy = build_policy(model_dir, dropout=0.5)
    b = build_rollout([(PROMPT, REPLY, [-1.0] * 4, T, 1.0, 1.0)])
    policy.model.train()
    with update_mode(policy.model):
        assert not policy.model.training
        assert torch.equal(policy.forward(b).logp, policy.forward(b).logp)
    assert policy.model.training  # restored

    plain = policy.forward
    with update_mode(policy.model):
        loss = plain(b).logp.sum()
    loss.backward()
    grads = [p.grad.clone() for p in policy.parameters()[:-2]]
    policy.model.zero_grad()
    from reinf.training.session import enable_checkpointing
    enable_checkpointing(policy.model.get_base_model())
    with update_mode(policy.model, gradient_checkpointing=True):
        assert policy.model.training  # transformers only checkpoints in train mode
        first, second = policy.forward(b).logp, policy.forward(b).logp
        assert torch.equal(first.detach(), second.detach())
        first.sum().backward()  # recomputes the forward: must happen inside the pass too
    for g, p in zip(grads, policy.parameters()[:-2]):
        assert torch.allclose(g, p.grad, atol=1e-6)
    dropouts = [m.p for m in policy.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(p == 0.5 for p in dropouts)  # restored after the pass


def test_nan_in_rewards_stops_the_round(model_dir):
    policy = build_policy(model_dir)
    b = build_rollout([(PROMPT, REPLY, [-1.0] * 4, T, float("nan"), 1.0)] * 2)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = train_policy(policy, torch.optim.AdamW(policy.parameters(), lr=1e-2), b,
                           KLController(0.05, 0.05), Hyper(batch_size=1))
    assert metrics["nan"] and metrics["steps"] == 0
    assert metrics["nan_reason"].startswith("minibatch loss is nan (policy nan")
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_padding_the_model_finds_improbable_does_not_stop_the_round(model_dir):
    """Replies of different lengths pad the shorter one with token 0, and the forward scores
    that pad token too. A model that gives it a log-prob far below -88 (an adapter can push
    a token that far) must not turn the KL loss term into exp(inf) x 0 = NaN there (the
    likely cause of the NaN rounds of smollm2-135m on a GPU, docs/benchmarks.md)."""
    policy = build_policy(model_dir)
    base = policy.model.get_base_model()

    def pad_improbable(_module, _inputs, logits):
        logits = logits.clone()
        logits[..., 0] = -1e4  # log-prob about -14,000 at temperature 0.7
        return logits

    base.lm_head.register_forward_hook(pad_improbable)
    episodes = [(PROMPT, [tk.GOOD, 77, 12, 2], None, T, 1.0, 1.0),
                (PROMPT, [tk.BAD, 70], None, T, -1.0, 1.0)]  # 2 tokens, padded to 4
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = train_policy(policy, torch.optim.AdamW(policy.parameters(), lr=1e-2),
                           build_rollout(episodes, groups=[0, 0]),
                           KLController(0.02, 0.05),
                           Hyper(batch_size=2, ppo_epochs=2, kl_loss_coef=0.01))
    assert not metrics["nan"], metrics.get("nan_reason")
    assert metrics["steps"] == 2 and math.isfinite(metrics["kl"])
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_engine_replies_reproduce_their_logprobs_in_the_trainer(home, model_dir):
    """The contract between engine and trainer: a reply's stored behaviour log-probs are
    what the trainer's forward gives under the adapter that sampled it (ratio 1), and
    replies from an older adapter are seen as off-policy."""
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from reinf.training.session import build_session, select_episodes
    from reinf.training.trainer import train_round

    config = tk.train_config(home, model_dir, temperature=0.7, max_new_tokens=8, top_p=0.9)
    store = Store.open(config)
    engine = Engine.load(config)
    chat = ChatService(engine, store, config)
    for i in range(4):
        store.rate(chat.send(f"hello number {i}").id, 5 if i % 2 else 1)
    first = train_round(config, store)
    engine.request_swap(first.checkpoint_id, store.get_checkpoint(first.checkpoint_id).path)
    for i in range(4):
        store.rate(chat.send(f"tell me about the sea {i}").id, 4)
    samples = store.training_samples(64)
    assert {s.checkpoint_id for s in samples} == {None, first.checkpoint_id}
    session = build_session(config, store)  # resumes the active checkpoint
    rows = [type("Row", (), {"reward": 1.0, "weight": 1.0})() for _ in samples]
    episodes, skipped = select_episodes(session, list(zip(samples, rows)))
    assert not skipped and all(e[3] == 0.7 for e in episodes)
    b = build_rollout(episodes)
    with update_mode(session.policy.model):
        logp = session.policy.forward(b).logp
    gap = ((logp - b.logp_behaviour) * b.mask).abs().amax(dim=1)  # (B,)
    for sample, g in zip(samples, gap.tolist()):
        if sample.checkpoint_id == first.checkpoint_id:
            assert g < 1e-4, g         # same adapter: ratio exactly 1 (up to fp32 noise)
    assert max(g for s, g in zip(samples, gap.tolist()) if s.checkpoint_id is None) > 1e-3


def sgd_round(model_dir, episodes, **hyper):
    """One epoch with plain SGD, so parameter changes are proportional to the gradients."""
    policy = build_policy(model_dir)
    b = build_rollout(episodes)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    metrics = train_policy(policy, opt, b, KLController(0.05, 0.05),
                           Hyper(ppo_epochs=1, **{"max_grad_norm": 0.0, **hyper}))
    return metrics, torch.cat([p.detach().flatten() for p in policy.parameters()])


def test_gradient_accumulation_matches_one_bigger_minibatch(model_dir):
    eps = [(PROMPT, [tk.GOOD, 77, 12, 2], [-6.0, -6.0, -6.0, -6.0], T, 1.0, 1.0),
           (PROMPT, [tk.BAD, 70, 12, 2], [-6.0, -6.0, -6.0, -6.0], T, -1.0, 1.0)]
    acc, p_acc = sgd_round(model_dir, eps, batch_size=1, gradient_accumulation_steps=2)
    big, p_big = sgd_round(model_dir, eps, batch_size=2, gradient_accumulation_steps=1)
    one, p_one = sgd_round(model_dir, eps, batch_size=1, gradient_accumulation_steps=1)
    assert acc["steps"] == 1 and big["steps"] == 1 and one["steps"] == 2
    assert torch.allclose(p_acc, p_big, atol=1e-6)
    assert not torch.allclose(p_acc, p_one, atol=1e-4)  # two steps are not one


def test_the_round_reports_how_often_the_gradient_was_clipped(model_dir):
    eps = [(PROMPT, [tk.GOOD, 77, 12, 2], [-6.0] * 4, T, 1.0, 1.0),
           (PROMPT, [tk.BAD, 70, 12, 2], [-6.0] * 4, T, -1.0, 1.0)]
    free, _ = sgd_round(model_dir, eps, batch_size=1)  # max_grad_norm 0: never
    assert free["clipped"] == 0.0 and free["grad_norm"] > 1e-3
    tight, _ = sgd_round(model_dir, eps, batch_size=1, max_grad_norm=free["grad_norm"] / 100)
    assert tight["clipped"] == 1.0


def test_sample_weights_scale_the_losses(model_dir):
    a = (PROMPT, [tk.GOOD, 77, 12, 2], [-6.0] * 4, T, 1.0, 1.0)
    b = ([1, 5, 6, 1], [tk.BAD, 70, 12, 2], [-6.0] * 4, T, -1.0, 0.0)  # weight 0
    _, alone = sgd_round(model_dir, [a], batch_size=2)
    _, with_zero = sgd_round(model_dir, [a, b], batch_size=2)
    _, with_one = sgd_round(model_dir, [a, b[:5] + (1.0,)], batch_size=2)
    assert torch.allclose(alone, with_zero, atol=1e-6)
    assert not torch.allclose(alone, with_one, atol=1e-4)


def test_early_stop_when_approx_kl_exceeds_target(model_dir):
    eps = [(PROMPT, [tk.GOOD, 77, 12, 2], [-6.0] * 4, T, 1.0, 1.0)] * 2
    policy = build_policy(model_dir)
    b = build_rollout(eps)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    stopped = train_policy(policy, opt, b, KLController(0.05, 0.05),
                           Hyper(batch_size=1, ppo_epochs=4, target_kl=1e-9))
    assert stopped["early_stopped"] and stopped["epochs_run"] == 1
    assert stopped["early_stop_epoch"] == 1 and stopped["steps"] == 2
    policy = build_policy(model_dir)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    full = train_policy(policy, opt, b, KLController(0.05, 0.05),
                        Hyper(batch_size=1, ppo_epochs=4, target_kl=0.0))
    assert not full["early_stopped"] and full["epochs_run"] == 4 and full["steps"] == 8


def stop_rounds(model_dir, n: int, demos=None, **hyper) -> dict[str, dict]:
    """One round of ``n`` replies (one a minibatch, 3 epochs, target_kl 1e-9) under each
    early-stop rule, each from a fresh policy: the rule -> train_policy's metrics."""
    eps = [(PROMPT, [tk.GOOD, 77, 12, 2], [-6.0] * 4, T, 1.0, 1.0)] * n
    rounds = {}
    for rule in ("epoch", "step"):
        policy = build_policy(model_dir)
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        rounds[rule] = train_policy(policy, opt, build_rollout(eps, demos=demos),
                                    KLController(0.05, 0.05),
                                    Hyper(batch_size=1, ppo_epochs=3, target_kl=1e-9,
                                          early_stop=rule, **hyper))
    return rounds


def test_the_step_rule_stops_within_the_first_epoch(model_dir):
    # Eight replies, one a minibatch: the first is scored on-policy (approx_kl 0), so the
    # step rule stops after the second step, where the epoch rule finishes the epoch.
    stops = stop_rounds(model_dir, 8)
    assert stops["epoch"]["early_stopped"] and stops["epoch"]["steps"] == 8
    assert stops["step"]["early_stopped"] and stops["step"]["steps"] == 2
    assert stops["step"]["epochs_run"] == 1 and stops["step"]["early_stop_step"] == 2
    assert stops["step"]["approx_kl"] < stops["epoch"]["approx_kl"]


def test_the_step_rule_leaves_demonstrations_out(model_dir):
    # Every reply is a demonstration the imitation term moves: the epoch rule, which counts
    # their tokens, stops after one epoch; the step rule sees no policy-gradient token moved.
    runs = stop_rounds(model_dir, 4, demos=[True] * 4, imitation_coef=1.0)
    assert runs["epoch"]["early_stopped"] and runs["epoch"]["steps"] == 4
    assert runs["epoch"]["approx_kl"] > 1e-9
    assert not runs["step"]["early_stopped"] and runs["step"]["steps"] == 12


def test_an_unknown_early_stop_rule_is_refused():
    with pytest.raises(ValueError, match="early_stop 'batch' is not one of epoch, step"):
        Hyper(early_stop="batch")


def test_unusable_samples_are_skipped_and_counted(model_dir):
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from reinf.model.modeling import get_context_limit
    from reinf.records import Sample
    from reinf.training.session import select_episodes

    policy = build_policy(model_dir)
    base = policy.model.get_base_model()
    session = SimpleNamespace(loaded=SimpleNamespace(model=base, tokenizer=None), policy=policy,
                              context_limit=get_context_limit(base, None))
    now = datetime.now(timezone.utc)

    def sample(prompt, reply, logprobs, temperature=1.0):
        return Sample(1, 1, 1, "local", "p", "r", prompt, reply, logprobs, None, 5, [], "",
                      False, now, now, temperature)

    row = SimpleNamespace(reward=1.0, weight=0.5)
    kept = [sample(PROMPT, REPLY, [-1.0] * 4, 0.7),             # fine
            sample(PROMPT, REPLY, [-1.0] * 3),                  # log-probs do not match
            sample([5] * 300, REPLY, [-1.0] * 4),               # longer than the context
            sample([], REPLY, [-1.0] * 4),                      # nothing to condition on
            sample(PROMPT, [99999], [-1.0]),                    # not in the vocabulary
            sample(PROMPT, REPLY, [-1.0] * 4, 0.0)]             # no valid temperature
    episodes, skipped = select_episodes(session, [(s, row) for s in kept])
    assert episodes == [(PROMPT, REPLY, [-1.0] * 4, 0.7, 1.0, 0.5)]
    assert skipped == {"logprobs_mismatch": 1, "too_long": 1, "no_prompt": 1, "bad_tokens": 1,
                       "bad_temperature": 1}


def test_entropy_bonus_raises_entropy(model_dir):
    eps = [(PROMPT, [tk.GOOD, 77, 12, 2], [-6.0] * 4, T, 0.0, 1.0)] * 2  # no reward signal
    ent = {}
    for coef in (0.0, 1.0):
        policy = build_policy(model_dir)
        b = build_rollout(eps)
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        train_policy(policy, opt, b, KLController(0.0, 0.05),
                     Hyper(batch_size=2, ppo_epochs=3, ent_coef=coef, vf_coef=0.0))
        with update_mode(policy.model):
            ent[coef] = float(policy.forward(b).entropy.mean())
    assert ent[1.0] > ent[0.0] + 1e-4, ent


def base_passages(model_dir, policy) -> tuple:
    """Passages the base writes itself (the adapter off), as the anchor samples them,
    split in two rollouts: every other one, and the rest."""
    from transformers import AutoTokenizer

    from reinf.training.anchor import as_episodes, document_start
    from reinf.training.rollouts import sample_rollouts

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    start = document_start(tokenizer)
    with policy.model.disable_adapter():
        texts = sample_rollouts(policy.model, tokenizer, [[start]], 48, temperature=1.0,
                                top_p=1.0, max_new_tokens=24, seed=3)
    passages = as_episodes(start, [{"ids": r.reply_ids, "logprobs": r.logprobs}
                                   for r in texts if len(r.reply_ids) >= 2])
    return build_rollout(passages[::2]), build_rollout(passages[1::2])


def test_the_anchor_pulls_the_policy_back_to_the_base_on_text_it_never_read(model_dir):
    """A drifted adapter (random LoRA weights), a round with nothing to learn from its
    replies (equal rewards: every advantage 0): without the anchor nothing moves; with it,
    KL(base || policy) falls on held-out passages of the base's own text, not only on the
    half it read. With a reward too, the reward still moves the policy."""
    from reinf.training.ppo import anchor_loss

    anchor, held = base_passages(model_dir, build_policy(model_dir))
    good, bad, other = [tk.GOOD, 77, 12, 2], [tk.BAD, 70, 12, 2], [1, 5, 6, 1]

    def drift(policy, passages) -> float:  # KL(base || policy) per token
        with update_mode(policy.model), torch.no_grad():
            return float(anchor_loss(policy, passages))

    def preference(policy) -> float:  # log p(good) - log p(bad), both prompts
        return sum(sum(tk.reply_logprobs(policy.model, p, good, T))
                   - sum(tk.reply_logprobs(policy.model, p, bad, T)) for p in (PROMPT, other))

    def run(coef: float, reward: float):
        policy = build_policy(model_dir)  # the same drifted adapter each time
        policy.model.eval()
        before = drift(policy, held), preference(policy)
        eps = [(p, reply, tk.reply_logprobs(policy.model, p, reply, T), T, sign * reward, 1.0)
               for p in (PROMPT, other) for reply, sign in ((good, 1), (bad, -1))]
        opt = torch.optim.AdamW(policy.parameters(), lr=3e-2, weight_decay=0.0)
        metrics = train_policy(policy, opt, build_rollout(eps, groups=[0, 0, 1, 1]),
                               KLController(0.0, 0.0),
                               Hyper(batch_size=2, ppo_epochs=12, advantage="rloo",
                                     anchor_coef=coef), anchor=anchor)
        policy.model.eval()
        assert not metrics["nan"] and metrics["steps"] == 24
        return before, (drift(policy, held), preference(policy)), drift(policy, anchor), metrics

    (held0, _), (held_off, _), _, off = run(0.0, reward=0.0)
    assert held0 > 0.005  # the adapter has drifted from the base
    assert off["anchor_kl"] is None and held_off == pytest.approx(held0, rel=0.01)
    (held0, _), (held_on, _), read_on, on = run(1.0, reward=0.0)
    assert held_on < 0.85 * held0 and read_on < 0.85 * held0, (held0, held_on, read_on)
    assert on["anchor_kl"] > 0  # measured before each step, on the passages it read
    (_, pref0), (_, pref1), _, rewarded = run(1.0, reward=1.0)
    assert pref1 > pref0 + 0.5 and rewarded["anchor_kl"] > 0
    assert -1.0 <= rewarded["anchor_cosine"] <= 1.0 and rewarded["anchor_grad_norm"] > 0


def test_the_drift_budget_scales_the_adapter_to_within_it_and_only_that(model_dir):
    """A drifted adapter (random LoRA weights) over a budget: hold_to_budget scales every
    up-projection by one factor, nothing else, and leaves the base's own text, on the
    passages it measured and on ones it never read, within the budget; under a budget it
    has room in, nothing changes. The drift counts each passage from its token DRIFT_FROM on."""
    from reinf.model.sampling import kl_per_token
    from reinf.training.budget import DRIFT_FROM, drift_kl, hold_to_budget
    from reinf.training.ppo import update_mode

    policy = build_policy(model_dir)
    read, held = base_passages(model_dir, policy)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    kl0, held0 = drift_kl(policy, read, 8), drift_kl(policy, held, 8)
    assert kl0 > 0.01, kl0  # the adapter has drifted from the base
    # the figure is the KL from each passage's token DRIFT_FROM on: the opening isn't counted
    with torch.no_grad(), update_mode(policy.model):
        kl = kl_per_token(policy.forward(read, adapter=False, values=False, full=True).scored,
                          policy.forward(read, values=False, full=True).scored) * read.mask
    counted = read.mask[:, DRIFT_FROM:]
    assert kl0 == pytest.approx(float(kl[:, DRIFT_FROM:].sum() / counted.sum()), rel=1e-4)
    assert kl0 != pytest.approx(float(kl.sum() / read.mask.sum()), rel=1e-3)

    roomy = hold_to_budget(policy, read, 2 * math.expm1(kl0), 8)
    assert roomy["drift_scale"] == 1.0 and roomy["drift"] == pytest.approx(math.expm1(kl0))
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters())

    budget = math.expm1(kl0) / 4
    m = hold_to_budget(policy, read, budget, 8)
    scale = m["drift_scale"]
    assert 0.0 < scale < 1.0 and m["drift"] == pytest.approx(math.expm1(kl0))
    kl1 = drift_kl(policy, read, 8)
    assert kl1 <= math.log1p(budget) and m["drift_after"] == pytest.approx(math.expm1(kl1))
    assert kl1 >= 0.5 * math.log1p(budget)  # near the budget, not far below it
    for name, p in policy.model.named_parameters():
        expected = before[name] * scale if ".lora_B." in name else before[name]
        assert torch.allclose(p, expected, atol=1e-6), name
    assert drift_kl(policy, held, 8) < 0.5 * held0  # the passages it never read drift less

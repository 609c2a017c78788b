"""PPO maths on hand-made tensors. Every expected number is worked out by hand in the
comments, not by calling the code under test."""
import math

import pytest
import torch

from reinf.training.ppo import (Hyper, KLController, RunningMoments, Step, ValueHead, approx_kl,
                                build_rollout, build_token_rewards, compute_gae, compute_rloo,
                                cosine, explained_variance, minibatch_loss, norm,
                                policy_loss, value_loss, weighted_mean, whiten)


def close(actual, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(actual, dtype=torch.float32),
                          torch.tensor(expected, dtype=torch.float32), atol=tol), actual


def test_gae_gamma_one_lambda_095_with_a_padded_episode():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.1, -1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.2], [0.3, -0.2, 9.0]])  # 9.0: padding, must be ignored
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # Episode 1, backwards: d2 = 1 + 0 - 0.2 = 0.8            -> A2 = 0.8
    #                       d1 = 0 + 0.2 - 0.4 = -0.2         -> A1 = -0.2 + 0.95*0.8 = 0.56
    #                       d0 = 0 + 0.4 - 0.5 = -0.1         -> A0 = -0.1 + 0.95*0.56 = 0.432
    # Episode 2 ends at t=1: d1 = -1 + 0 + 0.2 = -0.8          -> A1 = -0.8
    #                        d0 = 0.1 - 0.2 - 0.3 = -0.4       -> A0 = -0.4 + 0.95*-0.8 = -1.16
    close(adv, [[0.432, 0.56, 0.8], [-1.16, -0.8, 0.0]])
    # returns = A + V on real tokens
    close(ret, [[0.932, 0.96, 1.0], [-0.86, -1.0, 0.0]])


def test_gae_discount_and_lambda_other_than_one():
    rewards = torch.tensor([[1.0, 2.0]])
    values = torch.tensor([[0.5, 1.0]])
    mask = torch.ones(1, 2)
    adv, _ = compute_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    # d1 = 2 - 1 = 1 -> A1 = 1;  d0 = 1 + 0.5*1 - 0.5 = 1 -> A0 = 1 + 0.25*1 = 1.25
    close(adv, [[1.25, 1.0]])


def test_token_rewards_kl_penalty_plus_reward_at_last_token():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0], [-2.0, -1.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    out = build_token_rewards(torch.tensor([2.0, -1.0]), logp, ref, mask, kl_coef=0.1)
    # row 1: -0.1*[0.5, 0, -1] = [-0.05, 0, 0.1], +2 at t=2
    # row 2: -0.1*[1, 0, (pad)] = [-0.1, 0, 0], -1 at its last real token t=1
    close(out, [[-0.05, 0.0, 2.1], [-0.1, -1.0, 0.0]])


def test_whiten_uses_sample_weights_and_leaves_padding_zero():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    weights = torch.tensor([1.0, 2.0])
    # tokens 1 (w1), 2 (w1), 3 (w2): mean = (1 + 2 + 6) / 4 = 2.25
    # var = (1.5625 + 0.0625 + 2*0.5625) / 4 = 0.6875, std = 0.8291562
    out = whiten(x, mask, weights)
    close(out, [[-1.5075567, -0.3015113], [0.9045340, 0.0]])
    close(weighted_mean(x, mask, weights), 2.25)


def test_zero_weight_sample_does_not_count():
    x = torch.tensor([[1.0], [50.0]])
    mask = torch.ones(2, 1)
    close(weighted_mean(x, mask, torch.tensor([1.0, 0.0])), 1.0)


@pytest.mark.parametrize("ratio, adv, dual, expected", [
    (1.5, 1.0, 0.0, -1.2),   # max(-1.5, -1.2): gains beyond 1+eps are not rewarded
    (0.5, 1.0, 0.0, -0.5),   # max(-0.5, -0.8): the pessimistic, unclipped term
    (1.5, -1.0, 0.0, 1.5),   # max(1.5, 1.2)
    (0.5, -1.0, 0.0, 0.8),   # max(0.5, 0.8): below 1-eps with A<0 is clipped
    (5.0, -1.0, 0.0, 5.0),   # plain PPO: unbounded for a stale sample with a huge ratio
    (5.0, -1.0, 3.0, 3.0),   # dual clip: min(5, 3*1)
    (1.5, -1.0, 3.0, 1.5),   # dual clip leaves ordinary cases alone
    (5.0, 1.0, 3.0, -1.2),   # and positive advantages
])
def test_clipped_surrogate(ratio, adv, dual, expected):
    loss = policy_loss(torch.tensor([[math.log(ratio)]]), torch.tensor([[adv]]), clip=0.2,
                       dual_clip=dual)
    close(loss, [[expected]])


@pytest.mark.parametrize("dual", [0.5, 1.0])
def test_dual_clip_that_would_do_nothing_is_refused(dual):
    # c in (0, 1] is no dual clip: refused by the loss and by the round's numbers alike
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(torch.tensor([[0.0]]), torch.tensor([[-1.0]]), clip=0.2, dual_clip=dual)
    with pytest.raises(ValueError, match="dual_clip"):
        Hyper(dual_clip=dual)
    Hyper(dual_clip=0.0), Hyper(dual_clip=1.5)  # off, and on


def test_rloo_baseline_is_the_mean_of_the_other_replies_to_the_prompt():
    rewards = torch.tensor([1.0, 2.0, 6.0, -1.0, 3.0])
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0], [-0.6, -5.0], [-1.2, -0.8], [-1.0, -1.0]])
    ref = torch.tensor([[-1.2, -2.0], [-1.0, -1.0], [-1.0, -14.0], [-1.0, -1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv, ret = compute_rloo(rewards, logp, ref, mask, kl_coef=0.5, groups=groups)
    # returns = reward - 0.5 * sum of real (logp - ref):
    #   0: 1 - 0.5*0.2 = 0.9;  1: 2 - 0 = 2;  2: 6 - 0.5*0.4 = 5.8 (the 9 at t=1 is padding)
    #   3: -1 - 0.5*(-0.2 + 0.2) = -1;  4: 3 - 0.5*2 = 2
    close(ret, [0.9, 2.0, 5.8, -1.0, 2.0])
    # group 0: 0.9 - (2 + 5.8)/2 = -3;  2 - (0.9 + 5.8)/2 = -1.35;  5.8 - (0.9 + 2)/2 = 4.35
    # group 1: -1 - 2 = -3;  2 - (-1) = 3.  Every real token carries it, padding is 0.
    close(adv, [[-3.0, -3.0], [-1.35, -1.35], [4.35, 0.0], [-3.0, -3.0], [3.0, 3.0]])


def test_rloo_episode_alone_in_its_group_gets_the_mean_of_the_others():
    rewards, ones = torch.tensor([1.0, 3.0, 10.0]), torch.ones(3, 1)
    adv, _ = compute_rloo(rewards, ones, ones, ones, kl_coef=0.5, groups=torch.tensor([4, 4, 9]))
    # 1 - 3 = -2;  3 - 1 = 2;  alone: 10 - (1 + 3)/2 = 8 (not 10 - 14/3: itself left out)
    close(adv, [[-2.0], [2.0], [8.0]])
    adv, _ = compute_rloo(rewards, ones, ones, ones, kl_coef=0.5)  # no groups: all alone
    close(adv, [[1 - 6.5], [3 - 5.5], [10 - 2.0]])
    adv, _ = compute_rloo(rewards[:1], ones[:1], ones[:1], ones[:1], kl_coef=0.5)
    close(adv, [[1.0]])  # a batch of one has no one to compare with


def test_a_rated_round_groups_its_replies_by_prompt():
    """The cold start under RLOO: two rated replies to one prompt (regenerated, both rated)
    are each other's baseline; a reply alone with its prompt gets every other one's mean."""
    from reinf.training.trainer import prompt_groups

    episodes = [([1, 2], [5]), ([3], [6]), ([1, 2], [7]), ([1], [8])]
    assert prompt_groups(episodes) == [0, 1, 0, 2]


def test_hyper_from_config_keeps_defaults_for_fields_the_config_lacks():
    from types import SimpleNamespace

    from reinf.config import PPOConfig

    config = PPOConfig()
    hp = Hyper.from_config(config)
    shared = [n for n in Hyper.__dataclass_fields__ if hasattr(config, n)]
    assert len(shared) >= 13 and all(getattr(hp, n) == getattr(config, n) for n in shared)
    partial = SimpleNamespace(batch_size=3, ppo_epochs=2)  # no advantage, no ppo_clip, ...
    assert Hyper.from_config(partial) == Hyper(batch_size=3, ppo_epochs=2)
    assert Hyper.from_config(partial).advantage == "gae"
    with pytest.raises(ValueError, match="gae, rloo"):
        Hyper(advantage="grpo")


@pytest.mark.parametrize("new, old, ret, expected", [
    (1.0, 0.0, 2.0, 1.62),    # clipped to 0.2: 0.5*max((1-2)^2, (0.2-2)^2) = 0.5*3.24
    (0.1, 0.0, 1.0, 0.405),   # inside the clip: 0.5*(0.1-1)^2
    (1.0, 0.0, 0.5, 0.125),   # max takes the unclipped 0.25 over the clipped 0.09
    (-1.0, 0.0, 0.0, 0.5),    # clipped to -0.2: max(1, 0.04) = 1
])
def test_clipped_value_loss(new, old, ret, expected):
    loss = value_loss(torch.tensor([[new]]), torch.tensor([[old]]), torch.tensor([[ret]]),
                      clip=0.2)
    close(loss, [[expected]])


def test_approx_kl():
    # r = 2: (2 - 1) - ln 2 = 0.3068528; r = 1: 0; r = 1/2: (0.5 - 1) + ln 2 = 0.1931472
    close(approx_kl(torch.tensor([math.log(2), 0.0, -math.log(2)])),
          [0.3068528, 0.0, 0.1931472])


def test_kl_controller_moves_towards_target_within_its_clip():
    ctl = KLController(coef=0.1, target=0.05)
    # kl/target - 1 = 1, clipped to 0.2: 0.1 * (1 + 0.2) = 0.12, in one round
    assert ctl.update(0.1) == pytest.approx(0.12)
    # 0.055/0.05 - 1 = 0.1, inside the clip: x 1.1
    assert ctl.update(0.055) == pytest.approx(0.132)
    # 0.045/0.05 - 1 = -0.1 over a horizon of two rounds: x 0.95
    ctl = KLController(coef=0.2, target=0.05, horizon=2, floor=0.1)
    assert ctl.update(0.045) == pytest.approx(0.19)
    assert ctl.update(0.05) == pytest.approx(0.19)  # on target: stays


@pytest.mark.parametrize("ratio, factor", [(2.0, 1.2 ** 3), (0.5, 0.8 ** 3)])
def test_kl_controller_acts_within_three_rounds(ratio, factor):
    """KL at twice the target for three rounds raises kl_coef x1.73; KL at half of it
    brings a raised one down x0.51: the controller acts on the KL each round measures, not
    over a thousand samples (issue 22), with the config's defaults."""
    from reinf.config import load_config

    ppo = load_config(environ={}).ppo
    ctl = KLController(ppo.kl_coef, ppo.kl_target, ppo.kl_horizon, ppo.adaptive_kl)
    ctl.coef = start = ppo.kl_coef * (1 if ratio > 1 else 4)  # e.g. after a KL rejection
    coefs = [ctl.update(ratio * ppo.kl_target) for _ in range(3)]
    assert coefs[-1] == pytest.approx(start * factor)
    assert abs(coefs[0] / start - 1) == pytest.approx(0.2)  # visible after one round
    assert coefs == sorted(coefs, reverse=ratio < 1)


def test_kl_controller_never_goes_below_the_configured_coef():
    """KL far below the target (the first rounds: the adapter starts at zero) leaves
    kl_coef where the config put it; a raised one comes back down to it and stops."""
    ctl = KLController(coef=0.1, target=0.05)
    assert [ctl.update(0.001) for _ in range(3)] == [0.1, 0.1, 0.1]
    ctl.coef = 0.15
    assert [round(ctl.update(0.0), 6) for _ in range(3)] == [0.12, 0.1, 0.1]
    restored = KLController(coef=0.1, target=0.05)
    restored.load_state_dict({"coef": 0.05})  # saved before kl_coef was raised to 0.1
    assert restored.coef == 0.1
    restored.load_state_dict({"coef": 0.3})
    assert restored.coef == 0.3


def test_kl_controller_fixed_or_nan_leaves_coef_and_round_trips():
    fixed = KLController(coef=0.1, target=0.05, adaptive=False)
    assert fixed.update(5.0) == 0.1
    ctl = KLController(coef=0.1, target=0.05)
    assert ctl.update(float("nan")) == 0.1
    ctl.update(1.0)
    other = KLController(coef=0.1, target=0.05)
    other.load_state_dict(ctl.state_dict())
    assert other.coef == ctl.coef == pytest.approx(0.12)


def test_running_moments_merge_batches():
    stats = RunningMoments()
    stats.update(torch.tensor([1.0, 2.0, 3.0]))
    stats.update(torch.tensor([4.0]))
    # all four: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    assert stats.count == 4
    assert stats.mean == pytest.approx(2.5)
    assert stats.std == pytest.approx(math.sqrt(1.25))
    copy = RunningMoments()
    copy.load_state_dict(stats.state_dict())
    assert (copy.count, copy.mean, copy.m2) == (stats.count, stats.mean, stats.m2)


def test_explained_variance():
    y = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(y, y, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(y, 2.0), y, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(y, torch.ones_like(y), mask))


def test_rollout_positions_point_at_the_logits_that_predict_each_reply_token():
    b = build_rollout([([5, 6, 7], [8, 9], [-0.1, -0.2], 0.7, 1.0, 0.5),
                       ([3], [4, 5, 6], [-1.0, -2.0, -3.0], 1.0, -1.0, 1.0)])
    # left-padded: every row ends at the last column (its logits are the ones kept)
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [0, 3, 4, 5, 6]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    # logits at column j predict token j+1: reply token 8 (column 3) comes from column 2
    assert b.positions.tolist() == [[2, 3, 0], [1, 2, 3]]
    assert b.actions.tolist() == [[8, 9, 0], [4, 5, 6]]
    assert b.mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    close(b.logp_behaviour, [[-0.1, -0.2, 0.0], [-1.0, -2.0, -3.0]])
    close(b.temperature, [0.7, 1.0])
    sub = b.select(torch.tensor([0]))
    assert sub.input_ids.shape == (1, 5) and sub.mask.shape == (1, 2)
    # a row alone drops the padding on its left, and its positions move with it
    sub = b.select(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[3, 4, 5, 6]] and sub.positions.tolist() == [[0, 1, 2]]
    assert b.groups is None and sub.groups is None


def test_rollout_groups_travel_with_their_rows():
    eps = [([1, 2], [3], [-1.0], 1.0, 1.0, 1.0)] * 3
    b = build_rollout(eps, groups=[7, 7, 2])
    assert b.groups.dtype == torch.long and b.groups.tolist() == [7, 7, 2]
    assert b.select(torch.tensor([2, 0])).groups.tolist() == [2, 7]
    with pytest.raises(ValueError, match="one group id per episode"):
        build_rollout(eps, groups=[1, 2])


def test_value_head_starts_at_zero():
    head = ValueHead(8)
    out = head(torch.randn(2, 3, 8))
    assert out.shape == (2, 3)
    assert torch.count_nonzero(out) == 0


class OneTokenPolicy:
    """A 'policy' whose log-prob of each sampled token is a free parameter."""
    def __init__(self, logp):
        self.logp = torch.nn.Parameter(torch.tensor(logp))

    def forward(self, mb, **_):
        return Step(self.logp, torch.zeros_like(self.logp), None)


@pytest.mark.parametrize("kl_loss_coef", [0.0, 0.5])
def test_kl_loss_pulls_sampled_tokens_back_towards_the_base(kl_loss_coef):
    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0)])
    policy = OneTokenPolicy([[-0.2, -3.0]])  # token 1 above the base's -1, token 2 below
    zero = torch.zeros(1, 2)
    hp = Hyper(advantage="rloo", kl_loss_coef=kl_loss_coef)
    loss, stats = minibatch_loss(policy, b, zero, b.logp_behaviour, b.logp_behaviour, zero,
                                 zero, hp)
    loss.backward()
    grad = policy.logp.grad[0]
    # k3 of KL(new || base): (e^(ref-new) - 1) - (ref-new) per token, averaged
    expected = sum((math.exp(-1 - x) - 1) - (-1 - x) for x in (-0.2, -3.0)) / 2
    assert float(stats["kl"]) == pytest.approx(expected, rel=1e-5)
    if kl_loss_coef == 0:
        assert torch.count_nonzero(grad) == 0  # zero advantages and no KL term: nothing moves
    else:  # a descent step lowers the boosted token and raises the suppressed one
        assert grad[0] > 0 > grad[1]


def test_kl_loss_reads_real_tokens_only_and_bounds_the_gap():
    """At padding the forward scores the pad id, and a model may find it very improbable:
    exp(gap) there is inf, and the mask's 0 would make it NaN. A real token far below the
    base is bounded like the policy ratio (a gap of 20 nats at most)."""
    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0),
                       ([1], [4], [-1.0], 1.0, 0.0, 1.0)])  # padded to 2 tokens
    policy = OneTokenPolicy([[-0.2, -3.0], [-1.5, -200.0]])  # -200: the pad position
    zero = torch.zeros(2, 2)
    loss, stats = minibatch_loss(policy, b, zero, b.logp_behaviour, b.logp_behaviour, zero,
                                 zero, Hyper(advantage="rloo", kl_loss_coef=0.5))
    assert torch.isfinite(loss)
    k3 = [(math.exp(-1 - x) - 1) - (-1 - x) for x in (-0.2, -3.0, -1.5)]
    assert float(stats["kl"]) == pytest.approx(sum(k3) / 3, rel=1e-5)

    far = OneTokenPolicy([[-0.2, -300.0], [-1.5, 0.0]])  # a real token 299 nats below
    loss, stats = minibatch_loss(far, b, zero, b.logp_behaviour, b.logp_behaviour, zero,
                                 zero, Hyper(advantage="rloo", kl_loss_coef=0.5))
    k3 = [(math.exp(-1 - x) - 1) - (-1 - x) for x in (-0.2, -1.5)] + [math.exp(20) - 21]
    assert torch.isfinite(loss)
    assert float(stats["kl"]) == pytest.approx(sum(k3) / 3, rel=1e-5)


def test_the_gate_names_what_was_not_finite():
    from reinf.training.promotion import gate

    ok = {"reward_mean": 0.1, "kl": 0.01, "policy_loss": -0.02, "advantage": "rloo"}
    why = "minibatch loss is nan (policy nan, value 0.0, entropy 1.2, KL 0.1) at epoch 1, step 3"
    assert gate({**ok, "nan": True, "nan_reason": why}, kl_max=1.0) == f"NaN in the round ({why})"
    assert gate({**ok, "nan": True}, kl_max=1.0) == \
        "NaN in the round (loss, reward or weights)"


def test_the_gate_reads_the_value_loss_only_where_the_value_head_trained():
    """RLOO rounds report value_loss as nan (no value head); that is no NaN in the round.
    A GAE round's nan value loss still is."""
    from reinf.training.promotion import gate

    ok = {"reward_mean": 0.1, "kl": 0.01, "policy_loss": -0.02, "nan": False}
    assert gate({**ok, "value_loss": math.nan, "advantage": "rloo"}, kl_max=1.0) is None
    assert gate({**ok, "value_loss": 0.3, "advantage": "gae"}, kl_max=1.0) is None
    assert gate({**ok, "value_loss": math.nan, "advantage": "gae"}, kl_max=1.0).startswith("NaN")
    assert gate({**ok, "policy_loss": math.nan, "value_loss": math.nan, "advantage": "rloo"},
                kl_max=1.0).startswith("NaN")
    assert gate({**ok, "value_loss": math.nan, "advantage": "rloo", "kl": 2.0},
                kl_max=1.0).startswith("KL")


def test_until_likely_imitates_only_the_tokens_less_likely_than_the_policys_replies():
    """With a target (the policy's own replies' NLL per token), a demonstration's token at or
    below it adds nothing; one above it is pushed up, as hard as without the target."""
    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0),   # a reply of its own
                       ([1], [4, 5], None, 1.0, 1.0, 1.0),            # half learnt
                       ([1], [6, 7], None, 1.0, 1.0, 1.0)],           # unlikely
                      demos=[False, True, True])
    policy = OneTokenPolicy([[-1.0, -1.0], [-0.5, -1.5], [-2.0, -4.0]])
    b.logp_behaviour = torch.full((3, 2), -1.0)  # the round's start (train_policy fills it)
    zero = torch.zeros(3, 2)
    hp = Hyper(advantage="rloo", imitation_coef=1.0)
    grads = {}
    for target in (1.2, None):
        policy.logp.grad = None
        loss, stats = minibatch_loss(policy, b, zero, b.logp_behaviour, zero, zero, zero, hp,
                                     imitation_target=target)
        loss.backward()
        grads[target] = policy.logp.grad.clone()
        # reported over every demonstration token either way: (0.5 + 1.5 + 2 + 4) / 4
        assert float(stats["imitation_loss"]) == pytest.approx(2.0)
        # the share of demonstration tokens pushed: 3 of 4 above 1.2, all without a target
        assert float(stats["imitation_active"]) == pytest.approx(0.75 if target else 1.0)
    g = grads[1.2]
    assert g[1, 0] == 0                                # NLL 0.5, below 1.2: left alone
    assert g[1, 1] < 0 and (g[2] < 0).all()            # a descent step raises the others
    # each pushed token is pulled as hard as without the target: 1 / (4 demonstration tokens)
    close(g[1:], [[0.0, -0.25], [-0.25, -0.25]])
    close(grads[None][1:], [[-0.25, -0.25], [-0.25, -0.25]])
    assert torch.count_nonzero(g[0]) == 0              # its own reply: no imitation


def test_only_the_demonstrations_flagged_until_are_imitated_until_likely_under_the_once_rule():
    """The replies the model wrote in a style (Rollout.until) stop at the target whatever
    rule the rewrites follow; a rewrite under the once rule is pushed on every token."""
    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0),   # a reply of its own
                       ([1], [4, 5], [-1.0, -1.0], 1.0, 1.0, 1.0),   # styled: until likely
                       ([1], [6, 7], None, 1.0, 1.0, 1.0)],           # a rewrite: once
                      demos=[False, True, True], until=[False, True, False])
    close(b.until, [0.0, 1.0, 0.0])
    policy = OneTokenPolicy([[-1.0, -1.0], [-0.5, -1.5], [-0.5, -1.5]])
    b.logp_behaviour = torch.full((3, 2), -1.0)
    zero = torch.zeros(3, 2)
    policy.logp.grad = None
    loss, stats = minibatch_loss(policy, b, zero, b.logp_behaviour, zero, zero, zero,
                                 Hyper(advantage="rloo", imitation_coef=1.0),
                                 imitation_target=1.2)
    loss.backward()
    g = policy.logp.grad
    assert g[1, 0] == 0 and g[1, 1] < 0          # the styled reply's likely token is left alone
    assert (g[2] < 0).all()                        # the rewrite's is still pushed
    assert float(stats["imitation_active"]) == pytest.approx(0.75)
    # with the rule until likely for every demonstration, the rewrite stops there too
    policy.logp.grad = None
    loss, _ = minibatch_loss(policy, b, zero, b.logp_behaviour, zero, zero, zero,
                             Hyper(advantage="rloo", imitation_coef=1.0,
                                   imitation_until_likely=True), imitation_target=1.2)
    loss.backward()
    assert policy.logp.grad[2, 0] == 0
    # no flag on any demonstration: no until tensor, and the batch's length is checked
    rewrite = [([1], [2], None, 1.0, 1.0, 1.0)]
    assert build_rollout(rewrite, demos=[True], until=[False]).until is None
    with pytest.raises(ValueError, match="until has 2 flags for 1 episodes"):
        build_rollout(rewrite, demos=[True], until=[True, True])


def test_the_target_is_the_policys_own_replies_nll_per_token():
    from reinf.training.ppo import own_nll

    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0),
                       ([1], [4], [-1.0], 1.0, 0.0, 1.0),
                       ([1], [6, 7], None, 1.0, 1.0, 1.0)], demos=[False, False, True])
    logp = torch.tensor([[-1.0, -2.0], [-4.0, -100.0], [-9.0, -9.0]])  # -100: padding
    assert own_nll(b, logp) == pytest.approx((1 + 2 + 4) / 3)  # the demonstration left out
    only = build_rollout([([1], [6, 7], None, 1.0, 1.0, 1.0)], demos=[True])
    assert own_nll(only, torch.zeros(1, 2)) is None


def test_a_well_rated_reply_imitated_still_counts_as_the_policys_own():
    """training.imitate_rated: a rated reply the imitation term reads was sampled by the
    policy (it has behaviour log-probs), so it stays in the target; a rewrite does not."""
    from reinf.training.ppo import own_nll

    b = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0),   # rated 5: imitated
                       ([1], [4], [-1.0], 1.0, 0.0, 1.0),            # rated 1
                       ([1], [6, 7], None, 1.0, 1.0, 1.0)],          # a rewrite
                      demos=[True, False, True])
    assert b.written.tolist() == [0.0, 0.0, 1.0]
    assert b.select(torch.tensor([2, 0])).written.tolist() == [1.0, 0.0]
    logp = torch.tensor([[-1.0, -2.0], [-4.0, -100.0], [-9.0, -9.0]])
    assert own_nll(b, logp) == pytest.approx((1 + 2 + 4) / 3)
    rated_only = build_rollout([([1], [2, 3], [-1.0, -1.0], 1.0, 0.0, 1.0)], demos=[True])
    assert own_nll(rated_only, torch.tensor([[-1.0, -3.0]])) == pytest.approx(2.0)


def test_two_gradients_cosine_and_norm_over_all_their_tensors():
    a = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]   # norm 5
    b = [torch.tensor([0.0, 2.0]), torch.tensor([0.0])]   # norm 2, orthogonal to a
    assert norm(a) == pytest.approx(5.0) and norm(b) == pytest.approx(2.0)
    assert cosine(a, b) == pytest.approx(0.0)
    c = [torch.tensor([-3.0, 1.0]), torch.tensor([0.0])]  # a . c = -9, |c| = sqrt(10)
    assert cosine(a, c) == pytest.approx(-9 / (5 * math.sqrt(10)))
    assert cosine(a, [torch.zeros(2), torch.zeros(1)]) == 0.0  # nothing to compare with

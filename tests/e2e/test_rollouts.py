"""The default training method: a rating model fitted on the person's ratings scores fresh
rollouts, and PPO trains on them (reinf.training.rating_model, rollouts, trainer).

The demo model answers every question in several styles (terse or chatty, plain or
bulleted, with or without a closing question), so a simulated person who prefers terse
replies gives it something real to learn; the tiny random model checks the log-prob maths.
"""
from __future__ import annotations

import pytest
import torch

import trainkit as tk

pytestmark = [pytest.mark.e2e, pytest.mark.stack]  # see pyproject.toml's markers


def demo_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinf.catalog import PROJECT_ROOT

    path = PROJECT_ROOT / "models" / "reinf-demo"
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def prompt_ids(tokenizer, text: str) -> list[int]:
    from reinf.model.modeling import build_prompt_ids

    return build_prompt_ids(tokenizer, [], text, max_history=0, max_context_tokens=512,
                            max_new_tokens=128)


def terse(reply: str) -> bool:
    from reinf.demo.corpus import detect_styles

    return detect_styles(reply)["length"] == "terse"


# --- rollouts: behaviour log-probs ------------------------------------------------------------

@pytest.mark.parametrize("with_adapter", [False, True])
def test_rollout_logprobs_are_reproduced_by_a_reforward(tmp_path, with_adapter):
    """Left-padded batched sampling records what the PPO forward computes: the ratio
    starts at exactly 1 (up to float noise) for prompts of different lengths."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinf.training.ppo import Policy, ValueHead, build_rollout, evaluate
    from reinf.training.rollouts import sample_rollouts
    from tiny import make_adapter

    model_dir = tk.make_model(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if with_adapter:
        model = PeftModel.from_pretrained(model, str(make_adapter(model_dir, tmp_path / "a",
                                                                  seed=3))).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [[1, 5, 6, 7, 1], [1] + list(range(10, 30)) + [1], [1, 9, 1]]
    rollouts = sample_rollouts(model, tokenizer, prompts, 3, temperature=0.7, top_p=0.9,
                               max_new_tokens=12, seed=5, batch_size=4)
    assert len(rollouts) == 9 and [r.group for r in rollouts] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(len(r.logprobs) == len(r.reply_ids) >= 1 for r in rollouts)
    assert len({tuple(r.reply_ids) for r in rollouts}) > 3  # really sampled, not greedy
    b = build_rollout([(r.prompt_ids, r.reply_ids, r.logprobs, 0.7, 0.0, 1.0) for r in rollouts])
    logp, _ = evaluate(Policy(model, ValueHead(model.config.hidden_size)), b, 4)
    gap = ((logp - b.logp_behaviour) * b.mask).abs().max()
    assert gap < 1e-4, f"re-forward differs from the sampled log-probs by {gap:.2e} nats"


def test_rollouts_are_deterministic_for_a_seed(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinf.training.rollouts import sample_rollouts

    model_dir = tk.make_model(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=8, batch_size=3)
    a = sample_rollouts(model, tokenizer, [[1, 5, 1], [1, 8, 9, 1]], 2, seed=1, **kw)
    b = sample_rollouts(model, tokenizer, [[1, 5, 1], [1, 8, 9, 1]], 2, seed=1, **kw)
    c = sample_rollouts(model, tokenizer, [[1, 5, 1], [1, 8, 9, 1]], 2, seed=2, **kw)
    assert [r.reply_ids for r in a] == [r.reply_ids for r in b]
    assert [r.reply_ids for r in a] != [r.reply_ids for r in c]


# --- the rating model ---------------------------------------------------------------------

def test_the_rating_model_learns_a_planted_preference():
    """On the demo model's own features: a person who likes terse replies and dislikes
    chatty ones, 32 ratings. It must rank unseen replies the same way."""
    from reinf.demo.corpus import generate_corpus
    from reinf.training.rating_model import fit_rating_model, reply_features, spearman

    model, tokenizer = demo_model()
    items = generate_corpus(seed=11, n=96)
    pairs = []
    for item in items:
        reply = tokenizer.encode(item["reply"], add_special_tokens=False) + [tokenizer.eos_token_id]
        pairs.append((prompt_ids(tokenizer, item["prompt"]), reply))
    scores = [5 if terse(item["reply"]) else 1 for item in items]
    x = reply_features(model, pairs)
    assert x.shape[0] == 96 and torch.isfinite(x).all()
    rm = fit_rating_model(x[:32], scores[:32], heads=5, seed=0)
    assert rm.n == 32 and rm.consistency is not None and rm.consistency > 0.6
    mean, std = rm.predict(x[32:])
    assert spearman(mean.tolist(), scores[32:]) > 0.6
    liked = mean[torch.tensor(scores[32:]) == 5].mean()
    disliked = mean[torch.tensor(scores[32:]) == 1].mean()
    assert liked - disliked > 1.5, (float(liked), float(disliked))
    assert (std >= 0).all() and rm.score(x[32:], 1.0).le(mean + 1e-6).all()  # pessimistic


def test_the_rating_model_round_trips_through_its_state_dict():
    from reinf.training.rating_model import RatingModel, fit_rating_model

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 6, generator=gen)
    y = (x[:, 0] > 0).float() * 4 + 1
    rm = fit_rating_model(x, y.tolist(), heads=3, seed=1)
    again = RatingModel.from_state_dict(rm.state_dict())
    assert torch.allclose(rm.predict(x)[0], again.predict(x)[0])
    assert again.consistency == pytest.approx(rm.consistency)


def test_the_features_see_each_token_and_pair_of_tokens_a_reply_has():
    """Set 2: the hidden states and length (set 1), the largest input embedding over the
    reply, and the bag of its tokens and neighbouring pairs, at a fixed width."""
    from reinf.training.rating_model import BAG_BUCKETS, _bag, reply_features

    model, tokenizer = demo_model()
    prompt = prompt_ids(tokenizer, "How do I boil an egg?")
    plain = tokenizer.encode("Boil it for nine minutes.", add_special_tokens=False)
    bang = tokenizer.encode("Boil it for nine minutes!", add_special_tokens=False)
    x = reply_features(model, [(prompt, plain), (prompt, bang), (prompt, plain[::-1])])
    h = model.config.hidden_size
    assert x.shape == (3, 5 * h + 1 + BAG_BUCKETS) and torch.isfinite(x).all()
    # the embeddings' max: each dimension's largest value over the reply's own tokens
    embedded = model.get_input_embeddings().weight.detach()
    assert torch.allclose(x[0, 4 * h + 1:5 * h + 1], embedded[plain].amax(0), atol=1e-5)
    bag = x[:, 5 * h + 1:]
    assert set(bag.unique().tolist()) == {0.0, 1.0}
    assert torch.equal(bag, _bag([plain, bang, plain[::-1]]))
    assert not torch.equal(bag[0], bag[1])  # the "!" and the pair before it
    # the same tokens in another order: the same token buckets, other pair buckets
    assert not torch.equal(bag[0], bag[2])
    assert bag[0].sum() <= 2 * len(plain) - 1 and bag[0].sum() >= len(set(plain))


def test_a_rating_model_fitted_on_an_earlier_feature_set_is_refused_by_name(tmp_path):
    """A checkpoint an earlier Reinf wrote (no feature set: set 1, a narrower vector) is
    never applied to this Reinf's features: reading it says why, and best-of-n and the
    compare view go on without it."""
    from safetensors.torch import save_file

    from reinf.serving.best_of import read_rater
    from reinf.training.checkpoints import RATING_MODEL
    from reinf.training.rating_model import RatingModel, fit_rating_model

    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(0))
    state = fit_rating_model(x, ((x[:, 0] > 0).float() * 4 + 1).tolist(), heads=2).state_dict()
    del state["feature_set"]
    with pytest.raises(ValueError, match="feature set 1.*next training round fits a new one"):
        RatingModel.from_state_dict(state)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / RATING_MODEL))
    rater = read_rater("r0001", tmp_path, min_consistency=-1.0)
    assert rater.model is None and "feature set 1" in rater.reason


# --- a round on the demo model -------------------------------------------------------------

def rate_demo_turns(config, store, n: int, seed: int = 0) -> None:
    """``n`` turns from the demo model through the real chat path, rated by a simulated
    person who likes terse replies (5) and dislikes chatty ones (1)."""
    from reinf.serving.chat import ChatService
    from reinf.demo.corpus import sample_prompts
    from reinf.serving.engine import Engine

    engine = Engine.load(config)
    chat = ChatService(engine, store, config)
    for i, prompt in enumerate(sample_prompts(seed, n)):
        turn = chat.send(prompt, seed=seed * 1000 + i)
        store.rate(turn.id, 5 if terse(turn.reply) else 1)


def style_margin(model, tokenizer, pairs) -> float:
    margins = []
    for prompt, good, bad in pairs:
        ids = prompt_ids(tokenizer, prompt)
        lp = [sum(tk.reply_logprobs(model, ids, tokenizer.encode(r, add_special_tokens=False),
                                    1.0)) for r in (good, bad)]
        margins.append(lp[0] - lp[1])
    return sum(margins) / len(margins)


def style_pairs(n: int = 12):
    """(prompt, terse reply, chatty reply) from the demo corpus, same question each."""
    from reinf.demo.corpus import generate_corpus

    by_prompt: dict[str, dict[str, str]] = {}
    for item in generate_corpus(seed=5, n=600):
        by_prompt.setdefault(item["prompt"], {})["terse" if terse(item["reply"]) else
                                                 "chatty"] = item["reply"]
    pairs = [(p, d["terse"], d["chatty"]) for p, d in by_prompt.items() if len(d) == 2]
    return pairs[:n]


def capture_batches(monkeypatch) -> list[list[tuple]]:
    """The episodes of every ``build_rollout`` call from now on, in order: a round's PPO
    batch first, then the gate's measures."""
    import reinf.training.ppo as ppo

    calls: list[list[tuple]] = []
    build = ppo.build_rollout
    monkeypatch.setattr(ppo, "build_rollout",
                        lambda episodes, *a, **kw: (calls.append(list(episodes)),
                                                    build(episodes, *a, **kw))[1])
    return calls


def active_margin(store, tokenizer, pairs) -> float:
    """``style_margin`` of the demo model with the store's active adapter."""
    from reinf.catalog import PROJECT_ROOT

    tuned = tk.load_policy(PROJECT_ROOT / "models" / "reinf-demo",
                           store.active_checkpoint().path)
    return style_margin(tuned, tokenizer, pairs)


def test_a_rollout_round_moves_the_policy_toward_the_preference(config, store):
    from reinf.training.trainer import train_round

    cfg = config.replace(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                         learning_rate=2e-3, ppo_epochs=4, seed=0)
    rate_demo_turns(cfg, store, 24)
    model, tokenizer = demo_model()
    pairs = style_pairs()
    before = style_margin(model, tokenizer, pairs)
    result = train_round(cfg, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rollouts", m["mode_reason"]
    assert m["rollouts"] == 32 and m["rollout_prompts"] == 8
    assert m["rating_model_ratings"] == 24 and m["rating_model_consistency"] >= 0.3
    assert m["advantage"] == "rloo" and m["rated_in_batch"] >= 1
    assert m["samples"] == 32 + m["rated_in_batch"]
    active = store.active_checkpoint()
    assert (tk.lora_vector(active.path).abs() > 0).any()  # LoRA B starts at zero: it moved
    from reinf.training.checkpoints import load_rating_model
    assert load_rating_model(active.path) is not None
    after = active_margin(store, tokenizer, pairs)
    assert after > before + 0.05, (before, after)  # terse replies: relatively more likely


def test_a_styled_round_trains_styled_replies_as_answers_to_the_plain_prompt(config, store,
                                                                           tmp_path,
                                                                           monkeypatch):
    """``training.styled_rollouts``: half of each prompt's rollouts are sampled with an
    instruction from the person's styles file, but PPO and the rating model read every reply
    under the prompt as the person wrote it; the round still moves the policy their way."""
    from reinf.training.trainer import train_round

    styles = ["Keep it short.", "Say more.", "Use a list."]
    f = tmp_path / "styles.txt"
    f.write_text("\n".join(styles), encoding="utf-8")
    cfg = config.replace(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                         training_styled_rollouts=2, training_styles_file=str(f),
                         learning_rate=2e-3, ppo_epochs=4, seed=0)
    rate_demo_turns(cfg, store, 24)
    rated_prompts = {tuple(s.prompt_ids) for s in store.training_samples(100)}
    calls = capture_batches(monkeypatch)  # the first is the PPO batch
    model, tokenizer = demo_model()
    pairs = style_pairs()
    before = style_margin(model, tokenizer, pairs)
    result = train_round(cfg, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rollouts" and m["rollouts"] == 32
    assert m["styled_rollouts"] == 16 and set(m["style_gains"]) <= set(styles)
    assert isinstance(m["styled_score_gain"], float)
    from reinf.daemon.status import collect_status
    favoured = collect_status(cfg, store)["training"]["favoured_styles"]
    assert favoured == [[s, round(g, 2)] for s, g in m["style_gains"].items() if g > 0][:3]
    seen = calls[0]
    assert len(seen) == m["samples"] and {tuple(e[0]) for e in seen} <= rated_prompts
    assert not any("list" in tokenizer.decode(e[0]) for e in seen)  # no instruction in them
    # the demo model ignores instructions, so half its replies come from prompts it never
    # saw: the push is weaker than a plain round's (+0.02 here, against > +0.05), not wrong
    assert active_margin(store, tokenizer, pairs) > before + 0.01


def test_replies_served_in_a_style_are_rated_and_trained_as_answers_to_the_plain_prompt(
        config, store, monkeypatch):
    """``explore_styles``: half the served replies (one batch, ``send_many``, through the
    real engine) are asked for in a style; each is stored under the prompt as the person
    wrote it, and the round's PPO batch takes them with no stored log-probs (their behaviour
    policy is the round-start pass, as for a rollout), and the round still moves the policy
    the person's way."""
    from reinf.demo.corpus import sample_prompts
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.training.trainer import train_round

    cfg = config.replace(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                         explore_styles=0.5, learning_rate=2e-3, ppo_epochs=4, seed=0)
    engine = Engine.load(cfg)
    chat = ChatService(engine, store, cfg)
    turns = chat.send_many(sample_prompts(0, 24), seed=0)
    styled = {t.id for t in turns if t.gen_params.get("style")}
    assert 4 <= len(styled) <= 20
    for t in turns:
        assert t.prompt_ids == engine.build_prompt([], t.user_message)
        assert len(t.logprobs) == len(t.reply_ids)
        store.rate(t.id, 5 if terse(t.reply) else 1)
    calls = capture_batches(monkeypatch)  # the first is the PPO batch
    model, tokenizer = demo_model()
    pairs = style_pairs()
    before = style_margin(model, tokenizer, pairs)
    result = train_round(cfg, store)
    assert result.status == "succeeded", result.message
    by_reply = {(tuple(t.prompt_ids), tuple(t.reply_ids)): t.id for t in turns}
    stored: dict[int, set[bool]] = {}  # turn id -> "had stored log-probs" of its episodes
    for e in calls[0]:  # (a fresh rollout may repeat a rated reply: it has None too)
        if (key := (tuple(e[0]), tuple(e[1]))) in by_reply:
            stored.setdefault(by_reply[key], set()).add(e[2] is not None)
    assert set(stored) & styled and set(stored) - styled
    assert all(stored[i] == {False} for i in set(stored) & styled)
    assert all(True in stored[i] for i in set(stored) - styled)
    assert active_margin(store, tokenizer, pairs) > before + 0.02


STYLES = ["Use a list.", "Keep it short.", "Say more.", "Be formal.", "Be casual.",
          "Give an example.", "Ask a question back.", "Explain step by step."]


def rate_one_style_well(config, store, tmp_path):
    """Six replies served in ``STYLES[0]`` (explore_styles, through the real chat path) rated
    5, eighteen plain ones 1 or 2; returns the round's config: 8 rollout prompts, 4 replies
    each, 2 of them styled from ``STYLES``."""
    from reinf.demo.corpus import sample_prompts
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine

    one, every = tmp_path / "one.txt", tmp_path / "styles.txt"
    one.write_text(STYLES[0], encoding="utf-8")
    every.write_text("\n".join(STYLES), encoding="utf-8")
    served = config.replace(explore_styles=1.0, training_styles_file=str(one))
    chat = ChatService(Engine.load(served), store, served)
    for turn in chat.send_many(["What is rain?", "Why is the sky blue?", "How do birds fly?",
                                "What is a cloud?", "Why do leaves fall?", "What is snow?"],
                               seed=1):
        assert turn.gen_params["style"] == STYLES[0]
        store.rate(turn.id, 5)
    plain = ChatService(Engine.load(config), store, config)
    for turn in plain.send_many(sample_prompts(0, 18), seed=2):  # the usual reply: a 1 or 2
        assert "style" not in turn.gen_params
        store.rate(turn.id, 1 + turn.id % 2)
    return config.replace(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                          training_styled_rollouts=2, training_styles_file=str(every), seed=0)


def test_a_round_asks_its_rollouts_for_the_style_the_person_rated_well(config, store, tmp_path):
    """``training.styled_pick: ratings``: with one style rated 5 six times and the usual reply
    1 or 2, the round's styled rollouts ask for it for every prompt, where a uniform draw
    from eight styles would for about one in four. With ``training.imitate_styled`` the
    style's lift from those ratings (over 1 point) is added to its replies' scores, so a
    styled reply is imitated for every prompt."""
    from reinf.training.trainer import train_round

    cfg = rate_one_style_well(config, store, tmp_path).replace(
        training_min_consistency=-1.0, training_imitate_styled=0.5)
    assert cfg.training.styled_pick == "ratings"      # the default
    result = train_round(cfg, store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rollouts" and sum(m["style_counts"].values()) == 16
    assert list(m["style_counts"])[0] == STYLES[0]
    assert m["style_counts"][STYLES[0]] == 8, m["style_counts"]  # of 8 prompts; uniform: ~2
    assert m["style_lifts"][STYLES[0]] > 1.0, m["style_lifts"]
    assert m["styled_imitated"] == 8, m      # one a prompt, all 8; without the lift 5 here
    # imitated until likely (a target), though the rewrites' rule is once
    assert cfg.training.rewrite_imitation_rule == "once" and m["imitation_target"] > 0, m


def test_before_the_rating_model_is_trusted_the_style_rated_well_is_imitated(
        config, store, tmp_path, monkeypatch):
    """``training.imitate_styled`` in a rated round (the rating model below
    ``min_consistency``): one reply a rollout prompt asked for in the style the ratings lift,
    under its plain prompt, sampled now (no stored behaviour log-probs), imitated; and
    nothing of the kind with ``imitate_styled`` off."""
    import reinf.training.ppo as ppo
    from reinf.training.trainer import train_round

    cfg = rate_one_style_well(config, store, tmp_path).replace(training_min_consistency=1.0)
    seen: list[tuple[list, list]] = []
    build = ppo.build_rollout
    monkeypatch.setattr(ppo, "build_rollout", lambda episodes, *a, demos=None, **kw: (
        seen.append((list(episodes), list(demos or []))), build(episodes, *a, demos=demos,
                                                                **kw))[1])
    result = train_round(cfg.replace(training_imitate_styled=0.5), store)
    m = result.metrics
    assert result.status == "succeeded", result.message
    assert m["mode"] == "rated" and m["styled_style"] == STYLES[0], m
    assert m["styled_imitated"] == 8 and m["imitation_loss"] > 0, m
    assert m["imitation_target"] > 0, m                 # until likely, under the once rule
    batch, flags = seen[0]                              # the round's batch (not the gate's)
    imitated = [e for e, flag in zip(batch, flags) if flag]
    assert len(imitated) == 8 and all(e[2] is None for e in imitated)
    rated_prompts = {tuple(s.prompt_ids) for s in store.training_samples(100)}
    assert {tuple(e[0]) for e in imitated} <= rated_prompts          # the plain prompts
    assert all(e[4] > min(x[4] for x in batch) for e in imitated)   # usual + lift: above a 1
    seen.clear()
    off = train_round(cfg, store, force=True)
    assert off.metrics["mode"] == "rated" and "styled_imitated" not in off.metrics
    assert not any(seen[0][1])


def test_imitating_the_best_styled_rollouts_moves_the_model_further_toward_them(
        config, store, tmp_path, monkeypatch):
    """``training.imitate_styled``: the same round on the same ratings twice, once with the
    styled rollouts the rating model scores above the plain ones imitated. That round flags
    at most one styled reply a prompt for the imitation term, and leaves those replies more
    likely as plain answers than the round without it does."""
    import shutil

    import reinf.training.ppo as ppo
    from reinf.catalog import PROJECT_ROOT
    from reinf.config import load_config
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    knobs = dict(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                 training_styled_rollouts=2, training_min_consistency=-1.0,
                 learning_rate=2e-3, seed=0)
    rate_demo_turns(config, store, 24)
    other = tmp_path / "again"
    shutil.copytree(config.data_dir, other)  # the same rated turns, in a data directory of its own
    plain_cfg = config.replace(**knobs)
    # the demo model ignores instructions, so its styled replies score close to its plain
    # ones: a small margin, to have something to imitate
    cfg = load_config(environ={"REINF_HOME": str(other)}).replace(
        **knobs, training_imitate_styled=0.05)
    seen: list[tuple[list, list]] = []
    build = ppo.build_rollout
    monkeypatch.setattr(ppo, "build_rollout", lambda episodes, *a, demos=None, **kw: (
        seen.append((list(episodes), list(demos or []))), build(episodes, *a, demos=demos,
                                                                **kw))[1])
    without = train_round(plain_cfg, store)
    assert without.status == "succeeded", without.message
    assert "styled_imitated" not in without.metrics and not any(seen[0][1])
    seen.clear()
    other_store = Store.open(cfg)
    try:
        result = train_round(cfg, other_store)
        adapters = [store.active_checkpoint().path, other_store.active_checkpoint().path]
    finally:
        other_store.close()
    m = result.metrics
    assert result.status == "succeeded", result.message
    batch, flags = seen[0]
    imitated = [e for e, flag in zip(batch, flags) if flag]
    assert 1 <= m["styled_imitated"] == len(imitated) <= 8          # at most one a prompt
    assert len({tuple(e[0]) for e in imitated}) == len(imitated)
    assert all(e[2] is None for e in imitated)                         # rollouts, not ratings
    assert m["imitation_loss"] > 0
    _, tokenizer = demo_model()
    demo = PROJECT_ROOT / "models" / "reinf-demo"

    def likelihood(path) -> float:  # mean log-prob per token of the imitated replies
        model = tk.load_policy(demo, path)
        lps = [tk.reply_logprobs(model, e[0], e[1], 1.0) for e in imitated]
        return sum(sum(lp) for lp in lps) / sum(len(lp) for lp in lps)

    plain_round, imitating_round = map(likelihood, adapters)
    # +0.03 nats a token here: the demo model already finds its own replies likely
    assert imitating_round > plain_round + 0.015, (plain_round, imitating_round)


def test_an_iterated_round_samples_again_where_its_last_pass_left_the_adapter(config, store,
                                                                              tmp_path):
    """``training.rollout_iterations``: the same round, same ratings and rating model, run
    as one pass and as three. Its first pass is the one-pass round exactly; the later passes
    sample fresh replies from the adapter the earlier ones trained, so the round moves the
    policy further the person's way."""
    import shutil

    from reinf.config import load_config
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    cfg = config.replace(training_rollout_prompts=8, training_rollouts_per_prompt=4,
                         training_min_consistency=-1.0, learning_rate=2e-3, seed=0)
    rate_demo_turns(cfg, store, 24)
    other = tmp_path / "again"
    shutil.copytree(cfg.data_dir, other)  # the same rated turns, in a data directory of its own
    cfg3 = load_config(environ={"REINF_HOME": str(other)}).replace(
        training_rollout_prompts=8, training_rollouts_per_prompt=4, training_min_consistency=-1.0,
        learning_rate=2e-3, seed=0, training_rollout_iterations=3)
    store3 = Store.open(cfg3)
    try:
        assert len(store3.training_samples(100)) == 24
        events = []
        once, thrice = train_round(cfg, store), train_round(cfg3, store3, progress=events.append)
        adapters = {"once": store.active_checkpoint().path,
                    "thrice": store3.active_checkpoint().path}
    finally:
        store3.close()
    assert once.status == thrice.status == "succeeded", (once.message, thrice.message)
    assert once.metrics["mode"] == thrice.metrics["mode"] == "rollouts"
    assert "iterations" not in once.metrics
    passes = thrice.metrics["iterations"]
    assert len(passes) == 3 and thrice.metrics["rollouts"] == 3 * 32
    assert thrice.metrics["samples"] == sum(p["samples"] for p in passes)
    assert thrice.metrics["kl"] == passes[-1]["kl"]
    # pass 1 is the one-pass round: same seed, same batch, same update
    assert passes[0]["samples"] == once.metrics["samples"]
    assert passes[0]["kl"] == pytest.approx(once.metrics["kl"], rel=1e-4, abs=1e-7)
    # the progress events say which pass they belong to
    assert {(e["iteration"], e["iterations"]) for e in events if e["stage"] == "rollouts"} == \
        {(1, 3), (2, 3), (3, 3)}
    assert thrice.metrics["kl"] > once.metrics["kl"]
    model, tokenizer = demo_model()
    pairs = style_pairs()
    from reinf.catalog import PROJECT_ROOT
    demo = PROJECT_ROOT / "models" / "reinf-demo"
    margin = {name: style_margin(tk.load_policy(demo, path), tokenizer, pairs)
              for name, path in adapters.items()}
    base = style_margin(model, tokenizer, pairs)
    assert margin["thrice"] > margin["once"] + 0.05 > base + 0.05, (base, margin)


def test_cold_start_trains_on_rated_replies_and_says_why(config, store):
    from reinf.daemon.status import collect_status
    from reinf.training.trainer import train_round

    rate_demo_turns(config, store, 5)
    result = train_round(config, store)
    assert result.status == "succeeded"
    # RLOO, as ppo.advantage says: each rated reply against the others (no value head)
    assert result.metrics["mode"] == "rated" and result.metrics["advantage"] == "rloo"
    assert "cold start" in result.metrics["mode_reason"]
    assert "5 of the 8 ratings" in result.metrics["mode_reason"]
    training = collect_status(config, store)["training"]
    assert training["last_mode"] == "rated" and "cold start" in training["last_mode_reason"]


def test_a_cold_start_on_ratings_all_alike_moves_nothing(config, store):
    """Equal ratings say nothing about which reply is better. Under RLOO every rated reply's
    advantage is then 0, so a first round leaves its fresh adapter exactly where it began;
    GAE's fresh value head would still move it (its advantages differ token by token)."""
    from pathlib import Path

    from reinf.demo.corpus import sample_prompts
    from reinf.model.adapters import read_adapter
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.training.trainer import train_round

    chat = ChatService(Engine.load(config), store, config)
    for i, prompt in enumerate(sample_prompts(0, 5)):
        store.rate(chat.send(prompt, seed=i).id, 1)

    def lora_b(result):
        _, weights = read_adapter(Path(store.get_checkpoint(result.checkpoint_id).path),
                                  result.checkpoint_id)
        return [w for name, w in weights.items() if "lora_B" in name]

    rloo = train_round(config, store)
    assert rloo.metrics["advantage"] == "rloo" and rloo.metrics["mode"] == "rated"
    assert all(not w.any() for w in lora_b(rloo))   # B starts at 0 and stayed there
    gae = train_round(config.replace(advantage="gae"), store, force=True)
    assert gae.metrics["advantage"] == "gae"
    assert any(w.any() for w in lora_b(gae))


def test_only_rounds_that_train_the_value_head_keep_it(config, store):
    """A GAE round (here a cold start with ``ppo.advantage: gae``) trains the value head:
    its checkpoint keeps it, and the round
    reports its value loss and explained variance. An RLOO rollout round neither reads nor
    trains it: its checkpoint has no value head file and no optimizer moments for one, the
    round reports both figures as nan (null), and the next round starts a fresh (zero)
    head with no warning."""
    import math
    from pathlib import Path

    from reinf.training import checkpoints
    from reinf.training.session import build_session
    from reinf.training.trainer import train_round

    rate_demo_turns(config, store, 5)
    cold = train_round(config.replace(advantage="gae"), store)
    assert cold.metrics["mode"] == "rated" and cold.metrics["advantage"] == "gae"
    assert math.isfinite(cold.metrics["value_loss"]) and cold.metrics["value_loss"] > 0
    assert math.isfinite(cold.metrics["explained_variance"])
    cold_path = Path(store.active_checkpoint().path)
    assert (cold_path / checkpoints.VALUE_HEAD).is_file()
    n_params = len(checkpoints.load_checkpoint(cold_path).state["optimizer"]["param_groups"][0]
                   ["params"])
    assert len(checkpoints.load_checkpoint(cold_path).state["optimizer"]["state"]) == n_params

    cfg = config.replace(training_min_consistency=-1.0, training_rollout_prompts=4,
                         training_rollouts_per_prompt=2)
    rate_demo_turns(cfg, store, 8, seed=1)
    rollout = train_round(cfg, store)
    m = rollout.metrics
    assert rollout.status == "succeeded", rollout.message
    assert m["mode"] == "rollouts" and m["advantage"] == "rloo", m["mode_reason"]
    assert math.isnan(m["value_loss"]) and math.isnan(m["explained_variance"])
    run = store.get_run(rollout.run_id)
    assert run.metrics["value_loss"] is None and run.metrics["explained_variance"] is None
    path = Path(store.active_checkpoint().path)
    assert checkpoints.is_complete(path) and not (path / checkpoints.VALUE_HEAD).exists()
    moments = checkpoints.load_checkpoint(path).state["optimizer"]["state"]
    assert sorted(moments) == list(range(n_params - 2))  # the adapter's; the head's are gone

    session = build_session(cfg, store)
    assert all(not p.detach().any() for p in session.policy.value_head.parameters())
    assert not [w for w in session.warnings if "cannot be read" in w]


def test_forgotten_turns_never_reach_the_rating_model(config, store):
    from reinf.training.trainer import train_round

    rate_demo_turns(config, store, 14)
    forgotten = [t.id for t in store.history(limit=3)]
    for turn_id in forgotten:
        store.forget_turn(turn_id)
    result = train_round(config, store)
    assert result.metrics["rating_model_ratings"] == 11


def test_a_hook_that_breaks_on_predicted_scores_stops_the_round(config, store, tmp_path):
    """The person's mapper sees every fresh reply's predicted score; if it fails there,
    training stops with the same clear error as for a real rating."""
    from reinf.errors import HookError
    from reinf.training.trainer import train_round

    hook = tmp_path / "hook.py"
    hook.write_text("def reward_mapper(score, metadata):\n"
                    "    if metadata['predicted']:\n"
                    "        raise ValueError('no guesses please')\n"
                    "    return (score - 3) / 2\n")
    cfg = config.replace(reward_mapper=f"{hook}:reward_mapper", training_min_consistency=-1.0)
    rate_demo_turns(cfg, store, 10)
    with pytest.raises(HookError) as err:
        train_round(cfg, store)
    text = str(err.value)
    assert "reward hook broken" in text and "hook.py:3" in text
    assert "no guesses please" in text and "fresh reply" in text
    assert store.list_runs()[0].status == "failed"
    assert store.active_checkpoint() is None

"""``reinf bench rating-model``: how well the rating model orders replies it never saw, by how
many ratings it has had, on any model and any rater, without training anything.

A rollout round leans on the rating model (``reinf.training.rating_model``): it scores the
fresh replies, and RLOO compares the replies *to one prompt* with each other. So what
decides whether a round moves the policy the person's way is whether the model puts the
replies to one prompt in the person's order, more than its Spearman over all replies. This
measures both, in minutes instead of the hours a learning run takes.

1. One set of replies from the model as it is (no adapter): ``prompts`` prompts from the
   training side of the prompt set (never the probe), ``replies`` replies each, from the
   trainer's batched sampler at the rollouts' settings (temperature, top-p,
   ``training.rollout_max_new_tokens``). The rating model's features of each, once
   (``reply_features``, the trainer's own).
2. For each rater and each n in ``ratings``, ``draws`` times: n of the prompts drawn, one
   reply of each rated (a person rates the one reply they were served), the rating model
   fitted on those n (``fit_rating_model``, the trainer's own, with its cross-validated
   Spearman), then judged on the replies to every other prompt:

   - **Spearman** between its predictions and the rater's scores, beside the **ceiling** a
     predictor without ties can reach on those scores (``spearman_ceiling``);
   - **within-prompt accuracy**: of the pairs of replies to one prompt that the rater
     scores differently, the share the model orders the same way (0.5: a coin); and how
     many such pairs there were (a rater that scores all replies to a prompt alike gives a
     round nothing to learn from, whatever the model);
   - **weighted accuracy**: the same pairs, each weighted by the difference of the scores a
     round would give them (``RatingModel.score`` at ``training.pessimism``). RLOO pushes
     two replies to one prompt apart in proportion to that difference, so this is the share
     of a round's push on them that goes the rater's way. It is above the plain accuracy
     where the model is wrong mostly about pairs it scores nearly alike;
   - **push share**: of the push on *every* pair of replies to one prompt, the pairs the
     rater scores alike included, the share that goes the rater's way. A rater that tells
     few replies apart gets little of a round's movement, however well the model orders
     those few: the rest moves replies in ways the rater does not care about;
   - its own **cross-validated Spearman**, the figure a round reports and gates on
     (``training.min_consistency``).

With ``pairs_every`` k, each draw is also judged with every k-th interaction a pick
between two replies to its prompt instead of a rating (what regenerate gives: one
interaction either way), on the same drawn prompts: do picks teach the rating model more
per interaction than ratings?

Figures are means over the draws. The replies are the base model's, as in a first round;
after some rounds the policy's replies differ, so this is the rating model's starting
point, not its whole story.
"""
from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any, Callable, Sequence

#: What ``reinf bench rating-model`` does when not told otherwise.
PLAN = {"prompts": 64, "replies": 4, "ratings": (16, 32, 48), "draws": 5, "seed": 0}


def run_rating_study(config, raters: Sequence[str], *, prompts: int = PLAN["prompts"],
                     replies: int = PLAN["replies"], ratings: Sequence[int] = PLAN["ratings"],
                     draws: int = PLAN["draws"], seed: int = PLAN["seed"],
                     pairs_every: int = 0,
                     progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The report (module docstring): ``{"model", "replies", "raters": {name: {n: figures}}}``.
    With ``pairs_every`` k, each figure also has a ``with_pairs`` twin: the same draws with
    every k-th interaction a pick between two replies instead of a rating."""
    import torch

    from reinf.bench.generation import machine
    from reinf.bench.prompts import load_builtin, split_prompts, stream_prompts
    from reinf.bench.raters import is_unseen, load_rater
    from reinf.model.modeling import build_prompt_ids, load_model
    from reinf.training.rating_model import reply_features
    from reinf.training.rollouts import sample_rollouts

    say = progress or (lambda text: print(f"[rating-model] {text}", file=sys.stderr,
                                          flush=True))
    from reinf.errors import BadInput

    biggest = max(ratings)
    if biggest >= prompts:
        raise BadInput(f"--prompts ({prompts}) must exceed the largest --ratings ({biggest}): "
                       "the rating model is judged on the prompts it was not fitted on",
                       fix=f"pass --prompts {biggest * 2} or smaller --ratings")
    train_side, _probe = split_prompts(load_builtin())
    if prompts > len(train_side):  # beyond, the stream repeats texts on both sides
        raise BadInput(f"--prompts ({prompts}) exceeds the {len(train_side)} training-side "
                       "prompts", fix=f"pass --prompts {len(train_side)} or fewer")
    loaded_raters = {name: load_rater(name, seed=seed) for name in raters}  # fail before loading
    torch.manual_seed(seed)
    loaded = load_model(config)
    model, tokenizer = loaded.model, loaded.tokenizer
    gen_cfg, train_cfg = config.generation, config.training
    max_new = train_cfg.rollout_max_new_tokens or gen_cfg.max_new_tokens
    texts = stream_prompts(train_side, seed, prompts)
    ids = [build_prompt_ids(tokenizer, [], t, max_history=0, max_context_tokens=0,
                            max_new_tokens=max_new) for t in texts]
    started = time.perf_counter()
    say(f"sampling {prompts} prompts × {replies} replies from {loaded.name} "
        f"(up to {max_new} new tokens each)…")
    sampled = sample_rollouts(model, tokenizer, ids, replies, temperature=gen_cfg.temperature,
                              top_p=gen_cfg.top_p, max_new_tokens=max_new, seed=seed,
                              batch_size=train_cfg.rollout_batch_size,
                              progress=lambda done, total: say(f"sampled {done}/{total}"))
    kept = [r for r in sampled if r.reply_ids]
    sample_seconds = time.perf_counter() - started
    say(f"features of {len(kept)} replies…")
    features = reply_features(model, [(r.prompt_ids, r.reply_ids) for r in kept])
    groups: dict[int, list[int]] = {}
    for row, r in enumerate(kept):
        groups.setdefault(r.group, []).append(row)
    report: dict[str, Any] = {
        "model": loaded.name, "parameters": sum(p.numel() for p in model.parameters()),
        "machine": machine(), "prompts": prompts, "replies_per_prompt": replies,
        "replies": len(kept), "max_new_tokens": max_new, "draws": draws, "seed": seed,
        "ratings": list(ratings), "pairs_every": pairs_every,
        "sample_seconds": round(sample_seconds, 1),
        "features": int(features.shape[1]), "raters": {}}
    for name, rater in loaded_raters.items():
        scores = [float(rater(texts[r.group], r.text)) for r in kept]
        by_n = {}
        for n in ratings:
            figures = [judge(features, scores, groups, n, seed=seed * 1000 + d,
                             pessimism=train_cfg.pessimism) for d in range(draws)]
            by_n[str(n)] = summarise(figures)
            if pairs_every:
                by_n[str(n)]["with_pairs"] = summarise(
                    [judge(features, scores, groups, n, seed=seed * 1000 + d,
                           pairs_every=pairs_every, pessimism=train_cfg.pessimism)
                     for d in range(draws)])
        report["raters"][name] = {"unseen": is_unseen(name),
                                  "mean_score": round(statistics.fmean(scores), 3),
                                  "by_ratings": by_n}
        last = by_n[str(biggest)]
        say(f"{name}: after {biggest} ratings, within-prompt accuracy "
            f"{fmt(last['within_prompt_accuracy'])} (weighted "
            f"{fmt(last['weighted_accuracy'])}), Spearman {fmt(last['spearman'])} "
            f"(ceiling {fmt(last['ceiling'])}), cross-validated {fmt(last['cross_validated'])}")
    return report


def judge(features, scores: Sequence[float], groups: dict[int, list[int]], n: int, *,
          seed: int, pairs_every: int = 0, pessimism: float = 0.5
          ) -> dict[str, float | None]:
    """One draw: ``n`` interactions, one with each of ``n`` drawn prompts, then the model is
    judged on the other prompts. An interaction rates one reply of its prompt; with
    ``pairs_every`` k, every k-th one instead picks between two replies of its prompt (the
    better by the rater; a tie when it scores them alike), as regenerate does, and the
    picks join the fit (``fit_rating_model``'s Bradley-Terry term). The same ``seed`` draws
    the same prompts with or without pairs, so the two can be compared draw by draw.
    ``pessimism``: the trainer's (``training.pessimism``), for the scores the weighted
    accuracy weighs the pairs by."""
    from reinf.training.rating_model import (PairSet, fit_rating_model, spearman,
                                             spearman_ceiling)

    picker = random.Random(f"{seed}-picks")  # its own stream: the rated replies stay alike
    fitted, held, served = draw_prompts(groups, n, seed=seed)
    rows, paired, picks = [], [], []
    for i, (g, reply) in enumerate(zip(fitted, served), start=1):
        # the reply is drawn either way, so both arms rate the same replies
        if pairs_every and i % pairs_every == 0 and len(groups[g]) >= 2:
            a, b = picker.sample(groups[g], 2)
            picks.append((a, b, 1.0 if scores[a] > scores[b] else 0.0 if scores[a] < scores[b]
                          else 0.5))
            paired += [a, b]
        else:
            rows.append(reply)
    y = [scores[i] for i in rows]
    if len(set(y)) < 2:  # every rating the same: nothing to fit; the model knows nothing
        return {"spearman": None, "ceiling": None, "within_prompt_accuracy": None,
                "weighted_accuracy": None, "push_share": None, "pairs": 0,
                "cross_validated": None, "all_alike": 1.0}
    where = {row: k for k, row in enumerate(rows + paired)}
    pair_set = PairSet.of([(where[a], where[b], t) for a, b, t in picks]) if picks else None
    model = fit_rating_model(features[rows + paired], y, seed=seed, pairs=pair_set)
    test = [i for g in held for i in groups[g]]
    predicted, _ = model.predict(features[test])
    by_row = dict(zip(test, predicted.tolist()))
    reward = dict(zip(test, model.score(features[test], pessimism).tolist()))  # a round's
    truth = [scores[i] for i in test]
    agree = total = 0
    push = push_all = push_right = 0.0  # on the pairs the rater tells apart; on every pair
    for i, j in prompt_pairs(groups, held):
        gap = reward[i] - reward[j]
        push_all += abs(gap)
        if scores[i] == scores[j]:
            continue
        total += 1
        agree += (by_row[i] - by_row[j]) * (scores[i] - scores[j]) > 0
        push += abs(gap)
        push_right += abs(gap) * (gap * (scores[i] - scores[j]) > 0)
    return {"spearman": spearman(predicted.tolist(), truth), "ceiling": spearman_ceiling(truth),
            "within_prompt_accuracy": agree / total if total else None,
            "weighted_accuracy": push_right / push if push > 0 else None,
            "push_share": push_right / push_all if push_all > 0 else None, "pairs": total,
            "cross_validated": model.consistency, "all_alike": 0.0}


def draw_prompts(groups: dict[int, list[int]], n: int, *, seed: int
                 ) -> tuple[list[int], list[int], list[int]]:
    """One draw's prompts: (the ``n`` a person interacts with, the others, the reply served
    for each of the ``n``), the same for the same ``seed``."""
    rng = random.Random(seed)
    prompts = sorted(groups)
    rng.shuffle(prompts)
    fitted, held = prompts[:n], prompts[n:]
    return fitted, held, [rng.choice(groups[g]) for g in fitted]


def prompt_pairs(groups: dict[int, list[int]], prompts: Sequence[int]):
    """Every pair (i, j) of replies to one of ``prompts``, as rows of the study."""
    for g in prompts:
        members = groups[g]
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                yield members[a], members[b]


def summarise(figures: Sequence[dict]) -> dict[str, float | None]:
    """Means over the draws, each over the draws where the figure exists."""
    out: dict[str, float | None] = {}
    for key in figures[0]:
        values = [f[key] for f in figures if f[key] is not None]
        out[key] = round(statistics.fmean(values), 3) if values else None
    return out


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_study(report: dict) -> str:
    """The text report: one line per rater and number of ratings."""
    lines = [f"reinf bench rating-model: {report['model']} ({report['parameters']:,} parameters),"
             f" {report['replies']} replies to {report['prompts']} training-side prompts "
             f"({report['replies_per_prompt']} each, up to {report['max_new_tokens']} tokens; "
             f"sampled in {report['sample_seconds']:.0f} s), {report['features']} features, "
             f"means over {report['draws']} draws",
             f"  machine: {report['machine']}", "",
             f"  {'rater':<18} {'ratings':>7} {'within-prompt':>13} {'weighted':>8} "
             f"{'push':>5} {'pairs':>6} "
             f"{'Spearman':>8} {'ceiling':>7} {'cross-val':>9} {'all alike':>9}"
             + (f" {'with picks':>10}" if report.get("pairs_every") else "")]
    for name, r in report["raters"].items():
        label = name + ("" if r["unseen"] else " *")
        for n, f in r["by_ratings"].items():
            twin = f.get("with_pairs")
            lines.append(f"  {label:<18} {n:>7} {fmt(f['within_prompt_accuracy']):>13} "
                         f"{fmt(f.get('weighted_accuracy')):>8} "
                         f"{fmt(f.get('push_share')):>5} "
                         f"{f['pairs'] or 0:>6.0f} {fmt(f['spearman']):>8} {fmt(f['ceiling']):>7} "
                         f"{fmt(f['cross_validated']):>9} {f['all_alike']:>9.0%}"
                         + (f" {fmt(twin['within_prompt_accuracy']):>10}" if twin else ""))
            label = ""
    lines += ["", "  within-prompt: of the held-out pairs of replies to one prompt that the rater "
                  "scores differently, the share the rating model orders the same way (0.50 = a "
                  "coin); weighted: the same pairs, each weighted by the difference of the "
                  "scores a round gives them (the share of a round's push that goes the rater's "
                  "way); push: the share of the push on every pair, ties included, that goes "
                  "the rater's way; pairs: how many such pairs a draw has; all alike: draws "
                  "whose ratings were all the same (nothing to fit); * = a rater used to choose "
                  "defaults"
              + ("; with picks: within-prompt accuracy of the same draws when every "
                 f"{report['pairs_every']}th interaction is a pick between two replies instead "
                 "of a rating" if report.get("pairs_every") else "")]
    return "\n".join(lines)

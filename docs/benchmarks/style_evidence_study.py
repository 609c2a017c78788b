"""Can every rated reply say which style a person likes, not only the replies asked for in
one? (docs/benchmarks.md, "General text, and what learning a style costs it", its last
paragraph.)

The product finds a liked style from the ratings of the served replies that were asked for
in a style (``generation.explore_styles``): with 16 styles and half of 48 replies explored,
a style has one to three ratings, and a wrong style is sometimes lifted first. But the
model itself can say how much *any* reply reads like each style: the log-likelihood ratio

    LLR_s(reply) = log p(reply | prompt + instruction s) - log p(reply | prompt),

per reply token, is high for a reply that the instruction would have made likelier. If it
tells styles apart, every rated reply, plain ones included, is evidence for every style.

Two stages, each its own process, so the slow one runs once:

    REINF_HOME=... python docs/benchmarks/style_evidence_study.py sample DIR  # replies, LLRs
    python docs/benchmarks/style_evidence_study.py judge DIR                  # seconds

``sample`` draws STUDY_PROMPTS (64) training-side prompts of the built-in set (never the
probe), and for each one plain reply and STUDY_STYLED (3) replies asked for in a style (the
16 built-in styles, repeated and shuffled: 9 to 13 times each at the defaults), at the
served replies' sampling settings, seed 0; then every reply's LLR for all 16 styles, and
every built-in text rater's rating of it. ``judge`` simulates people: for each rater,
STUDY_DRAWS (1000) draws of 48 of the prompts, each served plain or, half the time, in one
of its styles, as ``explore_styles`` 0.5 serves them (uniformly here, not by Thompson
sampling), and asks which style each rule would imitate:

- **lift** (the product's rule, ``styles.style_lifts`` and ``styles.top_lifted``): the
  styled replies' ratings against the person's usual, at a margin of 0.5 and of 1.0;
- **LLR**: over all 48 rated replies, the Spearman correlation of the rating with each
  style's LLR; the style with the highest, where it reaches a threshold;
- **LLR lift**: a lift in the product's units: for each style, the mean rating of the
  quarter of the 48 replies that read most like it (highest LLR) less the person's usual,
  shrunk as ``style_lifts`` shrinks (n / (n + 2)); the highest, where it reaches the margin;
- **veto**: the product's pick at a margin of 0.5, kept only where that style's LLR lift
  is above 0 (or 0.25): the ratings of the replies asked for in it, and of all the replies
  that read like it, agree.

A pick is **right** when the style's true lift (the mean rating of all the pool's replies
asked for in it, less the plain replies' mean) is at least 0.5, **wrong** when it is below.
Settings by environment: STUDY_MODEL (smollm2-135m), STUDY_PROMPTS, STUDY_STYLED,
STUDY_DRAWS, STUDY_THREADS (1).
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

MODEL = os.environ.get("STUDY_MODEL", "smollm2-135m")
PROMPTS = int(os.environ.get("STUDY_PROMPTS", 64))
STYLED = int(os.environ.get("STUDY_STYLED", 3))
DRAWS = int(os.environ.get("STUDY_DRAWS", 1000))
RATINGS = 48
RIGHT = 0.5                      # a style whose true lift is at least this is a right pick
SEED = 0


def load():
    from reinf.config import load_config
    from reinf.model.modeling import load_model

    torch.set_num_threads(int(os.environ.get("STUDY_THREADS", 1)))
    config = load_config(None, environ=dict(os.environ), overrides={"model_path": MODEL})
    torch.manual_seed(SEED)
    return config, load_model(config)


def sample(out: Path) -> None:
    from reinf.bench.prompts import load_builtin, split_prompts, stream_prompts
    from reinf.bench.raters import load_rater
    from reinf.bench.text_raters import TEXT_RATERS
    from reinf.model.modeling import build_prompt_ids
    from reinf.training.rollouts import sample_rollouts
    from reinf.training.styles import (BUILTIN_STYLES, instruction_ids, template_tail,
                                       with_instruction)

    config, loaded = load()
    model, tokenizer = loaded.model, loaded.tokenizer
    texts = stream_prompts(split_prompts(load_builtin())[0], SEED, PROMPTS)
    max_new = config.generation.max_new_tokens
    plain = [build_prompt_ids(tokenizer, [], t, max_history=0, max_context_tokens=0,
                              max_new_tokens=max_new) for t in texts]
    tail = template_tail(tokenizer)
    styled_ids = {s: with_instruction(p, instruction_ids(tokenizer, s), tail)
                  for p in plain[:1] for s in BUILTIN_STYLES}
    if any(v is None for v in styled_ids.values()):
        sys.exit("the chat template does not end the user turn as template_tail reads it")
    order = list(BUILTIN_STYLES) * (PROMPTS * STYLED // len(BUILTIN_STYLES) + 1)
    random.Random(SEED).shuffle(order)
    contexts, asked = [], []
    for i, p in enumerate(plain):
        styles = order[i * STYLED:(i + 1) * STYLED]
        contexts += [p] + [with_instruction(p, instruction_ids(tokenizer, s), tail)
                           for s in styles]
        asked += [(i, None)] + [(i, s) for s in styles]
    started = time.time()
    sampled_file = out / "replies.json"   # kept, so a stopped run resumes after sampling
    if sampled_file.exists():
        replies = json.loads(sampled_file.read_text())
    else:
        replies = [{"index": r.group, "reply_ids": list(r.reply_ids), "text": r.text}
                   for r in sample_rollouts(
                       model, tokenizer, contexts, 1,
                       temperature=config.generation.temperature,
                       top_p=config.generation.top_p, max_new_tokens=max_new, seed=SEED,
                       batch_size=STYLED + 1,
                       progress=lambda d, n: print(f"sampled {d}/{n}", flush=True))]
        sampled_file.write_text(json.dumps(replies))
    sampled = time.time() - started
    raters = {name: load_rater(name, seed=SEED) for name in TEXT_RATERS}
    pool_file = out / "pool.json"         # written as it grows, read back on a resume
    rows = json.loads(pool_file.read_text()) if pool_file.exists() else []
    with torch.no_grad():
        for r in replies[len(rows):]:
            group, style = asked[r["index"]]
            variants = [plain[group]] + [with_instruction(plain[group],
                                                          instruction_ids(tokenizer, s), tail)
                                         for s in BUILTIN_STYLES]
            logp = reply_logprobs(model, variants, r["reply_ids"]) if r["reply_ids"] else None
            rows.append({"group": group, "prompt": texts[group], "asked": style,
                         "text": r["text"], "tokens": len(r["reply_ids"]),
                         "llr": None if logp is None else
                         {s: logp[k + 1] - logp[0] for k, s in enumerate(BUILTIN_STYLES)},
                         "ratings": {name: rate(texts[group], r["text"])
                                     for name, rate in raters.items()}})
            print(f"scored {len(rows)}/{len(replies)}", flush=True)
            if len(rows) % 20 == 0 or len(rows) == len(replies):
                pool_file.write_text(json.dumps(rows))
    print(f"{len(rows)} replies: sampled in {sampled:.0f} s, scored in "
          f"{time.time() - started - sampled:.0f} s")


def reply_logprobs(model, contexts: list[list[int]], reply: list[int]) -> list[float]:
    """log p(reply | context) for each context: the trainer's own scoring path
    (``reinf.training.ppo.evaluate``) on one episode per context, at temperature 1."""
    from reinf.training.ppo import Policy, ValueHead, build_rollout, evaluate

    policy = Policy(model, ValueHead(model.config.get_text_config().hidden_size))
    b = build_rollout([(c, reply, [0.0] * len(reply), 1.0, 0.0, 1.0) for c in contexts])
    logp, _ = evaluate(policy, b, len(contexts), values=False)
    return [float(row.sum()) for row in logp]


def spearman(x: list[float], y: list[float]) -> float:
    from reinf.training.rating_model import spearman as rank_corr

    value = rank_corr(x, y)
    return 0.0 if value is None or value != value else value


def judge(out: Path) -> None:
    from reinf.records import StyleRatings
    from reinf.training.styles import PRIOR_RATINGS, style_lifts, top_lifted, usual_rating

    rows = [r for r in json.loads((out / "pool.json").read_text()) if r["llr"] is not None]
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    raters = list(rows[0]["ratings"])
    styles = list(rows[0]["llr"])
    rules = ["lift 0.5", "lift 1.0", "LLR 0.2", "LLR 0.3", "LLR 0.4", "LLRlift 0.5",
             "LLRlift 1.0", "veto 0", "veto 0.25"]
    print(f"{len(rows)} replies to {len(groups)} prompts, {DRAWS} draws of {RATINGS}; right: "
          f"a style whose true lift is at least {RIGHT}\n")
    print(f"{'rater':>17} {'liked (true lift)':<44} "
          + " ".join(f"{r:>11}" for r in rules) + "   (right / wrong picks)")
    for name in raters:
        plain = [r["ratings"][name] for r in rows if r["asked"] is None]
        lift = {s: statistics.fmean(x) - statistics.fmean(plain) for s in styles
                if (x := [r["ratings"][name] for r in rows if r["asked"] == s])}
        liked = sorted((s for s in lift if lift[s] >= RIGHT), key=lambda s: -lift[s])
        rng = random.Random(SEED)
        counts = {rule: [0, 0] for rule in rules}
        for _ in range(DRAWS):
            served = []
            for g in rng.sample(sorted(groups), min(RATINGS, len(groups))):
                replies = groups[g]
                styled = [r for r in replies if r["asked"] is not None]
                served.append(rng.choice(styled) if styled and rng.random() < 0.5
                              else next(r for r in replies if r["asked"] is None))
            scores = [r["ratings"][name] for r in served]
            by_style: dict[str, list[int]] = {}
            for r in served:
                if r["asked"] is not None:
                    by_style.setdefault(r["asked"], []).append(r["ratings"][name])
            rated = StyleRatings(tuple(scores), {s: tuple(v) for s, v in by_style.items()})
            picks = {f"lift {m}": top_lifted(style_lifts(rated), m) for m in (0.5, 1.0)}
            corr = {s: spearman([r["llr"][s] / r["tokens"] for r in served], scores)
                    for s in styles}
            best = max(corr, key=corr.get)
            for t in (0.2, 0.3, 0.4):
                picks[f"LLR {t}"] = best if corr[best] >= t else None
            usual = usual_rating(rated)
            n = max(1, len(served) // 4)
            quarter = {s: [r["ratings"][name] for r in sorted(
                served, key=lambda r: -r["llr"][s] / r["tokens"])[:n]] for s in styles}
            llr_lift = {s: n / (n + PRIOR_RATINGS) * (statistics.fmean(v) - usual)
                        for s, v in quarter.items()}
            for m in (0.5, 1.0):
                picks[f"LLRlift {m}"] = top_lifted(llr_lift, m)
            lifted = picks["lift 0.5"]
            for v in (0, 0.25):     # the product's pick, kept only where the LLR lift agrees
                picks[f"veto {v}"] = lifted if lifted is not None and llr_lift[lifted] > v \
                    else None
            for rule, pick in picks.items():
                if pick is not None:
                    counts[rule][0 if lift.get(pick, 0.0) >= RIGHT else 1] += 1
        shown = ", ".join(f"{s.rstrip('.')[:18]} {lift[s]:+.1f}" for s in liked[:2]) or "none"
        print(f"{name:>17} {shown:<44} " + " ".join(
            f"{c[0] / DRAWS:>5.2f}/{c[1] / DRAWS:<5.2f}" for c in counts.values()))


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sample", "judge"):
        sys.exit(__doc__)
    folder = Path(sys.argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    {"sample": sample, "judge": judge}[sys.argv[1]](folder)

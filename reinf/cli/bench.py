"""``reinf bench learn``, ``reinf bench rating-model``, ``reinf bench round``, ``reinf bench
styles`` and ``reinf bench speed``: benchmarks, not tests (docs/benchmarks.md).

``reinf bench learn``'s defaults are ``LearnPlan``'s (reinf.bench.learn), read here, never
restated.
"""
import dataclasses
import os

import click

from reinf.bench.aggregate import lr_text
from reinf.bench.learn import BASELINES, LearnPlan
from reinf.bench.raters import NAMES, is_unseen
from reinf.bench.rating_study import PLAN as STUDY
from reinf.bench.round_study import PLAN as ROUND
from reinf.bench.style_study import StylePlan
from reinf.bench.text_raters import TEXT_RATERS
from reinf.cli.common import emit, json_option

PLAN = {f.name: f.default for f in dataclasses.fields(LearnPlan)}  # field -> its default
REAL_RATERS = (*TEXT_RATERS, "noisy-graded")
DEMO_RATERS = tuple(n for n in NAMES if n not in REAL_RATERS)


@click.group()
def bench():
    """Measure learning and speed (benchmarks, not tests; see docs/benchmarks.md)."""


def _threads(threads: int | None, config) -> int:
    """--threads, else schedule.train_threads, else torch's default; applied now."""
    import torch

    n = threads or config.schedule.train_threads or 0
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


@bench.command()
@click.option("--rater", default=PLAN["rater"], show_default=True,
              help=f"Built-in rater or FILE.py:function. For the demo model's styles: "
                   f"{', '.join(DEMO_RATERS)}. Over real text: {', '.join(REAL_RATERS)}. "
                   f"Used to choose defaults or compare settings, so not unseen: "
                   f"{', '.join(n for n in NAMES if not is_unseen(n))}.")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              default=PLAN["prompts"],
              help="Training prompts, .txt (one a line) or .jsonl ({\"prompt\": ...}) "
                   "[default: the built-in set's training side; the demo corpus on the demo "
                   "model]. Alone, it is split: about a quarter becomes the probe.")
@click.option("--probe-prompts", "probe_file", type=click.Path(dir_okay=False),
              default=PLAN["probe_prompts"],
              help="Probe prompts, .txt or .jsonl; any that is also a training prompt "
                   "(same text up to case, spaces and punctuation) is dropped.")
@click.option("--ratings", type=click.IntRange(1), default=PLAN["ratings"], show_default=True,
              help="Ratings per method and seed.")
@click.option("--train-after", type=click.IntRange(1), default=None,
              help="A round after every K new ratings [default: train_after_ratings, 8].")
@click.option("--seed", type=click.IntRange(0), default=PLAN["seed"], show_default=True,
              help="First seed of the rating streams.")
@click.option("--seeds", type=click.IntRange(1), default=PLAN["seeds"], show_default=True,
              help="Run every method on seeds SEED, SEED+1, ...; the report gives means over "
                   "seeds and their min-max.")
@click.option("--model", "model_path", default=None,
              help="Base model (model_path) [default: the configured one].")
@click.option("--baselines", show_default=True,
              default=",".join(m for m in PLAN["methods"] if m in BASELINES) or "none",
              help="Comma-separated: rated (Reinf's PPO on rated replies only, "
                   "training.method=rated), sft (reward-weighted SFT), kto (TRL's KTOTrainer, "
                   "once per --kto-lr), bestofn (no training: the base model's best of "
                   "--best-of replies by Reinf's rating model); or none.")
@click.option("--best-of", type=click.IntRange(2), default=PLAN["best_of"], show_default=True,
              help="bestofn: base-model replies sampled per probe prompt; the rating model "
                   "Reinf serves after each round keeps the best one (the first sample "
                   "while it has none it trusts).")
@click.option("--kto-lr", "kto_lrs", default=",".join(lr_text(lr) for lr in PLAN["kto_lrs"]),
              show_default=True,
              help="kto: learning rates, comma-separated; a separate KTO run on the same "
                   "stream for each, the goals compare Reinf with the best.")
@click.option("--window", type=click.IntRange(1), default=PLAN["window"], show_default=True,
              help="Ratings per reported window of live ratings.")
@click.option("--target", type=click.FloatRange(1, 5), default=PLAN["target"],
              show_default=True,
              help="Target probe mean rating (ratings to target, and held to the end).")
@click.option("--probe", type=click.IntRange(1), default=PLAN["probe"], show_default=True,
              help="Probe replies after every round (fixed prompts and sampling seeds).")
@click.option("--final-probe", type=click.IntRange(1), default=PLAN["final_probe"],
              show_default=True,
              help="Probe replies for the base model and the final measurement.")
@click.option("--heldout", type=click.IntRange(8), default=PLAN["heldout"], show_default=True,
              help="Held-out corpus items behind the perplexity change and the rating "
                   "model's held-out Spearman (fewer: a faster, noisier run).")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch CPU threads [default: train_threads, else torch's own].")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default="bench-learn.png",
              show_default=True, help="Where the plot goes (.svg without matplotlib).")
@click.option("--pairs-every", type=click.IntRange(0), default=PLAN["pairs_every"],
              show_default=True,
              help="Every Nth interaction the simulated person gives a pair instead of a "
                   "rating: another reply to the same message (regenerate), the better one "
                   "picked, a tie when rated the same. --ratings and the x axis then count "
                   "interactions. 0 = ratings only.")
@click.option("--rewrite-every", type=click.IntRange(0), default=PLAN["rewrite_every"],
              show_default=True,
              help="Of the replies the simulated person rates 2 or below, it also rewrites "
                   "every Nth: an edit of the reply toward its rule (bullets: the sentences "
                   "as a list), stored as `reinf rewrite` stores one. Raters that can: "
                   "bullets, length-graded, noisy-graded, no-question-back, no-exclamation, "
                   "arithmetic, context-length. Reinf alone (--baselines none). 0 = none.")
@click.option("--child", is_flag=True, default=PLAN["child"],
              help="Run Reinf's rounds in the daemon's child process (slower; default: in "
                   "this process).")
@click.option("--keep", is_flag=True, default=PLAN["keep"],
              help="Keep each run's temporary data directory.")
@click.option("--skip-reinf", is_flag=True,
              help="Run only the --baselines (not bestofn, which reads Reinf's run): to spread "
                   "one comparison over several processes or machines. The streams, the probe "
                   "and its seeds are the same as in a run with Reinf, so the figures line up "
                   "with Reinf's on the same seeds and device.")
@click.option("--merge", "merge_files", multiple=True, type=click.Path(dir_okay=False),
              metavar="FILE",
              help="Run nothing: pool the --json reports of runs that split one comparison "
                   "(by --seed, --baselines, --kto-lr, --skip-reinf) into one report, "
                   "figures and goals taken again over every seed (repeat for each file).")
@json_option
@click.pass_context
def learn(ctx, rater, prompts_file, probe_file, ratings, train_after, seed, seeds, model_path,
          baselines, best_of, kto_lrs, window, target, probe, final_probe, heldout, threads,
          plot_path, pairs_every, rewrite_every, child, keep, skip_reinf, merge_files,
          as_json):
    """Run the whole loop with a simulated rater, beside baselines on the same stream.

    Generate, rate, store, train every --train-after ratings, promote and hot-swap, as the
    daemon does; the same trainer on rated replies only; then reward-weighted SFT and TRL's
    KTOTrainer (once per --kto-lr); each on --seeds rating streams. Best-of-n trains nothing:
    after each of Reinf's rounds, the base model's best of --best-of replies by the rating
    model Reinf serves. After every round the policy answers --probe
    held-out prompts (never training prompts of the run): the rater's mean and preferred
    share there give the ratings to reach --target (first, and held to the end). Also
    reports the live windows, KL to the base, perplexity on the demo corpus's held-out
    slice, perplexity on general text (64 built-in passages, at the base and the end), the
    rating model's Spearman and each round's mode. Progress goes to stderr.
    --merge pools the reports of runs that split one comparison into one.
    """
    from reinf.bench.learn import format_prompts
    from reinf.bench.plot import format_table, save_plot

    if merge_files:
        report = _merged(ctx, merge_files)
    else:
        report = _run_learn(ctx.obj, rater, prompts_file, probe_file, ratings, train_after,
                            seed, seeds, model_path, baselines, best_of, kto_lrs, window,
                            target, probe, final_probe, heldout, threads, pairs_every,
                            rewrite_every, child, keep, skip_reinf)
    report["plot"] = str(save_plot(report, plot_path))
    emit(report, as_json, lambda r: click.echo(
        f"{format_table(r)}\n\n{format_prompts(r)}\nplot: {r['plot']}"))


def _merged(ctx, files) -> dict:
    """``bench learn --merge``: the reports read, checked and pooled (merge_reports)."""
    import json

    from reinf.bench.learn import merge_reports
    from reinf.errors import BadInput

    running = [f"--{name.replace('_', '-')}" for name in ctx.params
               if name not in ("merge_files", "plot_path", "as_json")
               and ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
    if running:
        raise BadInput(f"--merge runs nothing, so {', '.join(running)} would do nothing",
                       fix="leave them out; the merged runs' own settings are in their reports")
    reports = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                reports.append((path, json.load(f)))
        except OSError as e:
            raise BadInput(f"cannot read {path}: {e.strerror or e}",
                           fix="pass the files `reinf bench learn --json` wrote") from None
        except ValueError as e:
            raise BadInput(f"{path} is not JSON ({e})",
                           fix="pass the JSON that `reinf bench learn --json` printed "
                               "(a run cut off before its end prints nothing)") from None
    return merge_reports(reports)


def _run_learn(app, rater, prompts_file, probe_file, ratings, train_after, seed, seeds,
               model_path, baselines, best_of, kto_lrs, window, target, probe, final_probe,
               heldout, threads, pairs_every, rewrite_every, child, keep,
               skip_reinf) -> dict:
    from reinf.bench.learn import run_learn
    from reinf.errors import BadInput

    chosen = list(dict.fromkeys(b.strip() for b in baselines.split(",")
                                if b.strip() and b.strip() != "none"))
    unknown = [b for b in chosen if b not in BASELINES]
    if unknown:
        raise BadInput(f"unknown baseline {unknown[0]!r}",
                       fix="--baselines takes a comma list of rated, sft, kto and bestofn, "
                           "or none")
    try:
        rates = tuple(float(r) for r in kto_lrs.split(",") if r.strip())
    except ValueError:
        raise BadInput(f"--kto-lr takes comma-separated learning rates, got {kto_lrs!r}",
                       fix="pass --kto-lr 5e-6,1e-4,1e-3") from None
    app.override(model_path=model_path)
    config = app.config
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _threads(threads, config)
    plan = LearnPlan(rater=rater, ratings=ratings, train_after=train_after or 0, seed=seed,
                     seeds=seeds, window=window, target=target, probe=probe,
                     final_probe=final_probe, heldout=heldout,
                     methods=tuple(chosen) if skip_reinf else ("reinf", *chosen),
                     child=child, keep=keep, prompts=prompts_file, probe_prompts=probe_file,
                     pairs_every=pairs_every, rewrite_every=rewrite_every, best_of=best_of,
                     kto_lrs=rates)
    return run_learn(config, plan)


@bench.command()
@click.option("--models", default="demo,0.5b", show_default=True,
              help="Comma-separated: demo (the configured model, model_path) and/or 0.5b (a "
                   "random Qwen2.5-0.5B-shaped model); left out with --model unless given.")
@click.option("--model", "model_paths", multiple=True, metavar="PATH",
              help="Measure this model instead: a local directory or hub id, any causal LM "
                   "(repeatable, or comma-separated).")
@click.option("--turns", type=click.IntRange(2), default=64, show_default=True,
              help="Rated turns of the PPO round (demo model and --model under 100M "
                   "parameters).")
@click.option("--turns-0.5b", "turns_large", type=click.IntRange(2), default=8,
              show_default=True, help="Rated turns of the PPO round on the 0.5B shape and on "
                                      "a --model of 100M parameters or more (a 64-turn round "
                                      "on 0.5B takes about 14 minutes on 2 cores).")
@click.option("--quick", is_flag=True, help="Small and fast: demo only unless --models or "
                                            "--model says otherwise, 16 turns, fewer "
                                            "repeats.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch CPU threads [default: train_threads, else torch's own].")
@json_option
@click.pass_context
def speed(ctx, models, model_paths, turns, turns_large, quick, threads, as_json):
    """Time to first token, tokens/s, batched rollout sampling, swap pause, PPO round time
    and memory, as ratios.

    Each model is measured in its own process, so peak memory is its own. Batched sampling is
    the trainer's rollout sampler at training.rollout_batch_size replies at once, in tokens/s
    against the engine's single stream. The report names each model's path and parameter
    count.
    """
    from reinf.bench.speed import MODELS, format_speed, run_speed
    from reinf.errors import BadInput

    app = ctx.obj
    paths = [p.strip() for value in model_paths for p in value.split(",") if p.strip()]
    if ctx.get_parameter_source("models") == click.core.ParameterSource.DEFAULT:
        models = "" if paths else "demo" if quick else models
    named = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in named if m not in MODELS]
    if unknown:
        raise BadInput(f"unknown model {unknown[0]!r} for --models",
                       fix="--models takes demo and/or 0.5b; measure another model with "
                           f"--model {unknown[0]}")
    names = named + paths
    report = run_speed(app.config, names, turns=16 if quick else turns,
                       turns_large=turns_large, quick=quick, threads=threads)
    emit(report, as_json, lambda r: click.echo(format_speed(r)))


@bench.command("rating-model")
@click.option("--rater", "raters", default="real", show_default=True,
              help="Comma list of raters (`reinf bench learn --help` lists them; a "
                   "FILE.py:function too), or `real` (every rater over real text) or `unseen` "
                   "(those that chose no default).")
@click.option("--model", "model_path", default=None,
              help="The model whose replies and features are used [default: model_path].")
@click.option("--prompts", type=click.IntRange(2), default=STUDY["prompts"], show_default=True,
              help="Training-side prompts to sample replies for.")
@click.option("--replies", type=click.IntRange(2), default=STUDY["replies"], show_default=True,
              help="Replies sampled for each prompt.")
@click.option("--ratings", default=",".join(map(str, STUDY["ratings"])), show_default=True,
              help="Comma list of how many ratings the rating model is fitted on.")
@click.option("--draws", type=click.IntRange(1), default=STUDY["draws"], show_default=True,
              help="Random draws of the rated prompts for each number of ratings.")
@click.option("--seed", type=click.IntRange(0), default=STUDY["seed"], show_default=True,
              help="Seed of the prompts, the sampling and the draws.")
@click.option("--pairs-every", type=click.IntRange(0), default=0, show_default=True,
              help="Also judge each draw with every Kth interaction a pick between two "
                   "replies to its prompt instead of a rating (regenerate's pairs); 0 = off.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch CPU threads [default: schedule.train_threads, else torch's own].")
@json_option
@click.pass_obj
def rating_model(app, raters, model_path, prompts, replies, ratings, draws, seed, pairs_every,
                 threads, as_json):
    """How well the rating model orders replies it never saw, by how many ratings it has had.

    Samples --replies replies to each of --prompts training-side prompts from the model
    (no adapter) once, then for each rater and each number of --ratings fits the trainer's
    rating model on one reply of that many prompts and judges it on the other prompts: the
    share of pairs of replies to one prompt it orders as the rater does (what a rollout
    round's RLOO uses), its Spearman beside the ceiling, and its own cross-validated
    Spearman. Trains nothing; minutes, not hours. Progress goes to stderr.
    """
    from reinf.bench.rating_study import format_study, run_rating_study
    from reinf.errors import BadInput

    expanded = _expand_raters(raters)
    counts = _numbers(ratings, int)
    if not counts or counts[0] < 2:
        raise BadInput(f"--ratings takes a comma list of counts of at least 2, got {ratings!r}",
                       fix="pass --ratings 16,32,48")
    app.override(model_path=model_path)
    config = app.config
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _threads(threads, config)
    report = run_rating_study(config, expanded, prompts=prompts,
                              replies=replies, ratings=counts, draws=draws, seed=seed,
                              pairs_every=pairs_every)
    emit(report, as_json, lambda r: click.echo(format_study(r)))


def _expand_raters(raters: str) -> list[str]:
    """A comma list of raters with `real` and `unseen` expanded, each once; any other name
    is load_rater's to check."""
    expanded = []
    for name in (r.strip() for r in raters.split(",") if r.strip()):
        if name == "real":
            expanded += REAL_RATERS
        elif name == "unseen":
            expanded += [r for r in REAL_RATERS if is_unseen(r)]
        else:
            expanded.append(name)
    return list(dict.fromkeys(expanded))


@bench.command("round")
@click.option("--rater", "raters", default="unseen", show_default=True,
              help="Comma list of raters (as for `reinf bench rating-model`: a name, "
                   "FILE.py:function, `real` or `unseen`).")
@click.option("--arm", "arms", multiple=True,
              help="A way to train the round: `rated` (the rated replies alone), `rollouts` "
                   "(fresh rollouts whatever the rating model's consistency), `styled` (the "
                   "same, with 2 of each prompt's replies asked for in a style: "
                   "training.styled_rollouts), `explore` (`styled`, with half the rated "
                   "replies served in a style: explore_styles), `rated-v1` (the "
                   "first version's method), the baselines `sft`, `kto` (TRL's 5e-6) and "
                   "`kto@LR` (KTO at rate LR), or NAME:key=value,... (config overrides, e.g. "
                   "r8:training.min_consistency=-1,training.rollouts_per_prompt=8). Repeat for several "
                   "[default: rated and rollouts].")
@click.option("--model", "model_path", default=None,
              help="The model to train and judge [default: model_path].")
@click.option("--ratings", type=click.IntRange(2), default=ROUND["ratings"], show_default=True,
              help="Ratings before the round (training-side prompts, the model's replies).")
@click.option("--prompts", type=click.IntRange(1), default=ROUND["prompts"], show_default=True,
              help="Other training-side prompts whose replies judge the round.")
@click.option("--replies", type=click.IntRange(2), default=ROUND["replies"], show_default=True,
              help="Held-out replies sampled for each of those prompts.")
@click.option("--seed", type=click.IntRange(0), default=ROUND["seed"], show_default=True,
              help="Seed of the prompts and the sampling.")
@click.option("--threads", type=click.IntRange(1), default=None,
              help="torch CPU threads [default: schedule.train_threads, else torch's own].")
@click.option("--resample", is_flag=True,
              help="Also answer the held-out prompts afresh with each round's adapter and "
                   "rate the replies (a sampling pass an arm): sees replies the base "
                   "almost never writes, which the estimate cannot.")
@json_option
@click.pass_obj
def round_(app, raters, arms, model_path, ratings, prompts, replies, seed, threads, resample,
           as_json):
    """Which way one training round moves the model, in minutes instead of a learning run's hours.

    For each rater and arm: --ratings replies of the model rated, one real round, then the
    round's change in the log-probability of held-out replies (to other prompts, sampled
    once) set against the rater's scores: the share of pairs of replies to one prompt whose
    better reply the round made relatively more likely (0.50 = no direction), and the mean
    rating the new policy would get, estimated by importance weighting. Progress goes to
    stderr.
    """
    from reinf.bench.round_study import format_round_study, parse_arm, run_round_study
    from reinf.errors import BadInput

    chosen = [parse_arm(a) for a in (arms or ("rated", "rollouts"))]
    names = [name for name, _ in chosen]
    if len(set(names)) != len(names):
        raise BadInput(f"arm names repeat: {', '.join(names)}",
                       fix="give each --arm its own NAME")
    app.override(model_path=model_path)
    config = app.config
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    _threads(threads, config)
    report = run_round_study(config, _expand_raters(raters), chosen, ratings=ratings,
                             prompts=prompts, replies=replies, seed=seed, resample=resample)
    emit(report, as_json, lambda r: click.echo(format_round_study(r)))


STYLES = {f.name: f.default for f in dataclasses.fields(StylePlan)}
_P = click.FloatRange(0, 1)


@bench.command("styles")
@click.option("--liked", default="Use a bulleted list.", show_default=True,
              help="The style the simulated person likes: an instruction of the list, its "
                   "number in it (1 = the first), or `none`.")
@click.option("--base", type=_P, default=STYLES["base"], show_default=True,
              help="P(a 5) for a plain reply or one in another style.")
@click.option("--liked-p", type=_P, default=STYLES["liked_p"], show_default=True,
              help="P(a 5) for a reply that followed the liked style.")
@click.option("--follow", type=_P, default=STYLES["follow"], show_default=True,
              help="P(the model followed the instruction it was given).")
@click.option("--share", type=_P, default=STYLES["share"], show_default=True,
              help="explore_styles: the share of replies asked for in a style.")
@click.option("--ratings", default=",".join(map(str, STYLES["ratings"])), show_default=True,
              help="Comma list of the numbers of ratings a round reads them at (at most 48).")
@click.option("--margins", default=",".join(map(str, STYLES["margins"])), show_default=True,
              help="Comma list of training.imitate_styled margins to read.")
@click.option("--posteriors", default=",".join(map(str, STYLES["posteriors"])),
              show_default=True,
              help="Comma list of thresholds for the rule that knows the person (the "
                   "probability that the likeliest style is the liked one); `none` for none.")
@click.option("--draws", type=click.IntRange(1), default=STYLES["draws"], show_default=True,
              help="Simulated people for each case.")
@click.option("--seed", type=click.IntRange(0), default=STYLES["seed"], show_default=True,
              help="Seed of the draws.")
@json_option
@click.pass_obj
def styles_(app, liked, base, liked_p, follow, share, ratings, margins, posteriors, draws, seed,
            as_json):
    """How often imitate_styled would imitate the liked style, and how often another one.

    Simulates a person rating 48 replies, a --share of them asked for in a style the
    product's own sampler picks (explore_pick: ratings), and reads, at each of --ratings,
    the style lifts a rated round reads (training.styles_file's list). Trains and samples
    nothing; seconds. Prints the share of draws imitating the liked style / another one,
    by margin, beside the same person with no liked style, and the same for the Bayes rule
    that knows the person's P(5)s (--posteriors): the best any rule on those ratings does.
    """
    from reinf.bench.style_study import format_style_study, run_style_study
    from reinf.errors import BadInput
    from reinf.training.styles import load_styles

    styles = load_styles(app.config.training.styles_file)
    chosen = None if liked.strip().lower() == "none" else liked.strip()
    if chosen is not None and chosen.isdigit():
        if not 1 <= int(chosen) <= len(styles):
            raise BadInput(f"--liked {liked}: the list has {len(styles)} styles",
                           fix=f"pass a number from 1 to {len(styles)}, a style, or none")
        chosen = styles[int(chosen) - 1]
    if chosen is not None and chosen not in styles:
        raise BadInput(f"--liked {liked!r} is not one of the styles",
                       fix="pass one of training.styles_file's lines, its number, or none")
    cuts = _numbers(margins, float)
    if not cuts:
        raise BadInput(f"--margins takes a comma list of numbers, got {margins!r}",
                       fix="pass --margins 0.5,1.0")
    no_posteriors = posteriors.strip().lower() == "none"
    knowing = [] if no_posteriors else _numbers(posteriors, float)
    if not no_posteriors and (not knowing or knowing[0] <= 0 or knowing[-1] > 1):
        raise BadInput(f"--posteriors takes probabilities above 0, at most 1, got "
                       f"{posteriors!r}", fix="pass --posteriors 0.1,0.5 or none")
    counts = _numbers(ratings, int)
    if not counts or counts[0] < 1 or counts[-1] > STYLES["total"]:
        raise BadInput(f"--ratings takes counts from 1 to {STYLES['total']}, got {ratings!r}",
                       fix="pass --ratings 24,32,40")
    plan = StylePlan(liked=chosen, base=base, liked_p=liked_p, follow=follow, share=share,
                     ratings=tuple(counts), margins=tuple(cuts), posteriors=tuple(knowing),
                     draws=draws, seed=seed)
    report = run_style_study(plan, styles)
    emit(report, as_json, lambda r: click.echo(format_style_study(r)))


def _numbers(text: str, kind) -> list:
    """A comma list of numbers (``kind``: int or float), sorted and each once; empty when
    it is not one (the option's own check names the problem)."""
    try:
        return sorted({kind(x) for x in text.split(",") if x.strip()})
    except ValueError:
        return []


COMMANDS = [bench]

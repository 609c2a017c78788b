"""How ``reinf bench learn`` shows its report: a plain-text table and a plot.

Every figure is a mean over seeds; where there is room, its min-max over seeds follows in
brackets: "4.10 (3.80–4.40)". The plot has two panels against the number of ratings: the
probe mean rating after each round (the mean over seeds, a band from min to max) and the KL
to the base per token, one line per method. It is a PNG through matplotlib (Agg, no display
needed); without matplotlib it is an SVG written by hand.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from reinf.bench.aggregate import GOAL_RISE, PROBE_FALL

COLOURS = {"reinf": "#1f77b4", "rated": "#9467bd", "sft": "#ff7f0e", "kto": "#2ca02c",
           "bestofn": "#d62728"}
KTO_GREENS = ("#2ca02c", "#17becf", "#8c564b", "#bcbd22", "#7f7f7f")  # a KTO sweep, in order


def colour(name: str, names) -> str | None:
    """A method's colour; the runs of a KTO learning-rate sweep get one each."""
    if name.startswith("kto@"):
        sweep = [n for n in names if n.startswith("kto@")]
        return KTO_GREENS[sweep.index(name) % len(KTO_GREENS)]
    return COLOURS.get(name)


def _num(value: Any, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def _agg(a: dict | None, fmt: str, missing: str = "-") -> str:
    """An aggregate over seeds as "mean (min–max)", or the mean alone when they agree."""
    if not a or a["mean"] is None:
        return missing
    if a["n"] < 2 or format(a["min"], fmt) == format(a["max"], fmt):
        return format(a["mean"], fmt)
    return f"{a['mean']:{fmt}} ({a['min']:{fmt}}–{a['max']:{fmt}})"


def _reach(a: dict, missing: str) -> str:
    """Ratings to a target over seeds: the mean when every seed reached it, else how many
    seeds did."""
    if a["mean"] is not None:
        return _agg(a, ".0f")
    if not a["n"]:
        return missing
    return f"{a['n']}/{len(a['values'])} seeds: {a['min']}–{a['max']}"


def _mean(a: dict | None, fmt: str, missing: str = "-") -> str:
    return missing if not a or a["mean"] is None else format(a["mean"], fmt)


def unit(report: dict) -> str:
    """What the x axis counts: ratings, or interactions when some of them are pairs
    (``--pairs-every``)."""
    return "interactions" if (report.get("plan") or {}).get("pairs_every") else "ratings"


def explored_lines(methods: dict) -> list[str]:
    """For each seed of a method whose replies explored styles (generation.explore_styles):
    how many rated replies were asked for in a style, their mean rating against the plain
    ones', and the three styles asked for most (count, mean rating)."""
    lines = []
    for m, method in methods.items():
        for run in method.get("seeds") or []:
            e = run.get("explored")
            if not e:
                continue
            plain = "-" if e["plain_mean"] is None else f"{e['plain_mean']:.2f}"
            top = ", ".join(f'"{style}" {n} ({mean:.1f})'
                            for style, (n, mean) in list(e["by_style"].items())[:3])
            lines.append(f"  explored ({m}, seed {run['seed']}): {e['styled']} of "
                         f"{len(run['scores'])} rated replies asked for in a style, mean "
                         f"{e['styled_mean']:.2f} against {plain} plain; most asked {top}")
    return lines


def format_table(report: dict) -> str:
    plan, methods = report["plan"], report["methods"]
    names = list(methods)
    seeds = report["seeds"]
    rater = report["rater"]
    x = unit(report)
    lines = [f"reinf bench learn: rater {rater['name']} ({rater['description']})",
             f"  {plan['ratings']} {x} a run, a round after every {plan['train_after']}, "
             f"{len(seeds)} seed(s) ({', '.join(map(str, seeds))}); target probe mean "
             f"{plan['target']}",
             f"  probe: {plan['probe']} fixed prompts and sampling seeds after every round "
             f"({max(plan['probe'], plan['final_probe'])} for the base and the end)",
             *([f"  rewrites: every {plan['rewrite_every']} reply rated 2 or below is "
                f"rewritten by the simulated person ("
                + ", ".join(str(s.get("rewrites")) for s in methods["reinf"]["seeds"])
                + " rewrites by seed)"] if plan.get("rewrite_every") and "reinf" in methods
               else []),
             *explored_lines(methods),
             f"  model {report['model']['name']} ({report['model']['parameters']:,} parameters)",
             f"  machine: {report['machine']}"]
    for m in names:
        s = methods[m].get("settings") or {}
        lines.append(f"  {m}: {methods[m]['label']}" + "".join(
            f"{'; ' if i == 0 else ', '}{k} {v}" for i, (k, v) in enumerate(s.items())))
    head = f"{x:>12} | " + " | ".join(f"{methods[m]['label'][:28]:<28}" for m in names)
    lines += ["", "Probe curve after each round, mean over seeds (min–max): probe mean rating, "
              "preferred share, general-text perplexity", head, "-" * len(head)]
    curves = {m: {p["ratings"]: p for p in methods[m]["curve"]} for m in names}
    for n in sorted({n for c in curves.values() for n in c}):
        cells = []
        for m in names:
            p = curves[m].get(n)
            cells.append(f"{_agg(p and p['probe_mean_rating'], '.2f'):<16}"
                         f"{_mean(p and p['probe_preferred_share'], '.0%'):>5}"
                         f"{_mean(p and p.get('perplexity_general'), '.1f'):>7}")
        lines.append(f"{'base' if n == 0 else n:>12} | " + " | ".join(cells))
    cell = "{:>4} {:>4} {:>6} {:>5} {:>5}"
    sub = f"{'':>12} | " + " | ".join(f"{cell.format('mean', 'pref', 'KL', 'ppl', 'pplP'):<28}"
                                       for _ in names)
    lines += ["", "Live windows of ratings, mean over seeds: mean rating and preferred share of "
              "the window; KL (per token),", "ppl (held-out corpus) and pplP (its replies in the "
              "preferred style) of the policy at the window's end", head, sub, "-" * len(sub)]
    for i, w0 in enumerate(methods[names[0]]["windows"]):
        row = []
        for m in names:
            w = methods[m]["windows"][i]
            # the base row shows the probe; best-of-n has no live ratings ("-")
            base = w0["ratings"] == 0
            mean = w["mean_rating"] if w["mean_rating"]["mean"] is not None or not base \
                else w["probe_mean_rating"]
            share = w["preferred_share"] if w["preferred_share"]["mean"] is not None \
                or not base else w["probe_preferred_share"]
            text = cell.format(_mean(mean, ".2f"), _mean(share, ".0%"), _mean(w["kl"], ".4f"),
                               _mean(w["perplexity"], ".3f"),
                               _mean(w["perplexity_preferred"], ".3f"))
            row.append(f"{text:<28}")
        label = "base" if w0["ratings"] == 0 else str(w0["ratings"])
        lines.append(f"{label:>12} | " + " | ".join(row))
    final_n = max(plan["probe"], plan["final_probe"])
    rows = [
        (f"{x} to target", lambda s: _reach(s["ratings_to_target"], "not reached")),
        (f"{x} to target, held", lambda s: _reach(s["ratings_to_target_held"], "not held")),
        ("time to target, held (s)", lambda s: _agg(s["seconds_to_target_held"], ".0f")),
        ("live window, held", lambda s: _reach(s["window_ratings_to_target_held"], "not held")),
        (f"final probe ({final_n}) mean", lambda s: _agg(s["final_probe_mean_rating"], ".2f")),
        (f"final probe ({final_n}) pref", lambda s: _agg(s["final_probe_preferred_share"],
                                                         ".0%")),
        ("final KL / token", lambda s: _agg(s["final_kl"], ".4f")),
        ("final perplexity", lambda s: _agg(s["final_perplexity"], ".3f")),
        ("  change", lambda s: _agg(s["perplexity_change"], "+.1%")),
        ("final ppl, preferred style", lambda s: _agg(s["final_perplexity_preferred"], ".3f")),
        ("  change", lambda s: _agg(s["perplexity_preferred_change"], "+.1%")),
        ("final ppl, general text", lambda s: _agg(s.get("final_perplexity_general"), ".3f")),
        ("  change", lambda s: _agg(s.get("perplexity_general_change"), "+.1%")),
        ("rating model Spearman, last", lambda s: _agg(s["rating_model_consistency_last"],
                                                        ".2f")),
        (f"probe falls >= {PROBE_FALL} a round", lambda s: _agg(s.get("probe_falls"), ".3g")),
        ("rounds rollouts / rated", lambda s: "-" if s["rounds_rollouts"]["mean"] is None else
         f"{s['rounds_rollouts']['mean']:.3g} / {s['rounds_rated']['mean']:.3g}"),
        ("rounds ok (rejected)", lambda s: f"{_mean(s['rounds_succeeded'], '.3g')} "
                                           f"({_mean(s['rounds_rejected'], '.3g')})"),
        ("round time (s)", lambda s: _agg(s["round_seconds"], ".1f")),
        ("swap pause, median ms", lambda s: _agg(s["swap_pause_ms_median"], ".1f")),
        ("loop time (s)", lambda s: _agg(s["loop_seconds"], ".0f")),
        ("probe + measure time (s)", lambda s: f"{_mean(s['probe_seconds'], '.0f')} + "
                                               f"{_mean(s['measure_seconds'], '.0f')}")]
    lines += ["", f"{'mean over seeds (min–max)':<30}" + "".join(
        f"{methods[m]['label'][:25]:>26}" for m in names)]
    for title, fn in rows:
        lines.append(f"{title:<30}" + "".join(f"{fn(methods[m]['summary']):>26}"
                                              for m in names))
    lines += _bestofn_lines(report) + _kto_lines(report)
    lines += ["", "Rating model, cross-validated Spearman by round (mean over seeds; '-' where "
              "the method has none; best-of-n: the model it reranked with):"]
    w = max(6, *(len(m) for m in names))
    for m in names:
        curve = methods[m]["curve"][1:]
        values = [f"{p['ratings']}:{_mean(p['rating_model_consistency'], '.2f')}" for p in curve]
        has = any(p["rating_model_consistency"]["mean"] is not None for p in curve)
        lines.append(f"  {m:<{w}} " + (" ".join(values) if has else "-"))
    lines.append("Round modes (R rollouts, r rated; x rejected, ! failed; best-of-n: B reranked, "
                 "1 the first sample), one letter a round:")
    for m in names:
        for run in methods[m]["seeds"]:
            lines.append(f"  {m:<{w}} seed {run['seed']}: " + "".join(
                _letter(r) for r in run["rounds"]))
    lines += _goal_lines(report.get("goals") or {})
    lines.append(f"\ntotal {report['seconds']:.0f} s")
    return "\n".join(lines)


def _letter(rnd: dict) -> str:
    if rnd["status"] == "failed":
        return "!"
    if rnd["status"] == "rejected":
        return "x"
    return {"rollouts": "R", "rated": "r", "reranked": "B",
            "first sample": "1"}.get(rnd.get("mode"), ".")


def _bestofn_lines(report: dict) -> list[str]:
    """Best-of-n's cost (seconds) and what its rating model changed."""
    m = report["methods"].get("bestofn")
    if not m:
        return []
    c = m.get("cost") or {}
    n = c.get("n") or (m.get("settings") or {}).get("n") or "n"
    points = [p for r in m["seeds"] for p in r["curve"][1:]]
    reranked = [p for p in points if p.get("mode") == "reranked"]
    moved = [p["chosen_not_first_share"] for p in reranked]
    lines = ["", f"Best-of-{n} at serve time (the base model, no training; each point reranked by "
             "the rating model of the checkpoint Reinf serves there, the first sample before "
             "it has one it trusts):"]
    if c:
        lines.append(
            f"  cost: {c['samples']} replies ({n} x {c['replies']} probe prompts) sampled in "
            f"{c['sample_seconds']:.1f} s (one sample each: {c['one_sample_seconds']:.1f} s) + "
            f"features {c['feature_seconds']:.1f} s = {c['seconds']:.1f} s, "
            + (f"{c['ratio_to_one_sample']:.1f}x one sample; "
               if c.get("ratio_to_one_sample") else "")
            + "sampled once per run (base model and seeds fixed) and reused by every seed "
              "and round")
    lines.append(f"  points reranked: {len(reranked)} of {len(points)}"
                 + (f"; kept a reply other than the first sample for "
                    f"{statistics.fmean(moved):.0%} of probe prompts" if moved else ""))
    return lines


def _kto_lines(report: dict) -> list[str]:
    """The KTO learning-rate sweep: every rate's held target and final probe mean, and the
    best (the one the goals compare with)."""
    from reinf.bench.aggregate import best_kto, kto_rate, lr_text

    methods = report["methods"]
    sweep = [m for m in methods if m.startswith("kto@")]
    if not sweep:
        return []
    best = best_kto(methods)
    x = unit(report)
    def held(a: dict) -> str:
        return f"held the target from {_reach(a, '')} {x}" if a["n"] else "never held the target"
    parts = [f"lr {lr_text(kto_rate(m, ()))}: "
             f"{held(methods[m]['summary']['ratings_to_target_held'])}, final probe mean "
             f"{_agg(methods[m]['summary']['final_probe_mean_rating'], '.2f')}"
             + (" (best)" if m == best else "") for m in sweep]
    return ["", f"KTO learning-rate sweep ({len(sweep)} runs on the same stream; the goals use "
            f"the best, {best}): " + "; ".join(parts)]


def _goal_lines(g: dict) -> list[str]:
    if not g:
        return []

    def box(goal: dict) -> str:
        return "[x]" if goal["met"] else "[ ]"
    rise, share, ppl = g["rise_by_48"], g["share_by_96"], g["perplexity_preferred"]
    general = g.get("perplexity_general")   # None in reports older than the figure
    fewer, rm = g["fewer_ratings_than_baselines"], g["rating_model_after_48"]
    others = [f"{m}{' (best KTO)' if m == fewer.get('kto_best') and m != 'kto' else ''} "
              f"{_num(v['mean'], '.0f', 'not held in every seed')}"
              + ("" if v["mean"] is not None else f" (>= {v['bound']:.0f})")
              for m, v in fewer.items() if m not in ("reinf", "met", "kto_best")]
    return [
        "", "Goals (default config, Reinf; means over seeds):",
        f"  {box(rise)} probe mean +1.0 over the base by 48 ratings: base "
        f"{rise['base_mean']:.2f}, after 48 {_agg(rise['mean_at_48'], '.2f')}"
        + (f" (at most +{rise['possible']:.2f} possible: the rater gives some probe prompts "
           "3 whatever the reply)"
           if rise.get("possible") is not None and rise["possible"] < GOAL_RISE else ""),
        f"  {box(share)} preferred share >= 90% by 96 ratings: base {share['base_share']:.0%}, "
        f"after 96 {_agg(share['share_at_96'], '.0%')}",
        *([f"  {box(general)} perplexity on held-out general text +5% at most: "
           f"{_agg(general['change'], '+.1%')}"] if general else []),
        f"  {box(ppl)} held-out perplexity on the demo corpus's preferred-style replies +5% at "
        f"most: {_agg(ppl['change'], '+.1%')} (all its replies "
        f"{_agg(ppl['overall_change'], '+.1%')})",
        f"  {box(fewer)} fewer ratings to the held target than every baseline: reinf "
        f"{_num(fewer['reinf'], '.0f', 'not held in every seed')}; " + ", ".join(others),
        f"  {box(rm)} rating model Spearman >= 0.8 at the first round after 48 ratings: "
        f"{_agg(rm['spearman'], '.2f')}"
        + (f"; a perfect predictor of those ratings: {_agg(rm['ceiling'], '.2f')}"
           if (rm.get("ceiling") or {}).get("mean") is not None else "")]


def series(report: dict) -> dict[str, dict[str, list[float]]]:
    """Per method: x (ratings), the probe mean rating after each round (mean over seeds, with
    its min and max as lo and hi), and the KL to the base."""
    out = {}
    for name, r in report["methods"].items():
        curve = r["curve"]
        out[name] = {"label": r["label"], "x": [p["ratings"] for p in curve],
                     "mean": [p["probe_mean_rating"]["mean"] for p in curve],
                     "lo": [p["probe_mean_rating"]["min"] for p in curve],
                     "hi": [p["probe_mean_rating"]["max"] for p in curve],
                     "kl": [p["kl"]["mean"] for p in curve]}   # None: best-of-n's, no policy
    return out


def save_plot(report: dict, path: str | Path) -> Path:
    """Probe mean rating and KL against ratings, one line per method. PNG via matplotlib when
    it is installed, else SVG (the suffix is changed to .svg)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = series(report)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path = path.with_suffix(".svg")
        path.write_text(build_svg(data, report), encoding="utf-8")
        return path
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    for name, s in data.items():
        c = colour(name, data)
        left.plot(s["x"], s["mean"], marker="o", ms=3, label=s["label"], color=c)
        left.fill_between(s["x"], s["lo"], s["hi"], color=c, alpha=0.15, lw=0)
        kl = [(x, y) for x, y in zip(s["x"], s["kl"]) if y is not None]
        if kl:
            right.plot(*zip(*kl), marker="o", ms=3, label=s["label"], color=c)
    left.axhline(report["plan"]["target"], color="grey", lw=0.8, ls="--", label="target")
    seeds = len(report.get("seeds") or [0])
    left.set(xlabel=unit(report), ylabel=f"probe mean rating ({report['plan']['probe']} prompts)",
             ylim=(0.8, 5.2), title=f"rater: {report['rater']['name']}; mean of {seeds} "
                                    "seed(s), band min–max")
    right.set(xlabel=unit(report), ylabel="KL to base (nats / token)", title="KL to the base")
    left.legend(fontsize=8, loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def build_svg(data: dict, report: dict, width: int = 900, height: int = 360) -> str:
    """The same two panels as a hand-written SVG (no matplotlib): a line per method and
    panel, and the min-max band where the series has one."""
    pw, ph, pad = width / 2 - 60, height - 80, 50
    xmax = max(max(s["x"]) for s in data.values()) or 1
    kmax = max((y for s in data.values() for y in s["kl"] if y is not None), default=0) or 1e-3
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" '
             'fill="white"/>']
    for k, (key, lo, hi, title) in enumerate((("mean", 1.0, 5.0, "probe mean rating"),
                                               ("kl", 0.0, kmax, "KL to base (nats/token)"))):
        ox = pad + k * (width / 2)

        def xy(x: float, y: float) -> str:
            return f"{ox + x / xmax * pw:.1f},{20 + ph - (y - lo) / (hi - lo) * ph:.1f}"
        parts.append(f'<rect x="{ox}" y="20" width="{pw}" height="{ph}" fill="none" '
                     'stroke="#888"/>')
        parts.append(f'<text x="{ox}" y="14">{title} vs {unit(report)} (0-{xmax}); '
                     f'y {lo:.3g}-{hi:.3g}</text>')
        for i, (name, s) in enumerate(data.items()):
            c = colour(name, data) or "#444"
            if key == "mean" and s.get("lo") and s.get("hi"):
                band = [xy(x, y) for x, y in zip(s["x"], s["hi"])] + \
                       [xy(x, y) for x, y in reversed(list(zip(s["x"], s["lo"])))]
                parts.append(f'<polygon points="{" ".join(band)}" fill="{c}" '
                             'fill-opacity="0.15" stroke="none"/>')
            pts = " ".join(xy(x, y) for x, y in zip(s["x"], s[key]) if y is not None)
            if pts:  # best-of-n has no KL: no policy moved
                parts.append(f'<polyline points="{pts}" fill="none" stroke="{c}" '
                             'stroke-width="2"/>')
            if k == 0:
                parts.append(f'<text x="{ox + 8}" y="{40 + 14 * i}" fill="{c}">'
                             f'{s["label"]}</text>')
    parts.append(f'<text x="{pad}" y="{height - 10}">rater: {report["rater"]["name"]}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"

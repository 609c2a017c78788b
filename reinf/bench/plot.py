"""How ``reinf bench learn`` shows its report: a plain-text table and a plot.

The plot has two panels against the number of ratings: the mean rating of each window, and
the KL to the base per token, one line per method. It is a PNG through matplotlib (Agg, no
display needed); without matplotlib it is an SVG written by hand.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"reinf": "#1f77b4", "sft": "#ff7f0e", "kto": "#2ca02c"}


def _num(value: Any, fmt: str, missing: str = "-") -> str:
    return missing if value is None else format(value, fmt)


def format_table(report: dict) -> str:
    plan, methods = report["plan"], report["methods"]
    names = list(methods)
    lines = [f"reinf bench learn: rater {report['rater']['name']} ({report['rater']['description']})",
             f"  {plan['ratings']} ratings, a round after every {plan['train_after']}, seed "
             f"{plan['seed']}, windows of {plan['window']}, target mean {plan['target']}",
             f"  model {report['model']['name']} ({report['model']['parameters']:,} parameters)",
             f"  machine: {report['machine']}", ""]
    cell = "{:>5} {:>5} {:>7} {:>6} {:>6}"
    head = f"{'ratings':>8} | " + " | ".join(f"{methods[m]['label'][:33]:<33}" for m in names)
    sub = f"{'':>8} | " + " | ".join(cell.format("mean", "pref", "KL", "ppl", "pplP")
                                       for _ in names)
    lines += [head, sub, "-" * len(sub)]
    for i, w0 in enumerate(methods[names[0]]["windows"]):
        row = []
        for m in names:
            w = methods[m]["windows"][i]
            mean = w.get("mean_rating", w["probe_mean_rating"])
            share = w.get("preferred_share", w["probe_preferred_share"])
            row.append(cell.format(f"{mean:.2f}", f"{share:.0%}", f"{w['kl']:.4f}",
                                   f"{w['perplexity']:.3f}",
                                   _num(w.get("perplexity_preferred"), ".3f")))
        label = "base" if w0["ratings"] == 0 else str(w0["ratings"])
        lines.append(f"{label:>8} | " + " | ".join(row))
    lines += ["", "  'base' is the base model on the probe prompts; each later row is the window "
              "of ratings ending there", "  (mean rating, share in the preferred style); KL "
              "(per token), ppl (held-out corpus) and pplP (its replies in the", "  preferred "
              "style: fluency where the preference does not pull) are measured at the window's "
              "end.", ""]
    rows = [("ratings to target", lambda r: _num(r["ratings_to_target"], "d", "not reached")),
            ("time to target (s)", lambda r: _num(r["seconds_to_target"], ".0f")),
            ("ratings to target, held", lambda r: _num(r["ratings_to_target_held"], "d",
                                                        "not held")),
            ("time to target, held (s)", lambda r: _num(r["seconds_to_target_held"], ".0f")),
            ("final probe mean", lambda r: f"{r['final']['probe_mean_rating']:.2f}"),
            ("final probe preferred", lambda r: f"{r['final']['probe_preferred_share']:.0%}"),
            ("final KL / token", lambda r: f"{r['final']['kl']:.4f}"),
            ("final perplexity", lambda r: f"{r['final']['perplexity']:.3f}"),
            ("final ppl, preferred style", lambda r: _num(r["final"].get("perplexity_preferred"),
                                                          ".3f")),
            ("rounds (rejected)", lambda r: f"{r['rounds_succeeded']} ({r['rounds_rejected']})"),
            ("swap pause, median ms", lambda r: _num(r["swap_pause_ms_median"], ".1f")),
            ("loop time (s)", lambda r: f"{r['loop_seconds']:.0f}"),
            ("measuring time (s)", lambda r: f"{r['eval_seconds']:.0f}")]
    lines.append(f"{'':>24}" + "".join(f"{methods[m]['label'][:22]:>24}" for m in names))
    for title, fn in rows:
        lines.append(f"{title:>24}" + "".join(f"{fn(methods[m]):>24}" for m in names))
    ppo = methods.get("reinf")
    if ppo:
        trained = [w for w in ppo["windows"] if w.get("active_checkpoint")]
        first = trained[0] if trained else None
        lines += ["", "Reward consistency (Spearman: value head at the last reply token vs "
                  "held-out ratings):",
                  f"  held-out corpus replies ({plan['heldout']}): "
                  f"first trained window {_num(first and first['consistency_heldout'], '.2f')}, "
                  f"final {_num(ppo['final']['consistency_heldout'], '.2f')}",
                  "  by window: " + " ".join(
                      f"{w['ratings']}:{_num(w['consistency_heldout'], '.2f')}" for w in trained),
                  f"  probe replies ({plan['final_probe']}, final): "
                  f"{_num(ppo['final']['consistency_probe'], '.2f')} "
                  "(undefined when every probe reply gets the same rating)"]
    goals = report.get("goals") or {}
    if goals:
        g = goals
        rise = g["rise_by_120"]
        lines += ["", "Goals (issue: default config, Reinf):",
                  f"  [{'x' if rise['met'] else ' '}] mean rating +1.0 within 120 ratings: base "
                  f"{rise['base_mean']:.2f}, ratings 101-120 {_num(rise['mean_at_120'], '.2f')}",
                  f"  [{'x' if g['share_by_200']['met'] else ' '}] preferred share >= 90% "
                  f"within 200: base {g['share_by_200']['base_share']:.0%}, last window "
                  f"{g['share_by_200']['last_window_share']:.0%}, final probe "
                  f"{g['share_by_200']['final_probe_share']:.0%}",
                  f"  [{'x' if g['perplexity']['met'] else ' '}] perplexity +10% at most: "
                  f"{g['perplexity']['base']:.3f} -> {g['perplexity']['final']:.3f} "
                  f"({g['perplexity']['change']:+.1%}); on preferred-style replies "
                  f"{_num(g['perplexity'].get('preferred_change'), '+.1%')}",
                  f"  [{'x' if g['fewer_ratings_than_baselines']['met'] else ' '}] fewer "
                  "ratings to target than each baseline: " + ", ".join(
                      f"{m} {_num(v, 'd', 'never')}" for m, v in
                      g["fewer_ratings_than_baselines"].items() if m != "met")]
    lines.append(f"\ntotal {report['seconds']:.0f} s")
    return "\n".join(lines)


def series(report: dict) -> dict[str, dict[str, list[float]]]:
    """Per method: x (ratings), mean rating per window (the base row uses its probe), KL."""
    out = {}
    for name, r in report["methods"].items():
        ws = r["windows"]
        out[name] = {"label": r["label"], "x": [w["ratings"] for w in ws],
                     "mean": [w.get("mean_rating", w["probe_mean_rating"]) for w in ws],
                     "kl": [w["kl"] for w in ws]}
    return out


def save_plot(report: dict, path: str | Path) -> Path:
    """Mean rating and KL against ratings, one line per method. PNG via matplotlib when it
    is installed, else SVG (the suffix is changed to .svg)."""
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
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    for name, s in data.items():
        colour = COLOURS.get(name)
        left.plot(s["x"], s["mean"], marker="o", ms=3, label=s["label"], color=colour)
        right.plot(s["x"], s["kl"], marker="o", ms=3, label=s["label"], color=colour)
    left.axhline(report["plan"]["target"], color="grey", lw=0.8, ls="--", label="target")
    left.set(xlabel="ratings", ylabel="mean rating (window)", ylim=(0.8, 5.2),
             title=f"rater: {report['rater']['name']}")
    right.set(xlabel="ratings", ylabel="KL to base (nats / token)", title="KL to the base")
    left.legend(fontsize=8, loc="lower right")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def build_svg(data: dict, report: dict, width: int = 900, height: int = 360) -> str:
    """The same two panels as a hand-written SVG (no matplotlib)."""
    pw, ph, pad = width / 2 - 60, height - 80, 50
    xmax = max(max(s["x"]) for s in data.values()) or 1
    kmax = max(max(s["kl"]) for s in data.values()) or 1e-3
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" '
             'fill="white"/>']
    for k, (key, lo, hi, title) in enumerate((("mean", 1.0, 5.0, "mean rating (window)"),
                                               ("kl", 0.0, kmax, "KL to base (nats/token)"))):
        ox = pad + k * (width / 2)
        parts.append(f'<rect x="{ox}" y="20" width="{pw}" height="{ph}" fill="none" '
                     'stroke="#888"/>')
        parts.append(f'<text x="{ox}" y="14">{title} vs ratings (0-{xmax}); '
                     f'y {lo:.3g}-{hi:.3g}</text>')
        for i, (name, s) in enumerate(data.items()):
            pts = " ".join(f"{ox + x / xmax * pw:.1f},{20 + ph - (y - lo) / (hi - lo) * ph:.1f}"
                           for x, y in zip(s["x"], s[key]))
            colour = COLOURS.get(name, "#444")
            parts.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                         'stroke-width="2"/>')
            if k == 0:
                parts.append(f'<text x="{ox + 8}" y="{40 + 14 * i}" fill="{colour}">'
                             f'{s["label"]}</text>')
    parts.append(f'<text x="{pad}" y="{height - 10}">rater: {report["rater"]["name"]}</text>')
    return "\n".join(parts + ["</svg>"]) + "\n"

"""The prompts of ``reinf bench learn``: a training stream and a probe that is held out.

**The built-in set** (``reinf/bench/data/prompts.jsonl``, written for this project) holds
what a person types to a small chat assistant, one JSON object a line, ``{"prompt": ...,
"category": ...}``, in eight categories (``CATEGORIES``) of 48 prompts each: questions of
fact, how-to, advice, writing, code, arithmetic, opinion and chit-chat.

**The split rule** (``in_probe``): a prompt is on the probe side when the first 8 bytes of
the SHA-256 of ``SPLIT_SALT + normalise(text)``, read as an integer, fall in the first
quarter of their range (``PROBE_SHARE``); every other prompt is on the training side. It
depends on the text alone, so it is the same for the built-in set and for a person's file,
and two prompts with the same normalised text (lowercased, whitespace collapsed,
punctuation stripped, digits kept: a near-duplicate) always land on the same side.

**Disjoint.** ``build_prompt_plan`` drops every probe prompt whose normalised text is a
training prompt's (the training file, or the run's streams), and on the demo model every one
the demo model was trained on (its corpus's training split), then checks that nothing is
left on both sides (``check_disjoint``) and says how many it dropped.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, Sequence

from reinf.errors import BadInput

CATEGORIES = ("fact", "howto", "advice", "writing", "code", "arithmetic", "opinion",
              "chitchat")
BUILTIN = "reinf/bench/data/prompts.jsonl"
PROBE_SHARE = 0.25          # about a quarter of the prompts are the probe
# The salt of the split's hash: of "reinf-probe-0:" ... "reinf-probe-1999:", the one that
# splits the built-in set most evenly (11-13 probe prompts in each category, 94 in all).
SPLIT_SALT = "reinf-probe-1165:"
FILE_KINDS = (".txt", ".jsonl")

_PUNCTUATION = re.compile("[" + re.escape(string.punctuation) + "\u2018\u2019\u201c\u201d"
                          "\u2013\u2014\u2026\u00d7\u00f7\u2212]")


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str | None = None


def normalise(text: str) -> str:
    """Lowercased, punctuation stripped (``+`` and ``-`` too), whitespace collapsed; digits
    kept. Two prompts with the same normalised text are near-duplicates."""
    return " ".join(_PUNCTUATION.sub(" ", text.lower()).split())


def in_probe(text: str) -> bool:
    """The split rule: is this prompt on the probe side?"""
    digest = hashlib.sha256((SPLIT_SALT + normalise(text)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < PROBE_SHARE * 2 ** 64


# --- loading ----------------------------------------------------------------------------

def load_builtin() -> list[Prompt]:
    """The built-in set, in file order."""
    text = resources.files("reinf.bench").joinpath("data", "prompts.jsonl").read_text(
        encoding="utf-8")
    return _parse_jsonl(text.splitlines(), BUILTIN)


def load_prompt_file(path: str | Path) -> list[Prompt]:
    """A person's prompts: ``.txt`` (one prompt a line; blank lines and lines starting
    with ``#`` skipped) or ``.jsonl`` (objects with ``"prompt"`` and an optional
    ``"category"``). A bad line is a one-line BadInput naming the file and the line."""
    path = Path(path).expanduser()
    if path.suffix.lower() not in FILE_KINDS:
        raise BadInput(f"prompt file {path} is neither .txt nor .jsonl",
                       fix="give a .txt file (one prompt a line) or a .jsonl file "
                           '({"prompt": ...} a line)')
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInput(f"prompt file {path} not found", fix="check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"prompt file {path} cannot be read: {exc}",
                       fix="give a readable UTF-8 text file") from None
    if path.suffix.lower() == ".jsonl":
        prompts = _parse_jsonl(lines, str(path))
    else:
        prompts = [Prompt(line.strip()) for line in lines
                   if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise BadInput(f"prompt file {path} holds no prompts",
                       fix="put one prompt a line in it")
    return prompts


def _parse_jsonl(lines: Iterable[str], name: str) -> list[Prompt]:
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}, line {number}"
        fix = 'each line must be a JSON object like {"prompt": "...", "category": "..."}'
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where}: not JSON ({exc.msg})", fix=fix) from None
        if not isinstance(row, dict):
            raise BadInput(f"{where}: not a JSON object", fix=fix)
        prompt, category = row.get("prompt"), row.get("category")
        if not isinstance(prompt, str) or not prompt.strip():
            raise BadInput(f'{where}: no "prompt" text', fix=fix)
        if category is not None and not isinstance(category, str):
            raise BadInput(f'{where}: "category" must be text', fix=fix)
        out.append(Prompt(prompt.strip(), category))
    return out


# --- splitting, streams and the probe ------------------------------------------------------

def unique(prompts: Iterable[Prompt]) -> list[Prompt]:
    """The first prompt of each normalised text, in order."""
    seen: set[str] = set()
    out = []
    for p in prompts:
        key = normalise(p.text)
        if key and key not in seen:
            seen.add(key)
            out.append(p)
    return out


def split_prompts(prompts: Iterable[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(training side, probe side) by ``in_probe``, near-duplicates removed."""
    prompts = unique(prompts)
    return ([p for p in prompts if not in_probe(p.text)],
            [p for p in prompts if in_probe(p.text)])


def drop_overlaps(probe: Sequence[Prompt], taken: set[str]) -> tuple[list[Prompt], int]:
    """The probe prompts whose normalised text is not in ``taken``, and how many were not."""
    kept = [p for p in probe if normalise(p.text) not in taken]
    return kept, len(probe) - len(kept)


def check_disjoint(train: Iterable[str], probe: Iterable[str]) -> None:
    """Raise if a probe prompt is a training prompt or a near-duplicate of one."""
    both = {normalise(t) for t in train} & {normalise(p) for p in probe}
    if both:
        raise AssertionError(f"{len(both)} probe prompt(s) are also training prompts, "
                             f"e.g. {sorted(both)[0]!r}")


def stream_prompts(train: Sequence[Prompt], seed: int, n: int) -> list[str]:
    """``n`` training prompts for ``seed``: the training side shuffled (seeded), taken in
    order, shuffled again each time it runs out. The same seed gives the same stream."""
    if not train:
        raise ValueError("no training prompts")
    rng = random.Random(f"bench-prompts-{seed}")
    out: list[str] = []
    while len(out) < n:
        deck = [p.text for p in train]
        rng.shuffle(deck)
        out.extend(deck[:n - len(out)])
    return out


def order_probe(probe: Iterable[Prompt]) -> list[Prompt]:
    """The probe's fixed order, whatever the order given: categories in turn (``CATEGORIES``
    first, then any other by name), each category's prompts by their hash, so the first n
    of the probe mix every category."""
    groups: dict[str | None, list[Prompt]] = {}
    for p in probe:
        groups.setdefault(p.category, []).append(p)
    for items in groups.values():
        items.sort(key=lambda p: hashlib.sha256(normalise(p.text).encode()).hexdigest())
    rank = {c: i for i, c in enumerate(CATEGORIES)}
    groups = {c: groups[c] for c in sorted(groups, key=lambda c: (rank.get(c, len(rank)),
                                                                   c is None, c or ""))}
    out = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        out.extend(g[i] for g in groups.values() if i < len(g))
    return out


def repeat_to(items: Sequence, n: int) -> list:
    """``items`` repeated in order until there are ``n`` of them."""
    return [items[j % len(items)] for j in range(n)] if items else []


# --- the demo model -------------------------------------------------------------------------

def demo_prompt_space() -> list[Prompt]:
    """Every prompt the demo corpus can ask: each topic's paraphrases, the kind as category."""
    from reinf.demo.corpus import KINDS, TOPICS

    return [Prompt(text, kind) for kind in KINDS for topic in TOPICS[kind] for text in topic[0]]


def demo_training_prompts(model_dir: str | Path | None = None) -> set[str]:
    """The normalised prompts of the demo model's training split: the corpus its build
    generated (seed and size from the model's ``reinf_demo.json``), less the held-out slice."""
    from reinf.demo.corpus import generate_corpus, split_corpus

    seed, size = 0, 8000          # reinf.demo.build's defaults
    meta = Path(model_dir) / "reinf_demo.json" if model_dir else None
    if meta is not None and meta.is_file():
        built = json.loads(meta.read_text(encoding="utf-8"))
        seed, size = int(built.get("seed", seed)), int(built.get("corpus_size", size))
    train, _ = split_corpus(generate_corpus(seed=seed, n=size), seed=seed)
    return {normalise(it["prompt"]) for it in train}


# --- the plan of one run --------------------------------------------------------------------

@dataclass
class PromptPlan:
    """A run's prompts: each seed's training stream and the probe (unique, fixed order)."""
    streams: dict[int, list[str]]
    probe: list[str]
    info: dict = field(default_factory=dict)


def build_prompt_plan(*, demo: bool, seeds: Sequence[int], ratings: int,
                      prompts_file: str | Path | None = None,
                      probe_file: str | Path | None = None,
                      model_dir: str | Path | None = None) -> PromptPlan:
    """The training streams and the probe of a run.

    - ``prompts_file`` and ``probe_file``: the first trains, the second probes;
    - ``prompts_file`` alone: split by the rule;
    - neither, on a real model: the built-in set, split by the rule;
    - neither, on the demo model (``demo``): the demo corpus's prompts train
      (``reinf.demo.corpus.sample_prompts``, as the demo model's figures always did), and
      the probe is the rest of its prompt space;
    - ``probe_file`` alone: that probe, the training side as above.

    Probe prompts that are training prompts (near-duplicates too) are dropped, and on the
    demo model also those of its own training split. Nothing left: BadInput."""
    from reinf.demo.corpus import sample_prompts

    train_pool: list[Prompt] | None = None
    train_source = probe_source = split = None
    probe_pool: list[Prompt] = []
    if prompts_file is not None:
        given = unique(load_prompt_file(prompts_file))
        train_source = str(prompts_file)
        if probe_file is None:
            train_pool, probe_pool = split_prompts(given)
            probe_source, split = f"{prompts_file}, probe side", "rule"
            if not train_pool or not probe_pool:
                raise BadInput(f"prompt file {prompts_file}: the split rule puts its "
                               f"{len(given)} prompt(s) all on one side",
                               fix="add prompts (a quarter go to the probe), or give "
                                   "--probe-prompts FILE as well")
            train_source += ", training side"
        else:
            train_pool = given
    elif not demo:
        train_pool, probe_pool = split_prompts(load_builtin())
        train_source, probe_source, split = (f"{BUILTIN}, training side",
                                             f"{BUILTIN}, probe side", "rule")
    if probe_file is not None:
        probe_pool = unique(load_prompt_file(probe_file))
        probe_source = str(probe_file)
    elif train_pool is None:
        probe_pool, probe_source = demo_prompt_space(), "the demo corpus's prompt space"

    if train_pool is None:
        streams = {s: sample_prompts(s, ratings) for s in seeds}
        train_source = "the demo corpus (sample_prompts)"
        taken = {normalise(t) for stream in streams.values() for t in stream}
    else:
        streams = {s: stream_prompts(train_pool, s, ratings) for s in seeds}
        taken = {normalise(p.text) for p in train_pool}
    probe, removed = drop_overlaps(unique(probe_pool), taken)
    removed_demo = 0
    if demo:
        probe, removed_demo = drop_overlaps(probe, demo_training_prompts(model_dir))
    if not probe:
        raise BadInput(f"no probe prompt is left: all {removed + removed_demo} are training "
                       "prompts" + (" or in the demo model's training split" if demo else ""),
                       fix="give --probe-prompts FILE with prompts that are not in the "
                           "training prompts")
    probe = order_probe(probe)
    used = {t for stream in streams.values() for t in stream}
    check_disjoint(used | {p.text for p in train_pool or ()}, [p.text for p in probe])
    trained = [p.category for p in train_pool] if train_pool is not None else None
    info = {
        "train_source": train_source, "probe_source": probe_source,
        "split": (f"sha256 of the normalised text, {PROBE_SHARE:.0%} probe" if split else
                  None),
        "train_prompts": len(train_pool) if train_pool is not None else len(used),
        "probe_prompts": len(probe),
        "train_by_category": _by_category(trained) if trained is not None else None,
        "probe_by_category": _by_category(p.category for p in probe),
        "probe_disjoint": True,
        "overlaps_removed": removed + removed_demo,
        "overlaps_removed_training": removed,
        "overlaps_removed_demo_split": removed_demo if demo else None,
    }
    return PromptPlan(streams, [p.text for p in probe], info)


def _by_category(categories: Iterable[str | None]) -> dict | None:
    counts = Counter(c for c in categories if c is not None)
    return dict(counts) if counts else None

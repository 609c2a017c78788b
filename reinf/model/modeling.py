"""Loading the base model, and turning a conversation into prompt token ids.

``load_model`` reads any Hugging Face causal LM through ``from_pretrained``: a local
directory and a hub id take the same path (tests load models they saved themselves).
It picks the device and dtype, applies bitsandbytes quantization where it can, and turns
every failure into a ``ModelError`` that says what to do. ``build_prompt_ids`` applies the
tokenizer's chat template to the recent history and trims the oldest turns to fit.

transformers (and huggingface_hub) are imported where a model or tokenizer is loaded, not
at the top: ``reinf status`` and the memory plan import this module for ``plan_load`` only.
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import importlib.util
import inspect
import logging
import os
import socket
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlsplit

import torch
from jinja2.exceptions import TemplateError
from safetensors import safe_open

from reinf.catalog import DEMO_MODEL, resolve_model_path
from reinf.catalog import KNOWN_MODELS, is_installed, pull_fix
from reinf.config import Config
from reinf.errors import BadInput, ModelError
from reinf.model.lora import lora_target_warnings
from reinf.model.shape import FALLBACK_CONTEXT

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Used only when a tokenizer has none, with a warning: ChatML, as Qwen2 models use it.
FALLBACK_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
NO_MODEL_FIX = "run `reinf init` or set model_path"
OOM_FIX = ("use a smaller model, set quantization: 4bit (CUDA only), or lower max_new_tokens "
           "and max_context_tokens")


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    device: str                 # the device in use: "cuda", "mps" or "cpu"
    dtype: torch.dtype          # the weights' dtype in use
    quantization: str           # effective: "none" when the configured one fell back
    name: str                   # what model_path resolved to (a directory or a hub id)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoadPlan:
    device: str
    dtype: torch.dtype
    quantization: str
    warnings: tuple[str, ...] = ()


def plan_load(device: str, dtype: str, quantization: str, *, cuda: bool, mps: bool,
              bf16: bool = True, for_training: bool = False,
              gpu: str = "this GPU") -> LoadPlan:
    """Decide device, dtype and quantization from the settings and what the machine has.

    ``auto`` picks cuda, then mps, then cpu. dtype ``auto`` is bf16 on CUDA (fp16 where the
    GPU lacks bf16) and fp32 elsewhere. Quantization needs CUDA; without it the model loads
    unquantized and the plan carries a warning that `reinf status` shows.

    Training in fp16 on a GPU without bf16 (``gpu`` names it) is refused: the trainer's
    autocast is bf16-only and it has no loss scaling, without which fp16 gradients
    underflow. Serving in fp16 there is fine.
    """
    if device == "auto":
        device = "cuda" if cuda else "mps" if mps else "cpu"
    elif device == "cuda" and not cuda:
        raise ModelError("device is cuda but no CUDA GPU is available",
                         fix="set device: auto (or cpu)", key="device")
    elif device == "mps" and not mps:
        raise ModelError("device is mps but Apple's Metal backend is not available",
                         fix="set device: auto (or cpu)", key="device")
    if dtype == "auto":
        torch_dtype = (torch.bfloat16 if bf16 else torch.float16) if device == "cuda" \
            else torch.float32
    else:
        torch_dtype = DTYPES[dtype]
    if for_training and device == "cuda" and torch_dtype == torch.float16 and not bf16:
        raise ModelError(f"cannot train in float16 on {gpu}: it has no bfloat16, and float16 "
                         "training would need loss scaling, which Reinf does not do",
                         fix="set dtype: float32 (the server then runs in float32 too)",
                         key="dtype")
    warnings = []
    if quantization != "none" and device != "cuda":
        warnings.append(f"quantization {quantization} needs CUDA (bitsandbytes); the model "
                        f"runs unquantized on {device}")
        quantization = "none"
    return LoadPlan(device, torch_dtype, quantization, tuple(warnings))


def load_model(config: Config, *, device: str | None = None, for_training: bool = False,
               quantization: str | None = None) -> LoadedModel:
    """Load model and tokenizer as ``config.model`` says; errors become ``ModelError``.

    ``device`` overrides the configured one, ``quantization`` ``model.quantization`` (the
    trainer's ``training.base_quantization``). ``for_training`` uses ``ppo.train_device``
    (``auto`` = the serving device) and leaves the weights' ``requires_grad`` alone; else
    all base weights are frozen. The model is always returned in eval mode (no dropout).
    """
    mcfg = config.model
    if device is None:
        device = config.ppo.train_device if for_training and \
            config.ppo.train_device != "auto" else mcfg.device
    here = visible_devices()
    bf16, gpu = cuda_facts() if here["cuda"] else (False, "")
    plan = plan_load(device, mcfg.dtype, quantization or mcfg.quantization, **here,
                     bf16=bf16, for_training=for_training, gpu=gpu)
    name = resolve_model_path(config)
    offline = check_model_path(name, config)
    model = _load_weights(name, plan, mcfg.trust_remote_code, offline=offline)
    tokenizer = _load_tokenizer(name, mcfg.trust_remote_code, offline=offline)
    warnings = list(plan.warnings)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = FALLBACK_TEMPLATE
        warnings.append(f"{name} has no chat template; using ChatML, which a base model "
                        "may not follow")
    model.eval()
    if not for_training:
        model.requires_grad_(False)
        warnings += lora_target_warnings(model, config.lora.target_modules)  # training refuses
    for w in warnings:
        log.warning(w)
    return LoadedModel(model, tokenizer, plan.device, model.dtype, plan.quantization, name,
                       warnings)


def visible_devices() -> dict[str, bool]:
    """What this machine offers ``plan_load``: ``{"cuda": ..., "mps": ...}`` as torch sees it."""
    return {"cuda": torch.cuda.is_available(),
            "mps": bool(getattr(torch.backends, "mps", None))
            and torch.backends.mps.is_available()}


def cuda_facts() -> tuple[bool, str]:
    """Whether the CUDA GPU computes in bf16 natively, and its name for messages.

    Compute capability 8.0 (Ampere) or newer; ``torch.cuda.is_bf16_supported()`` alone also
    says yes on older GPUs, where bf16 is only emulated (slowly). ROCm: torch's answer."""
    major, minor = torch.cuda.get_device_capability()
    name = f"{torch.cuda.get_device_name()} (compute capability {major}.{minor})"
    if getattr(torch.version, "hip", None):
        return bool(torch.cuda.is_bf16_supported()), name
    return (major, minor) >= (8, 0), name


def check_model_path(name: str, config: Config) -> bool:
    """Fail at once, in one line, where loading cannot work: a named model not pulled, a
    local path with no model, a name one typo away from a known one, a hub id while the hub
    is out of reach (transformers would retry it for about a minute). Returns whether a
    hub id must come from the local cache only (the hub is out of reach)."""
    path = Path(name)
    named = config.model.model_path
    if named in KNOWN_MODELS and KNOWN_MODELS[named].source is not None \
            and not is_installed(path):
        raise ModelError(f"model {named} is not installed (looked in {path})",
                         fix=pull_fix(named), key="model_path")
    looks_local = path.is_absolute() or name.startswith((".", "~")) or path.exists()
    if looks_local:
        fix = NO_MODEL_FIX if named == DEMO_MODEL else _other_model_fix(path.name)
        if not path.exists():
            raise ModelError(f"no model at {name}", fix=fix, key="model_path")
        if not (path / "config.json").is_file():
            raise ModelError(f"no model at {name}: config.json is missing", fix=fix,
                             key="model_path")
        return False
    close = difflib.get_close_matches(name, list(KNOWN_MODELS), n=1, cutoff=0.75)
    if close and "/" not in name:
        raise ModelError(f"no model named {name!r}", fix=_other_model_fix(name),
                         key="model_path")
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        return True
    if not hub_reachable():
        # This process works offline from here: huggingface_hub reads HF_HUB_OFFLINE once,
        # at import, into the constant that its and transformers' calls consult, so the
        # adapter probe and every other lookup go to the local cache without retrying.
        import huggingface_hub.constants  # here only: see the module docstring

        huggingface_hub.constants.HF_HUB_OFFLINE = True
        return True
    return False


def _other_model_fix(name: str) -> str:
    """What to set model_path to instead of ``name``: the closest known name, if any."""
    close = difflib.get_close_matches(name, list(KNOWN_MODELS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"{hint}set model_path to a name from `reinf models` ({', '.join(KNOWN_MODELS)}), "
            "a model directory, or a hub id")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub's host (``HF_ENDPOINT``) resolves and accepts a
    connection within ``timeout`` seconds; asked in a thread, so a hanging DNS cannot
    hold the caller longer than that."""
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https"
                                                             else 80)
    answer: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            answer.append(True)
        except OSError:
            answer.append(False)
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(answer and answer[0])


def _load_weights(name: str, plan: LoadPlan, trust_remote_code: bool, *,
                  offline: bool = False):
    from transformers import AutoModelForCausalLM  # here only: see the module docstring

    kwargs: dict[str, Any] = {"dtype": plan.dtype, "trust_remote_code": trust_remote_code}
    if offline:  # a hub id with the hub out of reach: the local cache, or one clear line
        kwargs["local_files_only"] = True
    if plan.quantization != "none":
        kwargs.update(quantization_config=_bnb_config(plan), device_map={"": 0})
    try:
        model = AutoModelForCausalLM.from_pretrained(name, **kwargs)
        if plan.quantization == "none":
            model.to(plan.device)
        return model
    except ModelError:
        raise
    except (torch.OutOfMemoryError, MemoryError) as exc:
        raise ModelError(f"out of memory loading {name} on {plan.device}: "
                         f"{_first_line(exc)}", fix=OOM_FIX) from exc
    except Exception as exc:  # noqa: BLE001 - every loader failure becomes one clear message
        if offline:
            raise ModelError(f"cannot fetch {name!r}: the Hugging Face hub is out of reach (or "
                             "HF_HUB_OFFLINE is set) and it is not in the local cache",
                             fix=_other_model_fix(name), key="model_path") from exc
        raise _explain_load_error(name, exc, trust_remote_code) from exc


def _load_tokenizer(name: str, trust_remote_code: bool, *, offline: bool = False):
    from transformers import AutoTokenizer  # here only: see the module docstring

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code,
                                             **({"local_files_only": True} if offline else {}))
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"cannot load the tokenizer of {name}: {_first_line(exc)}",
                         fix="make sure the model directory holds its tokenizer files "
                             "(tokenizer.json, tokenizer_config.json)") from exc


def _bnb_config(plan: LoadPlan):
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelError(f"quantization {plan.quantization} needs the bitsandbytes package",
                         fix="pip install 'reinf[cuda]', or set quantization: none",
                         key="quantization")
    from transformers import BitsAndBytesConfig  # here only: see the module docstring

    if plan.quantization == "4bit":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_compute_dtype=plan.dtype)
    return BitsAndBytesConfig(load_in_8bit=True)


def _explain_load_error(name: str, exc: Exception, trust_remote_code: bool) -> ModelError:
    text = _first_line(exc)
    if "out of memory" in text.lower() or "can't allocate memory" in text.lower():
        return ModelError(f"out of memory loading {name}: {text}", fix=OOM_FIX)
    if "trust_remote_code" in str(exc) and not trust_remote_code:
        return ModelError(f"{name} needs its own model code from the hub",
                          fix="set trust_remote_code: true only if you trust its authors",
                          key="trust_remote_code")
    path = Path(name)
    if path.is_dir():
        bad = find_bad_weights(path)
        if bad is not None:
            return ModelError(f"the weights file {bad[0]} is damaged: {bad[1]}",
                              fix="download or rebuild the model (`reinf init` rebuilds "
                                  "the demo model)")
        return ModelError(f"cannot load the model in {name}: {text}",
                          fix="check that it is a Hugging Face causal LM directory")
    return ModelError(f"cannot load model '{name}' from the Hugging Face hub: {text}",
                      fix="check the id and that you are online (or that it was downloaded "
                          "before), or set model_path to a local directory", key="model_path")


def find_bad_weights(model_dir: Path) -> tuple[Path, str] | None:
    """The first weights file in ``model_dir`` that cannot be read, and why."""
    for file in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        except Exception as exc:  # noqa: BLE001
            return file, _first_line(exc)
    for file in sorted(model_dir.glob("*.bin")):
        try:
            torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001
            return file, _first_line(exc)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


# --- context -----------------------------------------------------------------------------

def get_context_limit(model, tokenizer, max_context_tokens: int = 0) -> int:
    """How many tokens (prompt + reply) one reply may use.

    The model's own limit comes from its config (``max_position_embeddings`` and kin),
    else the tokenizer's ``model_max_length``. ``max_context_tokens`` > 0 lowers it; it never
    raises it past what the model was built for.
    """
    cfg = getattr(model, "config", None)
    own = None
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            own = value
            break
    if own is None:
        value = getattr(tokenizer, "model_max_length", None)
        own = value if isinstance(value, int) and 0 < value < 10_000_000 else FALLBACK_CONTEXT
    return min(own, max_context_tokens) if max_context_tokens > 0 else own


def build_prompt_ids(tokenizer, history: Sequence[tuple[str, str]], message: str, *,
                     max_history: int, max_context_tokens: int,
                     max_new_tokens: int, system: str | None = None) -> list[int]:
    """Prompt token ids for ``message`` after ``history`` (``[(user, reply), ...]``, oldest
    first), through the tokenizer's chat template, ending with the assistant header.
    ``system`` (the conversation's system prompt) comes first and is never trimmed.

    Only the last ``max_history`` turns are sent. Then the oldest turns are dropped until
    prompt + ``max_new_tokens`` fits ``max_context_tokens`` (0: the tokenizer's own limit).
    A message that does not fit on its own is refused, never cut silently. Control tokens
    typed into a message (``<|im_end|>``) are encoded as plain text where the tokenizer
    supports it, so a message cannot forge a turn.
    """
    limit = max_context_tokens or get_context_limit(None, tokenizer)
    turns = list(history)[-max_history:] if max_history > 0 else []
    while True:
        ids = render_chat(tokenizer, turns, message, system=system)
        if len(ids) + max_new_tokens <= limit:
            return ids
        if not turns:
            break
        turns = turns[1:]
    room = limit - max_new_tokens
    if room <= 0:
        raise BadInput(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the "
                       f"model's context of {limit} tokens", fix="lower max_new_tokens")
    if system:
        raise BadInput(f"system prompt and message too long for the model's context: "
                       f"{len(ids)} tokens, limit {room}",
                       fix="shorten the message or the system prompt (or lower max_new_tokens)")
    raise BadInput(f"message too long for the model's context: {len(ids)} tokens, limit "
                   f"{room}", fix="shorten the message (or lower max_new_tokens)")


# Tokenizers whose chat template refuses a system message, so the system prompt is folded
# into the first user message (logged once per tokenizer). One that cannot be weakly
# referenced is never in the set (WeakSet says so), so it is tried every time.
_FOLDS_SYSTEM: "weakref.WeakSet[Any]" = weakref.WeakSet()


def render_chat(tokenizer, turns: Sequence[tuple[str, str]], message: str, *,
                system: str | None = None) -> list[int]:
    """The chat template's ids for ``system``, ``turns`` and the new ``message``, ending with
    the assistant header.

    ``system`` goes in as a system message. A template that refuses one (Gemma's raises
    "System role not supported"; early Mistral's ``[INST]`` templates insist that user and
    assistant alternate) gets it folded into the first user message instead,
    ``"{system}\n\n{user}"``, so the model still reads it; the log says so once per
    tokenizer.
    """
    messages = []
    for user, reply in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": message})
    if not system:
        return _apply_template(tokenizer, messages)
    refusal = None
    if tokenizer not in _FOLDS_SYSTEM:
        try:
            return _apply_template(tokenizer, [{"role": "system", "content": system}, *messages])
        except TemplateError as exc:
            refusal = exc
    messages[0] = {"role": "user", "content": f"{system}\n\n{messages[0]['content']}"}
    ids = _apply_template(tokenizer, messages)  # a template that refuses this too: raised
    if refusal is not None:
        with contextlib.suppress(TypeError):
            _FOLDS_SYSTEM.add(tokenizer)
        log.info("the chat template of %s refuses a system message (%s); the system prompt "
                 "goes at the start of the first user message instead",
                 getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__, refusal)
    return ids


def _apply_template(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    extra = {"sanitize_control_tokens": True} if _can_sanitize(type(tokenizer)) else {}
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True, **extra)
    return list(out["input_ids"])


@functools.lru_cache(maxsize=None)
def _can_sanitize(tokenizer_type: type) -> bool:
    """transformers 5.x can encode control tokens found in messages as text; 4.x cannot."""
    return "sanitize_control_tokens" in inspect.signature(
        tokenizer_type.apply_chat_template).parameters


class Detokenizer:
    """Turns token ids into text deltas as they come (O(1) work per token).

    It decodes a short window (from the previous delta's start) and emits only the new
    part, holding back while the tail is an incomplete UTF-8 character (shown as U+FFFD).
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0   # window start
        self._read = 0     # ids up to here are already in self.text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd") and now.startswith(before):
            delta = now[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix:self._read])
        now = self._decode(self.ids[self._prefix:])
        delta = now[len(before):] if now.startswith(before) else ""
        self._read = len(self.ids)
        self.text += delta
        return delta


@contextlib.contextmanager
def quiet_peft():
    """peft uses gradient-checkpointing names that transformers 5 deprecated; the person
    can do nothing about it, so it stays out of their terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated",
                                category=FutureWarning)
        yield


def resolve_max_history(max_history: int | None, model_name: str, *, demo_turns: int = 4,
                        cap: int = 32) -> int:
    """Past turns to send with a message: ``model.max_history`` where it is set (0 = none).

    Unset (null) means auto: ``demo_turns`` on the demo model, which was trained on chats
    of at most a few turns and drifts on longer ones; on any other model up to ``cap``
    turns, and ``build_prompt_ids`` then drops the oldest that do not fit the context
    budget, so a long-context model remembers more. The cap bounds the work of rendering a
    prompt (one chat-template pass per dropped turn). ``model_name`` is the model path as
    loaded (``LoadedModel.name``) or the ``model_path`` setting.
    """
    if max_history is not None:
        return max_history
    return demo_turns if Path(model_name).name == DEMO_MODEL else cap

"""The engine: one base model, the active LoRA adapter, streamed replies.

Each reply runs in its own thread under the engine's lock, so replies are serialised and
an adapter swap (which takes the same lock) lands only between two replies: a reply never
mixes two adapters. A reply may ask for another adapter than the active one (``borrow``:
the bare base or another checkpoint, for ``reinf compare``); it is put in place for that
reply alone, under the same lock, and the active one is back before the next reply.

Tokens come from ``reinf.model.sampling.decode`` (a batch of one), the same decoder the
trainer's rollouts use, so each reply records its exact prompt and reply token ids and each
sampled token's behaviour log-probability, and can stop between tokens. ``replies`` samples
replies to several prompts in one batch of that decoder, recorded the same way (the choices
of an ``n`` > 1 request after the first, the learning bench's simulated people).

Best-of-n (``generation.best_of`` > 1): a chat reply from the active adapter is sampled
``best_of`` times in one batch of the same decoder, and the rating model the active
checkpoint carries (``rating_model.safetensors``, read when the checkpoint is swapped in,
outside the lock, as its adapter is) keeps the candidate with the highest pessimistic score
(``mean - training.pessimism * std``, the trainer's reward for a fresh reply; the first on a
tie). Only a rating model the trainer would trust serves (``untrusted_reason``); without
one, the reply is one plain streamed sample and its gen_params say why. The kept reply's
log-probs are its own row's behaviour log-probs, so PPO's ratio stays exact per token. Its
text reaches the stream in one piece, once the candidates are scored.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from reinf.config import Config
from reinf.errors import BadInput, ModelError, ReinfError
from reinf.model.adapters import Adapters, read_adapter
from reinf.model.modeling import (OOM_FIX, Detokenizer, LoadedModel, build_prompt_ids,
                                  get_context_limit, load_model, resolve_max_history)
from reinf.model.sampling import decode, eos_token_ids
from reinf.serving.best_of import Rater, best_of_state, read_rater
from reinf.training.rating_model import reply_features

log = logging.getLogger(__name__)

__all__ = ["Borrowed", "Engine", "Reply", "ReplyStream"]


@dataclass
class _Rows:
    """A batch of sampled replies, row by row (``Engine._decode_rows``)."""
    ids: list[list[int]]            # each row's tokens, its final EOS included
    logprobs: list[list[float]]
    finish: list[str]               # "stop" | "length" per row
    ttft_ms: float | None = None    # request to the first sampled token
    interrupted: bool = False       # told to stop while a row was still running


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_ids: list[int]
    reply_ids: list[int]            # includes the final EOS token when the model chose to stop
    logprobs: list[float]           # fp32 log_softmax(logits / T) of each sampled token
    checkpoint_id: str | None       # the adapter that produced every token; None = base
    ttft_ms: float | None           # request to first sampled token (lock wait included)
    latency_ms: float
    interrupted: bool
    gen_params: dict[str, Any]
    finish_reason: str              # "stop" (EOS) | "length" | "interrupted"


class ReplyStream:
    """A reply being generated in its own thread. Iterate it for text deltas.

    ``stop()`` asks the generator to end after the current token; ``wait()`` returns the
    finished ``Reply`` (or raises what went wrong). Iteration can be interrupted (Ctrl-C)
    without harm: the thread keeps its state, and ``stop()`` + ``wait()`` finish cleanly.
    ``on_finish(reply, error)`` runs in the thread before the stream reports its end, so a
    caller that iterated to the end finds its side effects (a stored turn) done.
    """

    _END = object()

    def __init__(self, run, *, on_finish=None):
        self._run = run
        self._on_finish = on_finish
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._reply: Reply | None = None
        self._error: BaseException | None = None
        self._ended = False
        self._thread = threading.Thread(target=self._main, name="reinf-reply", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self._reply = self._run(self)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._error = exc
        try:
            if self._on_finish is not None:
                self._on_finish(self._reply, self._error)
        except BaseException as exc:  # noqa: BLE001
            self._error = self._error or exc
        finally:
            self._done.set()
            self._queue.put(self._END)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def emit(self, delta: str) -> None:
        self._queue.put(delta)

    def stop(self) -> None:
        self._stop.set()

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while not self._ended:
            try:  # a timeout keeps the wait interruptible by Ctrl-C on every platform
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is self._END:
                self._ended = True
                break
            return item
        if self._error is not None:
            raise self._error
        raise StopIteration

    def wait(self, timeout: float | None = None) -> Reply:
        """The finished reply; raises the generation error, if any."""
        if not self._done.wait(timeout):
            raise TimeoutError("the reply is still being generated")
        if self._error is not None:
            raise self._error
        return self._reply

    @property
    def reply(self) -> Reply:
        return self.wait()

    def close(self) -> None:
        """Stop and wait for the thread; errors are left for ``wait()``."""
        self.stop()
        self._done.wait()

    def __enter__(self) -> "ReplyStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Borrowed:
    """An adapter for some replies instead of the active one (``Engine.borrow``): None is
    the bare base. Weights read from disk outside the lock, put in place under it."""
    checkpoint_id: str | None
    peft_config: Any = None
    state_dict: dict | None = None


@dataclass
class _Swap:
    """A requested adapter change, read from disk outside the lock, applied under it."""
    checkpoint_id: str | None
    path: str | None = None
    peft_config: Any = None
    state_dict: dict | None = None
    pause_ms: float | None = None
    error: BaseException | None = None
    rater: Rater | None = None     # its rating model for best-of-n (read when best_of > 1)


class Engine:
    def __init__(self, loaded: LoadedModel, config: Config):
        self.loaded = loaded
        self.config = config
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(loaded.device if loaded.quantization == "none"
                                   else loaded.model.device)
        self.context_limit = get_context_limit(self.model, self.tokenizer,
                                               config.model.max_context_tokens)
        self.eos_ids = eos_token_ids(self.model, self.tokenizer)
        self._lock = threading.Lock()          # held by one reply, or one swap, at a time
        self._swaps_lock = threading.Lock()    # guards _pending
        self._pending: list[_Swap] = []
        self._adapters = Adapters(self.model)  # touched only under self._lock
        self._raters: dict[str, Rater] = {}   # loaded checkpoints' rating models (best-of-n)
        self.last_swap_pause_ms: float | None = None
        self.last_swap_error: str | None = None

    @classmethod
    def load(cls, config: Config) -> "Engine":
        return cls(load_model(config), config)

    # --- what it is running ---------------------------------------------------------

    @property
    def active_checkpoint_id(self) -> str | None:
        return self._adapters.active

    @property
    def previous_checkpoint_id(self) -> str | None:
        return self._adapters.previous if self._adapters.can_rollback else None

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def warnings(self) -> list[str]:
        out = list(self.loaded.warnings)
        if self.last_swap_error:
            out.append(self.last_swap_error)
        return out

    def describe(self) -> dict[str, Any]:
        return {"model_name": self.loaded.name, "device_in_use": self.loaded.device,
                "dtype": str(self.loaded.dtype).replace("torch.", ""),
                "quantization_in_use": self.loaded.quantization,
                "active_checkpoint": self.active_checkpoint_id or "base",
                "previous_checkpoint": (self._adapters.previous or "base")
                if self._adapters.can_rollback else None,
                "last_swap_pause_ms": self.last_swap_pause_ms,
                "swaps_waiting": len(self._pending),  # requested, to land when a reply ends
                "context_tokens": self.context_limit,
                "best_of": self.best_of_status()}

    def best_of_status(self) -> dict[str, Any]:
        """Best-of-n as it stands (``reinf.serving.best_of.best_of_state``)."""
        active = self._adapters.active
        return best_of_state(self.config.generation.best_of, active, self._rater(active))

    def _rater(self, checkpoint_id: str | None) -> Rater | None:
        return None if checkpoint_id is None else self._raters.get(checkpoint_id)

    # --- replies --------------------------------------------------------------------

    def generation_params(self, *, temperature: float | None = None, top_p: float | None = None,
                          max_new_tokens: int | None = None,
                          seed: int | None = None) -> dict[str, Any]:
        """The effective sampling settings (config defaults filled in), checked."""
        g = self.config.generation
        params = {"temperature": g.temperature if temperature is None else temperature,
                  "top_p": g.top_p if top_p is None else top_p,
                  "max_new_tokens": g.max_new_tokens if max_new_tokens is None else max_new_tokens}
        t, p, n = params["temperature"], params["top_p"], params["max_new_tokens"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.01 <= t <= 5.0:
            raise BadInput(f"temperature must be a number from 0.01 to 5, got {t!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise BadInput(f"top_p must be a number above 0 and at most 1, got {p!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 32_768:
            raise BadInput(f"max_new_tokens must be a whole number from 1 to 32768, got {n!r}")
        params["temperature"], params["top_p"] = float(t), float(p)
        if seed is not None:
            params["seed"] = int(seed)
        return params

    def build_prompt(self, history: Sequence[tuple[str, str]], message: str, *,
                     max_new_tokens: int | None = None, system: str | None = None) -> list[int]:
        """Prompt ids for ``message`` after ``history``, trimmed to this model's context;
        ``max_history`` unset means as many turns as suit this model (resolve_max_history).
        ``system`` is the system prompt, sent first (None: none; never the config's here:
        a conversation snapshots that when it starts, see ChatService)."""
        return build_prompt_ids(self.tokenizer, history, message,
                                max_history=resolve_max_history(self.config.model.max_history,
                                                                self.model_name),
                                max_context_tokens=self.context_limit,
                                max_new_tokens=max_new_tokens or
                                self.config.generation.max_new_tokens, system=system)

    def stream(self, history: Sequence[tuple[str, str]], message: str, *,
               temperature: float | None = None, top_p: float | None = None,
               max_new_tokens: int | None = None, seed: int | None = None,
               system: str | None = None, on_finish=None) -> ReplyStream:
        """Start a reply to ``message`` (after ``system``, the system prompt, if any);
        iterate the stream for text deltas."""
        params = self.generation_params(temperature=temperature, top_p=top_p,
                                        max_new_tokens=max_new_tokens, seed=seed)
        prompt_ids = self.build_prompt(history, message, max_new_tokens=params["max_new_tokens"],
                                       system=system)
        return self.stream_prompt(prompt_ids, params, on_finish=on_finish)

    def stream_prompt(self, prompt_ids: Sequence[int], params: dict[str, Any], *,
                      on_finish=None, ignore_eos: bool = False,
                      adapter: Borrowed | None = None) -> ReplyStream:
        """Start a reply to ready prompt ids with checked ``params`` (see generation_params).

        ``on_finish(reply, error)`` runs in the reply's thread once it ended, after the engine
        lock is released. ``ignore_eos`` (benchmarks) samples exactly max_new_tokens tokens.
        ``adapter`` (see ``borrow``): this reply comes from it instead of the active adapter.
        """
        started = time.perf_counter()
        prompt = self._fitting(prompt_ids, params)
        return ReplyStream(lambda s: self._run(s, prompt, params, started, ignore_eos, adapter),
                           on_finish=on_finish)

    def _fitting(self, prompt_ids: Sequence[int], params: dict[str, Any]) -> list[int]:
        """The prompt as a list of ints; BadInput when it and the reply would not fit."""
        prompt = [int(i) for i in prompt_ids]
        if len(prompt) + params["max_new_tokens"] > self.context_limit:
            raise BadInput(f"prompt of {len(prompt)} tokens plus {params['max_new_tokens']} new "
                           f"ones exceeds the model's context of {self.context_limit} tokens")
        return prompt

    def generate(self, history: Sequence[tuple[str, str]], message: str, **params) -> Reply:
        return self.stream(history, message, **params).wait()

    def _run(self, stream: ReplyStream, prompt: list[int], params: dict, started: float,
             ignore_eos: bool, adapter: Borrowed | None = None) -> Reply:
        with self._generating(), self._lock:
            self._apply_pending()
            try:
                if adapter is None:
                    active = self._adapters.active
                    n = self.config.generation.best_of
                    if n > 1 and not ignore_eos:
                        status = self.best_of_status()
                        if status["active"]:
                            return self._sample_best_of(stream, prompt, params, started,
                                                        active, n, self._rater(active))
                        params = {**params, "best_of": n, "best_of_used": 1,
                                  "best_of_reason": status["reason"]}
                    return self._sample(stream, prompt, params, started, ignore_eos, active)
                with self._adapters.borrowed(adapter.checkpoint_id, adapter.peft_config,
                                             adapter.state_dict):
                    return self._sample(stream, prompt, params, started, ignore_eos,
                                        adapter.checkpoint_id)
            finally:
                self._apply_pending()  # a swap requested during this reply lands now

    @contextlib.contextmanager
    def _generating(self):
        """Generation errors as the person sees them: out of memory names the fix; anything
        unexpected is one line, the traceback goes to the log."""
        try:
            yield
        except (torch.OutOfMemoryError, MemoryError) as exc:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            raise ModelError(f"out of memory while generating on {self.loaded.device}",
                             fix=OOM_FIX) from exc
        except ReinfError:
            raise
        except Exception as exc:  # noqa: BLE001 - the person gets one line, the log the rest
            log.exception("generation failed")
            raise ModelError(f"generation failed: {type(exc).__name__}: {exc}",
                             fix="see the log; `reinf chat --debug` shows the traceback") from exc

    def _generator(self, params: dict) -> torch.Generator:
        """The reply's random generator: seeded by ``params["seed"]`` when given."""
        gen = torch.Generator(device=self.device)
        if params.get("seed") is not None:
            gen.manual_seed(params["seed"])
        else:
            gen.seed()
        return gen

    @torch.inference_mode()
    def _sample(self, stream: ReplyStream, prompt: list[int], params: dict, started: float,
                ignore_eos: bool, checkpoint_id: str | None) -> Reply:
        """``checkpoint_id``: the adapter in place, fixed for the whole reply (a swap needs
        the lock this reply holds)."""
        temperature, top_p = params["temperature"], params["top_p"]
        max_new = params["max_new_tokens"]
        gen = self._generator(params)
        text = Detokenizer(self.tokenizer)
        reply_ids: list[int] = []
        logprobs: list[float] = []
        ttft_ms = None
        finish = "length"
        steps = decode(self.model, [prompt], temperature=temperature, top_p=top_p,
                       max_new_tokens=max_new, generator=gen, eos_ids=self.eos_ids,
                       ignore_eos=ignore_eos)
        while True:
            if stream.stopped and len(reply_ids) < max_new:
                finish = "interrupted"
                break
            step = next(steps, None)  # the forward pass for this token runs here
            if step is None:
                break
            token = int(step.tokens[0])
            reply_ids.append(token)
            logprobs.append(float(step.logprobs[0]))
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - started) * 1000
            if bool(step.ended[0]):
                finish = "stop"
                break
            delta = text.add(token)
            if delta:
                stream.emit(delta)
        steps.close()
        tail = text.flush()
        if tail:
            stream.emit(tail)
        return Reply(text=text.text, prompt_ids=prompt, reply_ids=reply_ids, logprobs=logprobs,
                     checkpoint_id=checkpoint_id, ttft_ms=ttft_ms,
                     latency_ms=(time.perf_counter() - started) * 1000,
                     interrupted=finish == "interrupted", gen_params=dict(params),
                     finish_reason=finish)

    def replies(self, prompts: Sequence[Sequence[int]], params: dict[str, Any]) -> list[Reply]:
        """Replies to several ready prompts from the active adapter, sampled in one batch of
        the same decoder (one random stream, seeded by ``params["seed"]`` when given), each
        recorded as a streamed reply records it. Not streamed and never best-of-n: for
        callers that want many independent replies at once (``ChatService.send_many``,
        the simulated people of ``reinf bench learn``). Raises as ``stream_prompt``."""
        started = time.perf_counter()
        rows = [self._fitting(p, params) for p in prompts]
        if not rows:
            return []
        with self._generating(), self._lock:
            self._apply_pending()  # a swap requested before lands now, as before a reply
            try:
                active = self._adapters.active
                with torch.inference_mode():
                    batch = self._decode_rows(None, rows, params, self._generator(params),
                                              started)
                latency = (time.perf_counter() - started) * 1000
                return [Reply(text=self._text(batch.ids[i], batch.finish[i]), prompt_ids=prompt,
                              reply_ids=batch.ids[i], logprobs=batch.logprobs[i],
                              checkpoint_id=active, ttft_ms=batch.ttft_ms, latency_ms=latency,
                              interrupted=False, gen_params=dict(params),
                              finish_reason=batch.finish[i])
                        for i, prompt in enumerate(rows)]
            finally:
                self._apply_pending()

    def _decode_rows(self, stream: ReplyStream | None, prompts: list[list[int]], params: dict,
                     gen: torch.Generator, started: float) -> "_Rows":
        """Sample a reply to each of ``prompts`` in one batch, until every row ended or
        ``stream`` (if any) was told to stop (``interrupted``: some row was still running).
        The steps stay tensors until the end: one copy to the host per batch, none per token."""
        n, max_new = len(prompts), params["max_new_tokens"]
        tokens, logps, lives = [], [], []
        ended = None
        ttft_ms, interrupted = None, False
        steps = decode(self.model, prompts, temperature=params["temperature"],
                       top_p=params["top_p"], max_new_tokens=max_new, generator=gen,
                       eos_ids=self.eos_ids)
        while True:
            if stream is not None and stream.stopped and len(tokens) < max_new and (
                    ended is None or not bool(ended.all())):
                interrupted = True
                break
            step = next(steps, None)  # one forward pass for every row's next token
            if step is None:
                break
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - started) * 1000
            tokens.append(step.tokens)
            logps.append(step.logprobs)
            lives.append(step.live)
            ended = step.ended if ended is None else ended | step.ended
        steps.close()
        rows = _Rows(ids=[[] for _ in range(n)], logprobs=[[] for _ in range(n)],
                     finish=["length"] * n, ttft_ms=ttft_ms, interrupted=interrupted)
        if tokens:
            ids = torch.stack(tokens, 1).tolist()                 # (n, steps)
            lps = torch.stack(logps, 1).tolist()
            lengths = torch.stack(lives, 1).sum(1).tolist()       # a row's tokens, EOS included
            for i, (done, length) in enumerate(zip(ended.tolist(), lengths)):
                rows.ids[i], rows.logprobs[i] = ids[i][:length], lps[i][:length]
                rows.finish[i] = "stop" if done else "length"
        return rows

    def _text(self, reply_ids: list[int], finish: str) -> str:
        """A sampled reply's text: its tokens, less the final EOS when it stopped there."""
        text = Detokenizer(self.tokenizer)
        for token in reply_ids[:-1] if finish == "stop" else reply_ids:
            text.add(token)
        text.flush()
        return text.text

    @torch.inference_mode()
    def _sample_best_of(self, stream: ReplyStream, prompt: list[int], params: dict,
                        started: float, checkpoint_id: str, n: int, rater: Rater) -> Reply:
        """``n`` replies to ``prompt`` from the active adapter in one batch; the rating model
        keeps one. The caller holds the lock, so the features are taken here (base model,
        adapter off) and not through ``rating_features``, which takes it."""
        rows = self._decode_rows(stream, [prompt] * n, params, self._generator(params), started)
        ids, logprobs, finish = rows.ids, rows.logprobs, rows.finish
        gen_params = {**params, "best_of": n}
        if rows.interrupted:  # Stop before the candidates were done: the first one, as it is
            chosen, scores = 0, None
            gen_params.update(best_of_used=1, best_of_reason="stopped before the candidates "
                              "were done; the first one is kept as it was")
        else:
            kept = [i for i in range(n) if ids[i]]
            scores = [None] * n
            if kept:
                with self._adapters.borrowed(None):  # the rating model reads the base model
                    features = reply_features(self.model, [(prompt, ids[i]) for i in kept])
                predicted = rater.model.score(features, self.config.training.pessimism).tolist()
                for i, score in zip(kept, predicted):
                    scores[i] = round(float(score), 4)
            # the highest score, the first on a tie (an empty candidate never wins)
            chosen = max(range(n), key=lambda i: (-1.0 if scores[i] is None else scores[i], -i))
            gen_params.update(best_of_chosen=chosen, best_of_scores=scores,
                              best_of_checkpoint_id=rater.checkpoint_id)
        text = self._text(ids[chosen], finish[chosen])
        if text:
            stream.emit(text)  # the whole reply at once: it was chosen after sampling
        return Reply(text=text, prompt_ids=prompt, reply_ids=list(ids[chosen]),
                     logprobs=list(logprobs[chosen]), checkpoint_id=checkpoint_id,
                     ttft_ms=rows.ttft_ms, latency_ms=(time.perf_counter() - started) * 1000,
                     interrupted=rows.interrupted,
                     gen_params=gen_params,
                     finish_reason="interrupted" if rows.interrupted else finish[chosen])

    def borrow(self, checkpoint_id: str | None, path: str | Path | None = None) -> Borrowed:
        """The adapter of ``checkpoint_id`` (a PEFT adapter in ``path``; None: the bare base)
        for ``stream_prompt(adapter=...)``. Its weights are read now, outside the lock; a
        broken checkpoint raises ModelError."""
        if checkpoint_id is None:
            return Borrowed(None)
        if path is None:
            if checkpoint_id not in self._adapters:
                raise BadInput(f"checkpoint {checkpoint_id} is not loaded; give its directory")
            return Borrowed(checkpoint_id)
        return Borrowed(checkpoint_id, *read_adapter(Path(path), checkpoint_id))

    def rating_features(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]):
        """The rating model's features (reinf.training.rating_model.reply_features) of
        (prompt_ids, reply_ids) pairs: from the base model, its adapter off, under the engine
        lock (between two replies, as a swap)."""
        with self._lock:
            with self._adapters.borrowed(None):
                return reply_features(self.model, pairs)

    # --- adapters -------------------------------------------------------------------

    def request_swap(self, checkpoint_id: str | None, path: str | Path | None = None, *,
                     wait: bool = True) -> float | None:
        """Make ``checkpoint_id`` (a PEFT adapter in ``path``) the active adapter; None = base.

        The adapter is read from disk now, outside the lock; it is put in place between two
        replies. With ``wait`` this returns once it is in place, with the pause it caused
        (ms). Without, it returns at once (None when a reply is running; the swap lands
        when that reply ends). A broken checkpoint raises ModelError and changes nothing.
        """
        swap = _Swap(checkpoint_id, str(path) if path is not None else None)
        if checkpoint_id is not None and path is not None:
            # Read whenever a directory is given, loaded or not: whether it is still loaded
            # is decided under the lock (_apply_pending), where eviction also happens.
            swap.peft_config, swap.state_dict = read_adapter(Path(path), checkpoint_id)
            if self.config.generation.best_of > 1:  # its rating model, read outside the lock too
                swap.rater = read_rater(checkpoint_id, path,
                                        self.config.training.min_consistency)
        elif checkpoint_id not in self._adapters:
            raise BadInput(f"checkpoint {checkpoint_id} is not loaded; give its directory")
        with self._swaps_lock:
            self._pending.append(swap)
        if wait:
            with self._lock:
                self._apply_pending()
        elif self._lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self._lock.release()
        if swap.error is not None:
            raise swap.error
        return swap.pause_ms

    def _apply_pending(self) -> None:
        """Apply the requested swaps in order. The caller holds self._lock, so the time
        spent here is time generation is paused."""
        with self._swaps_lock:
            pending, self._pending = self._pending, []
        for swap in pending:
            started = time.perf_counter()
            try:
                if swap.checkpoint_id not in self._adapters:
                    if swap.state_dict is None:  # evicted since it was requested, unread
                        raise BadInput(f"checkpoint {swap.checkpoint_id} is no longer loaded",
                                       fix="swap to it again with its directory")
                    self._adapters.add(swap.checkpoint_id, swap.peft_config, swap.state_dict)
                self._adapters.activate(swap.checkpoint_id)
                swap.state_dict = None  # in the model now, or not needed
                if swap.rater is not None:
                    self._raters[swap.checkpoint_id] = swap.rater
                # the rating models of loaded adapters only (active and previous)
                self._raters = {c: r for c, r in self._raters.items() if c in self._adapters}
                self.last_swap_error = None
            except Exception as exc:  # noqa: BLE001 - a bad adapter must not stop the chat
                log.exception("adapter swap to %s failed", swap.checkpoint_id)
                swap.error = exc if isinstance(exc, ReinfError) else ModelError(
                    f"cannot load checkpoint {swap.checkpoint_id}: {exc}",
                    fix="the active adapter is unchanged; check the checkpoint directory")
                self.last_swap_error = str(swap.error)
            finally:
                swap.pause_ms = (time.perf_counter() - started) * 1000
                if swap.error is None:
                    self.last_swap_pause_ms = swap.pause_ms


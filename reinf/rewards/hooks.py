"""The person's reward hook file: find it, run it safely, turn every failure into a HookError.

A hook is user code, so it runs in a child Python process, never in ours:

- a hook that hangs (at import or in a call) is killed, which a thread could never be;
  inside the child ``faulthandler`` fires at the time limit and prints the stack, so the
  error names the line the hook was stuck on;
- each evaluation starts a fresh child that compiles the file's current bytes (sent by the
  parent, the same bytes whose hash the status cache uses). An edit therefore takes effect
  on the very next call, with nothing to reload, and no ``.pyc`` is read or written, so an
  edit within one mtime tick can never be missed;
- the hook's ``print`` goes to stderr; the protocol has its own copy of stdout;
- the child leads its own process group, and the whole group is killed when the evaluation
  ends, so processes the hook started (a ``sleep`` in the background) do not outlive it;
- the child limits itself before running the hook: address space (``hook_memory_mb``), file
  size (``FILE_BYTES``) and CPU time (the time the parent would wait for all its calls);
- an error's text is capped (``MAX_ERROR_CHARS``): it travels into the run's record, both
  logs, ``reinf status`` and the web pages.

Protocol: the parent writes one JSON request to the child's stdin. The child answers with
JSON lines: ``{"ready": ..., "critics": [...]}`` once the file imported, then one
``{"reward": r, "critics": {...}}`` per item, or ``{"error": {"line", "message"}}`` and stops.
Starting a child costs about 0.1 s on a shared 2-core CPU; a round evaluates all its
samples in one child.
"""
from __future__ import annotations

import copy
import faulthandler
import hashlib
import json
import logging
import math
import numbers
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from reinf.errors import HookError

log = logging.getLogger("reinf.rewards.mapper")

FIX = "fix the hook; training is paused until it works"
# Importing a hook may itself import numpy or the like, so it gets more than one call.
IMPORT_TIMEOUT_SECONDS = 10.0
# How much longer than the child's own limit the parent waits before killing it outright
# (Python start-up on a busy machine, and a child whose faulthandler never fired).
SLACK_SECONDS = 10.0
CRITIC_PREFIX = "critic_"
# Longest hook error message kept: a hook that raises with a 5 MB message (say, the whole
# metadata) must not put 5 MB into every status line and page.
MAX_ERROR_CHARS = 2000
# A rating's comment or tag a hook error quotes is replaced by its name ("[the comment of
# turn 12]"), and on forget by FORGOTTEN; shorter texts are left.
MIN_REDACTED = 3
FORGOTTEN = "[forgotten]"
# Resource limits of a hook child (and of what it starts): address space, the default of
# hook_memory_mb; and the largest file it may write, its stderr included.
MEMORY_MB = 4096
FILE_BYTES = 64 * 1024 * 1024
_ROOT = str(Path(__file__).resolve().parents[2])  # the project root, above reinf/


@dataclass(frozen=True)
class HookSpec:
    """``reward_mapper: path/to/file.py:function`` after resolving the path."""
    text: str        # the config value, as written
    path: Path       # absolute
    function: str


@dataclass(frozen=True)
class HookResult:
    rewards: list[float]                   # one per item
    critics: list[dict[str, float]]        # one per item: values of the hook's own critics
    defined_critics: list[str]             # every critic_<name> the file defines


def parse_spec(value: str, data_dir: Path) -> HookSpec | None:
    """None for ``default``; else the file and function. A relative path is taken from the
    data directory; ``file.py`` alone means its ``reward_mapper`` function."""
    text = (value or "").strip()
    if text == "default":
        return None
    path_text, function = text, "reward_mapper"
    head, sep, tail = text.rpartition(":")
    if sep and tail.isidentifier():
        path_text, function = head, tail
    if not path_text.endswith(".py"):
        raise HookError(f"reward_mapper {value!r} is neither 'default' nor "
                        "path/to/file.py:function",
                        fix="set reward_mapper to default or e.g. reward_mapper.py:reward_mapper",
                        key="reward_mapper")
    path = Path(path_text).expanduser()
    if not path.is_absolute():
        path = Path(data_dir).expanduser() / path
    return HookSpec(text, path.resolve(), function)


def read_source(spec: HookSpec) -> tuple[str, str]:
    """The hook file's text and its sha256, or a HookError saying why it cannot be read."""
    try:
        data = spec.path.read_bytes()
    except FileNotFoundError:
        raise build_error(spec.path, None, "file not found",
                     fix="create it (`reinf init` writes a template) or set reward_mapper "
                         "to default") from None
    except OSError as exc:
        raise build_error(spec.path, None,
                          f"cannot read the file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError as exc:
        raise build_error(spec.path, None,
                          f"the file is not UTF-8 text ({exc.reason})") from None


def run_hook(spec: HookSpec, source: str, items: Sequence[tuple[int, dict]],
             labels: Sequence[str], *, critics: Sequence[str], call_timeout: float,
             import_timeout: float = IMPORT_TIMEOUT_SECONDS,
             memory_mb: int = MEMORY_MB) -> HookResult:
    """Call the hook's mapper, and its ``critic_<name>`` for each name in ``critics`` that it
    defines, on every ``(score, metadata)`` item, in one child process.

    Raises HookError naming the file, line and message of the first failure. ``labels``
    name the items in messages ("turn 12").
    """
    request = json.dumps({"path": str(spec.path), "source": source, "function": spec.function,
                          "critics": list(critics), "call_timeout": call_timeout,
                          "import_timeout": import_timeout, "memory_mb": memory_mb,
                          "items": [{"score": s, "metadata": m, "label": label}
                                    for (s, m), label in zip(items, labels)]})
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
               REINF_HOOK_PARENT=str(os.getpid()))
    code = (f"import sys; sys.path.insert(0, {_ROOT!r}); import reinf.rewards.hooks as h; "
            "h.serve_child()")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, env=env,
                                cwd=str(spec.path.parent) if spec.path.parent.is_dir() else None,
                                start_new_session=POSIX)  # its own process group: see _kill
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_feed, args=(proc, request.encode()), daemon=True).start()
        threading.Thread(target=_drain, args=(proc, lines), daemon=True).start()
        try:
            return _collect(spec, proc, lines, err, labels, len(critics), call_timeout,
                            import_timeout)
        except HookError as exc:
            redact_ratings(exc, items, labels)
            raise
        finally:
            _kill(proc)
            proc.wait()
            output = _tail(err, 4000).strip()
            if output:  # the hook's print()s: visible with --debug, never in the results
                log.debug("output of reward hook %s:\n%s", spec.path, output)
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass


POSIX = hasattr(os, "killpg")


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child and every process in its group (what the hook started). Called before
    the child is reaped: until then its pid, which is the group's id, cannot be reused."""
    if proc.returncode is not None:
        return  # reaped: its group was killed before that
    if POSIX:
        try:
            os.killpg(proc.pid, 9)  # SIGKILL; the group outlives a leader that has exited
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already
    if proc.poll() is None:
        proc.kill()


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):  # the child died early; _collect says why
        pass


def _drain(proc: subprocess.Popen, lines: queue.Queue) -> None:
    try:
        for line in proc.stdout:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


def _collect(spec, proc, lines, err, labels, n_critics, call_timeout, import_timeout):
    rewards: list[float] = []
    critic_values: list[dict[str, float]] = []
    defined: list[str] | None = None
    while defined is None or len(rewards) < len(labels):
        waiting = "importing" if defined is None else labels[len(rewards)]
        limit = import_timeout if defined is None else call_timeout
        calls = 1 if defined is None else 1 + n_critics
        try:
            line = lines.get(timeout=limit * calls + SLACK_SECONDS)
        except queue.Empty:
            _kill(proc)
            proc.wait()
            raise _timeout_error(spec, err, waiting, limit) from None
        if line is None:  # the child ended without answering: killed by its own timer, or died
            _kill(proc)
            proc.wait()
            stderr = _tail(err)
            if "Timeout (" in stderr:
                raise _timeout_error(spec, err, waiting, limit)
            last = stderr.strip().splitlines()[-1:] or ["no output"]
            raise build_error(spec.path, None, f"the hook process exited with code "
                              f"{proc.returncode} while {_doing(waiting)} ({last[0][:300]})")
        msg = json.loads(line)
        if "error" in msg:
            raise build_error(spec.path, msg["error"].get("line"), msg["error"]["message"])
        if defined is None:
            defined = list(msg["critics"])
            continue
        rewards.append(float(msg["reward"]))
        critic_values.append({k: float(v) for k, v in msg["critics"].items()})
    return HookResult(rewards, critic_values, defined)


def _doing(waiting: str) -> str:
    return "importing the file" if waiting == "importing" else f"scoring {waiting}"


def _timeout_error(spec: HookSpec, err, waiting: str, limit: float) -> HookError:
    line = None
    for match in re.finditer(r'File "(.*)", line (\d+)', _tail(err)):
        if match.group(1) == str(spec.path):
            line = int(match.group(2))
            break  # faulthandler prints the most recent call first
    setting = "the import limit" if waiting == "importing" else "hook_timeout_seconds"
    return build_error(spec.path, line, f"took longer than {limit:g} s while "
                                        f"{_doing(waiting)} ({setting}); stopped")


def _tail(err, size: int = 20_000) -> str:
    err.flush()
    err.seek(0, os.SEEK_END)
    end = err.tell()
    err.seek(max(0, end - size))
    return err.read().decode("utf-8", "replace")


def build_error(path: Path | str, line: int | None, message: str, *,
                fix: str = FIX) -> HookError:
    """A HookError reading "reward hook <file>:<line>: <message>", the message capped at
    MAX_ERROR_CHARS."""
    where = f"{path}:{line}" if line else f"{path}"
    message = cap(message)
    exc = HookError(f"reward hook {where}: {message}", fix=fix)
    exc.path, exc.line = str(path), line  # for the web UI, which may point at the line
    return exc


def redact_ratings(exc: HookError, items: Sequence[tuple[int, dict]],
                   labels: Sequence[str]) -> None:
    """Take the person's rating comments and tags out of a hook's error, which the hook may
    have quoted (``float(metadata["comment"])``): the message goes into the run's row, the
    logs and ``reinf status``, where a forget would not reach it. Each is named instead
    ("[the comment of turn 12]")."""
    message = exc.message
    for (_, meta), label in zip(items, labels):
        found = [(meta.get("comment"), f"[the comment of {label}]")]
        found += [(tag, f"[a tag of {label}]") for tag in meta.get("tags") or ()]
        for text, name in found:
            message = redact(message, text, name)
    if message != exc.message:
        exc.message = message
        exc.args = (message,)


def redact(message: str, text: Any, name: str = FORGOTTEN) -> str:
    """``message`` with ``text`` (as written, and as Python's repr escapes it) replaced by
    ``name``. Texts shorter than MIN_REDACTED characters are left: they would cut up
    ordinary words and say nothing private."""
    if not isinstance(text, str) or len(text.strip()) < MIN_REDACTED:
        return message
    forms = {text, repr(text)[1:-1]}
    for form in forms:
        message = message.replace(form, name)
    # A message cut at MAX_ERROR_CHARS (``cap``) may end inside the text: the part before
    # the cut is the text's start, and goes too.
    body, sep, tail = message.rpartition(CUT_MARK)
    if sep and tail.endswith(CUT_END):
        for form in forms:
            for k in range(min(len(form), len(body)), MIN_REDACTED - 1, -1):
                if body.endswith(form[:k]):
                    return body[:-k] + name + sep + tail
    return message


CUT_MARK, CUT_END = "… (", " characters in all, cut)"


def cap(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}{CUT_MARK}{len(text):,}{CUT_END}"


# --- the child ------------------------------------------------------------------------------

def _limit_resources(request: dict) -> None:
    """Limit this child, and what it starts, before the hook runs: address space, file
    size, and CPU time (the time the parent would wait for every call). Both the soft and
    the hard limit are set, so the hook cannot raise them again. Where a platform refuses
    one (macOS and RLIMIT_AS), the wall-clock timers still apply."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    calls = len(request["items"]) * (1 + len(request["critics"]))
    cpu = math.ceil(request["import_timeout"] + calls * request["call_timeout"] + SLACK_SECONDS)
    limits = [(resource.RLIMIT_FSIZE, FILE_BYTES), (resource.RLIMIT_CPU, cpu)]
    if request.get("memory_mb"):
        limits.append((resource.RLIMIT_AS, int(request["memory_mb"]) * 1024 * 1024))
    for what, value in limits:
        _, hard = resource.getrlimit(what)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            pass


def _die_with_parent() -> None:
    """On Linux, be killed with the process that asked for the evaluation: a hung hook
    must not outlive a trainer or server that was killed with SIGKILL."""
    try:
        import ctypes
        import ctypes.util
        import signal

        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's timeout still kills us
        return
    parent = os.environ.get("REINF_HOOK_PARENT")
    if parent and os.getppid() != int(parent):  # the parent died before prctl took effect
        os._exit(1)


def serve_child() -> None:
    """Entry point of the child process (see the module docstring for the protocol)."""
    _die_with_parent()
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # the hook's print() lands on stderr, never in the protocol
    sys.stdout = sys.stderr
    request = json.loads(sys.stdin.buffer.read())
    sys.stdin = open(os.devnull)
    _limit_resources(request)

    def send(obj: dict) -> None:
        proto.write((json.dumps(obj) + "\n").encode())

    path = request["path"]
    module = types.ModuleType("reward_hook")
    module.__file__ = path
    sys.modules["reward_hook"] = module
    sys.path.insert(0, os.path.dirname(path))  # so the hook can import its sibling files
    faulthandler.dump_traceback_later(request["import_timeout"], exit=True, file=sys.stderr)
    try:
        exec(compile(request["source"], path, "exec"), module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a hook is a failure too
        faulthandler.cancel_dump_traceback_later()
        return send({"error": _describe(exc, path, "while importing the file")})
    faulthandler.cancel_dump_traceback_later()
    names = dict(vars(module))
    mapper = names.get(request["function"])
    if not callable(mapper):
        found = sorted(n for n, v in names.items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == "reward_hook")
        return send({"error": {"line": None, "message": (
            f"no function {request['function']}() in the file" if mapper is None
            else f"{request['function']} is not a function")
            + (f" (it defines: {', '.join(found)})" if found else "")}})
    defined = sorted(n[len(CRITIC_PREFIX):] for n, v in names.items()
                     if n.startswith(CRITIC_PREFIX) and callable(v))
    send({"ready": True, "critics": defined})
    wanted = [c for c in request["critics"] if c in defined]
    for item in request["items"]:
        meta = item["metadata"]
        label = item["label"]
        reward = _call(mapper, (item["score"], copy.deepcopy(meta)), request, path, label, None)
        if isinstance(reward, dict):
            return send(reward)
        values = {}
        for name in wanted:
            fn = names[CRITIC_PREFIX + name]
            value = _call(fn, (meta["prompt"], meta["response"], copy.deepcopy(meta)), request,
                          path, label, (-1.0, 1.0))
            if isinstance(value, dict):
                return send(value)
            values[name] = value
        send({"reward": reward, "critics": values})


def _call(fn, args, request, path, label, bounds):
    """One call under the time limit: the value as a float, or an ``{"error": ...}`` message."""
    faulthandler.dump_traceback_later(request["call_timeout"], exit=True, file=sys.stderr)
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001
        faulthandler.cancel_dump_traceback_later()
        return {"error": _describe(exc, path, f"in {fn.__name__}() for {label}")}
    faulthandler.cancel_dump_traceback_later()
    line = getattr(getattr(fn, "__code__", None), "co_firstlineno", None)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        problem = f"returned {_show(value)} ({type(value).__name__})"
    elif not math.isfinite(float(value)):
        problem = f"returned {float(value)}"
    elif bounds and not bounds[0] <= float(value) <= bounds[1]:
        problem = f"returned {float(value):g}, outside [-1, 1]"
    else:
        return float(value)
    kind = "a number in [-1, 1]" if bounds else "a finite number"
    return {"error": {"line": line, "message": f"{fn.__name__}() {problem} for {label}; "
                                               f"it must return {kind}"}}


def _describe(exc: BaseException, path: str, context: str) -> dict:
    """``{"line", "message"}`` for an exception, with the line in the hook file."""
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return {"line": exc.lineno, "message": f"{type(exc).__name__}: {exc.msg} ({context})"}
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == path:
            line = frame.lineno  # keep the innermost frame in the hook file
    text = cap(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    if isinstance(exc, SyntaxError) and exc.filename:
        text += f" ({exc.filename}:{exc.lineno})"
    return {"line": line, "message": f"{text} ({context})"}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


TEMPLATE = '''\
"""Your reward mapper: how a 1-5 rating becomes the reward Reinf trains on.

This file is NOT used until you switch it on. In config.yaml (in this directory) set

    rewards:
      reward_mapper: reward_mapper.py:reward_mapper

(a relative path is looked up in the data directory). From then on every training round
and `reinf rewards preview` read this file as it is at that moment: save, and the next
preview or round uses the new version; nothing needs restarting. Check an edit with

    reinf rewards preview

If the file is broken (a syntax error, an exception, a value that is not a finite number,
a call slower than hook_timeout_seconds), ratings are still stored, but training is paused
and `reinf status`, the web UI and the log show the file, line and message. Reinf never
falls back to another mapper behind your back.

The contract:  reward_mapper(score, metadata: dict) -> float
  score             1 (bad) .. 5 (great): your rating, a whole number; or, for the fresh
                    replies a round samples and nobody rated, the rating model's
                    prediction of your rating, a number such as 3.7
  metadata keys     prompt, response (text); response_length {"tokens", "chars"};
                    prompt_length {"tokens", "chars"}; tags (list), comment, critical (bool);
                    rated_at, created_at (ISO 8601, UTC); age_seconds, age_days (since the
                    rating); conversation_id, turn_index, turn_id, user_id; checkpoint_id
                    (the adapter that wrote the reply, "base" for none); temperature;
                    settings (the rewards section of the config, as a dict);
                    predicted (true: score is the rating model's guess, not yours)
What you return is combined with any enabled critics and clipped to [reward_min,
reward_max]. Older ratings count less through a separate weight (half_life_days); the
mapper does not apply it.
"""
from reinf.rewards.mapper import default_reward

BREVITY_CHARS = 200   # good replies shorter than this...
BREVITY_BONUS = 0.1   # ...earn this much extra; set to 0 to turn it off


def reward_mapper(score, metadata):
    # The built-in mapping: (score - 3) / 2, the critical bonus and the tag adjustments,
    # with the values from config.yaml (critical_bonus, tag_adjustments).
    reward = default_reward(score, metadata)

    # Example: a brevity bonus. Good replies (4 or 5) that are short earn a little more.
    if score >= 4 and metadata["response_length"]["chars"] < BREVITY_CHARS:
        reward += BREVITY_BONUS
    return reward


# A custom critic scores a reply without you: any function named critic_<name> taking
# (prompt, response, metadata) and returning a number from -1 (bad) to 1 (good). It runs only
# when config.yaml gives it a weight, beside the built-in ones (length, repetition, format):
#
#     rewards:
#       critics: {politeness: 0.5}
#       critic_combine: weighted_average   # or min, or consensus
def critic_politeness(prompt, response, metadata):
    text = response.lower()
    if "thank" in text or "glad to help" in text:
        return 0.5
    return 0.0
'''

"""Measure a running ``reinf serve`` from outside, as a person's browser would see it.

- :func:`measure_chat_latency`: time to first token (TTFT) and whole-reply latency of
  streamed replies (``POST /api/chat`` with ``stream: true``), measured by the client:
  from sending the request to the first text delta;
- :func:`compare_training_latency`: the same, with the trainer idle and then while a
  round runs (it starts one with ``POST /api/train``), and their ratio;
- :func:`measure_rating_to_swap`: from the response to the ``train_after_ratings``-th
  rating to the moment the engine serves the new checkpoint.

Each reply starts a new conversation, so prompts stay the same length. Standard library
only, never through a proxy. ``python -m reinf.bench.loadtest --url URL`` prints a report; a
benchmark is a command that measures, never a timed test.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass
from typing import Any, Callable

PROMPTS = ("What is the capital of France?", "How do I boil an egg?", "Tell me about cats.",
           "What is 7 plus 5?", "Give me a tip for sleeping better.")


@dataclass
class Sample:
    ttft_ms: float | None          # client: request sent -> first delta (None: no text)
    latency_ms: float              # client: request sent -> "done" event
    server_ttft_ms: float | None   # what the engine recorded for the turn
    tokens: int
    checkpoint_id: str | None
    training: bool | None = None   # a round ran before and after this reply


class Client:
    """JSON and SSE over one base URL (``http://127.0.0.1:8765``)."""

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 120.0):
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.timeout = timeout
        self.headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def _open(self, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers=self.headers)
        return conn.getresponse()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict]:
        response = self._open(method, path, body)
        try:
            raw = response.read()
            return response.status, json.loads(raw or b"{}")
        finally:
            response.close()

    def status(self) -> dict:
        code, data = self.call("GET", "/api/status")
        if code != 200:
            raise RuntimeError(f"GET /api/status answered {code}: {data}")
        return data

    def stream_chat(self, message: str, **params: Any) -> Sample:
        """One streamed reply; times measured here, on the client."""
        started = time.perf_counter()
        response = self._open("POST", "/api/chat", {"message": message, "stream": True, **params})
        try:
            if response.status != 200:
                raise RuntimeError(f"POST /api/chat answered {response.status}: "
                                   f"{response.read()[:300]!r}")
            first, done, event = None, None, None
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if event == "error":
                        raise RuntimeError(f"the reply failed: {data}")
                    if event is None and data.get("delta") and first is None:
                        first = time.perf_counter()
                    if event == "done":
                        done = data
                elif not line:
                    event = None
                if done is not None:
                    break
        finally:
            response.close()
        if done is None:
            raise RuntimeError("the stream ended without a 'done' event")
        ended = time.perf_counter()
        ckpt = done.get("checkpoint_id")
        return Sample(ttft_ms=(first - started) * 1000 if first else None,
                      latency_ms=(ended - started) * 1000, server_ttft_ms=done.get("ttft_ms"),
                      tokens=done.get("reply_tokens") or 0,
                      checkpoint_id=None if ckpt in (None, "base") else ckpt)


def is_training(client: Client) -> bool:
    schedule = client.status().get("schedule") or {}
    return bool(schedule.get("training"))


def measure_chat_latency(url: str, n: int = 20, *, token: str | None = None,
                         max_new_tokens: int | None = None, track_training: bool = False,
                         stop: Callable[[list[Sample]], bool] | None = None
                         ) -> dict[str, Any]:
    """``n`` streamed replies, one after another -> {"ttft_ms": {p50, p90, mean, ...},
    "latency_ms": {...}, "samples": [...]}. ``track_training`` marks each sample with
    whether a round ran before and after it; ``stop(samples)`` may end early."""
    client = Client(url, token=token)
    params = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
    samples: list[Sample] = []
    for i in range(n):
        before = is_training(client) if track_training else None
        sample = client.stream_chat(PROMPTS[i % len(PROMPTS)], **params)
        if track_training:
            sample.training = bool(before and is_training(client))
        samples.append(sample)
        if stop is not None and stop(samples):
            break
    return summarize(samples)


def compare_training_latency(url: str, n: int = 20, *, token: str | None = None,
                             max_new_tokens: int | None = None,
                             start_timeout: float = 120.0) -> dict[str, Any]:
    """TTFT with the trainer idle, then while a round runs (started here with
    ``POST /api/train`` {"force": true}); "ratio" is training p50 / idle p50. Only replies
    that a round ran both before and after count as "training"; if the round ends
    before ``n`` of them, fewer are reported (see "training"."n")."""
    client = Client(url, token=token)
    if is_training(client):
        raise RuntimeError("a round is already running; measure the idle figures first")
    idle = measure_chat_latency(url, n, token=token, max_new_tokens=max_new_tokens)
    code, answer = client.call("POST", "/api/train", {"force": True})
    if code != 202:
        raise RuntimeError(f"POST /api/train answered {code}: {answer}")
    deadline = time.monotonic() + start_timeout
    while True:  # wait for the child, not just the queued job
        schedule = client.status().get("schedule") or {}
        if schedule.get("current_run_id"):
            break
        if not schedule.get("training") or time.monotonic() > deadline:
            raise RuntimeError(f"the round did not start: {schedule.get('last_result')}")
        time.sleep(0.1)
    during: list[Sample] = []

    def enough(samples: list[Sample]) -> bool:
        during[:] = [s for s in samples if s.training]
        return len(during) >= n or not samples[-1].training

    measured = measure_chat_latency(url, 4 * n, token=token, max_new_tokens=max_new_tokens,
                                    track_training=True, stop=enough)
    training = summarize(during)
    result = (client.status().get("schedule") or {}).get("last_result")
    ratio = None
    if idle["ttft_ms"]["p50"] and training["ttft_ms"].get("p50"):
        ratio = training["ttft_ms"]["p50"] / idle["ttft_ms"]["p50"]
    return {"idle": idle, "training": training, "ratio_p50": ratio,
            "replies_after_round": len(measured["samples"]) - len(during),
            "round": result}


def measure_rating_to_swap(url: str, *, token: str | None = None, timeout: float = 600.0,
                           max_new_tokens: int = 24) -> dict[str, Any]:
    """Chat ``train_after_ratings`` turns, rate them 5, and time from the response to the
    last rating until the engine serves a new checkpoint. The server must schedule
    rounds (no --no-train) and have no rating waiting."""
    client = Client(url, token=token)
    status = client.status()
    needed = status["train_after_ratings"]
    waiting = status["ratings_waiting"]
    if needed <= 0 or waiting:
        raise RuntimeError(f"needs train_after_ratings > 0 and no rating waiting "
                           f"(train_after_ratings {needed}, waiting {waiting})")
    before = status["model"].get("active_checkpoint")
    turns = []
    for i in range(needed):
        code, turn = client.call("POST", "/api/chat", {"message": PROMPTS[i % len(PROMPTS)],
                                                       "max_new_tokens": max_new_tokens})
        if code != 200:
            raise RuntimeError(f"POST /api/chat answered {code}: {turn}")
        turns.append(turn["turn_id"])
    for turn_id in turns:
        code, data = client.call("PUT", f"/api/turns/{turn_id}/rating", {"score": 5})
        if code != 200:
            raise RuntimeError(f"PUT rating answered {code}: {data}")
    rated = time.perf_counter()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.status()
        active = status["model"].get("active_checkpoint")
        if active != before:
            return {"seconds": time.perf_counter() - rated, "checkpoint_id": active,
                    "previous": before, "round": (status.get("schedule") or {}).get("last_result")}
        last = (status.get("schedule") or {}).get("last_result") or {}
        if not (status.get("schedule") or {}).get("training") and \
                last.get("status") in ("failed", "rejected") and last.get("trigger") == "ratings":
            raise RuntimeError(f"the round did not succeed: {last.get('message')}")
        time.sleep(0.05)
    raise RuntimeError(f"no new checkpoint within {timeout:.0f} s")


# --- figures ------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def describe(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "mean": statistics.fmean(values) if values else None,
            "max": max(values) if values else None}


def summarize(samples: list[Sample]) -> dict[str, Any]:
    return {"ttft_ms": describe([s.ttft_ms for s in samples if s.ttft_ms is not None]),
            "latency_ms": describe([s.latency_ms for s in samples]),
            "server_ttft_ms": describe([s.server_ttft_ms for s in samples
                                        if s.server_ttft_ms is not None]),
            "samples": [asdict(s) for s in samples]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinf.bench.loadtest",
                                     description="Chat latency of a running reinf serve.")
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    parser.add_argument("--token", help="auth_token, when the server requires one")
    parser.add_argument("--n", type=int, default=20, help="replies per measurement")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--during-training", action="store_true",
                        help="also measure while a round runs (starts one) and give the ratio")
    parser.add_argument("--rating-to-swap", action="store_true",
                        help="time from the Nth rating to the swapped-in checkpoint")
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    args = parser.parse_args(argv)
    if args.rating_to_swap:
        out = measure_rating_to_swap(args.url, token=args.token)
        text = f"rating -> swapped-in checkpoint: {out['seconds']:.2f} s ({out['checkpoint_id']})"
    elif args.during_training:
        out = compare_training_latency(args.url, args.n, token=args.token,
                                       max_new_tokens=args.max_new_tokens)
        idle, busy = out["idle"]["ttft_ms"], out["training"]["ttft_ms"]
        text = (f"TTFT idle     p50 {fmt(idle['p50'])} ms  p90 {fmt(idle['p90'])} ms  "
                f"(n {idle['n']})\nTTFT training p50 {fmt(busy['p50'])} ms  p90 "
                f"{fmt(busy['p90'])} ms  (n {busy['n']})\nratio p50     {fmt(out['ratio_p50'])}")
    else:
        out = measure_chat_latency(args.url, args.n, token=args.token,
                                   max_new_tokens=args.max_new_tokens)
        t = out["ttft_ms"]
        text = f"TTFT p50 {fmt(t['p50'])} ms  p90 {fmt(t['p90'])} ms  (n {t['n']})"
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(text)
    return 0


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())

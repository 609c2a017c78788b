"""Helpers for tests that drive a real engine."""
from __future__ import annotations

import threading


def hold_after_first_token(engine, monkeypatch):
    """Make the next reply pause after its first token until ``gate`` is set;
    ``held`` is set once it is paused there. The reply never samples EOS, so only the
    test ends it early (a random tiny model picks EOS now and then)."""
    gate, held, forward, calls = threading.Event(), threading.Event(), engine.model.forward, []
    eos = list(engine.eos_ids)

    def gated(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            held.set()
            assert gate.wait(30)
        out = forward(*args, **kwargs)
        out.logits[..., eos] = float("-inf")
        return out
    monkeypatch.setattr(engine.model, "forward", gated)
    return gate, held

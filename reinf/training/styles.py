"""Styled rollouts (``training.styled_rollouts``): some of a round's fresh replies are asked for
in a given style, so the rating model can show the policy ways of answering it seldom picks.

A round's rollouts come from the policy as it is. Where it almost never writes what the
person wants (a list, an example, one short sentence), its replies to one prompt do not
differ in that, and however well the rating model has learnt the person's taste, RLOO has
nothing to push towards (docs/training.md, "Styled rollouts"). So, for each rollout prompt,
``styled_rollouts`` of its ``rollouts_per_prompt`` replies are sampled with a style
instruction from a list appended to the person's message ("Use a bulleted list."). The
rating model scores every reply against the prompt *without* the instruction, and PPO
trains on it without the instruction too: a styled reply the rating model likes better
than the plain ones becomes more likely as a plain answer to that prompt, one it likes less
becomes less likely. Nothing styled is shown to anyone or stored.

The instruction goes at the end of the last user message, in token space: the prompt's ids
up to the chat template's closing tokens (``template_tail``), the instruction's ids, then
the tail. A prompt that does not end with the tail (a template this cannot read) is sampled
plainly. The built-in list covers common axes of reply style and is not tuned on any rater;
a person can give their own (``training.styles_file``, one instruction a line).

**Exploring styles** (``generation.explore_styles``, ``Explorer``): the same splice for a
share of the *served* replies, so the person's ratings see the styles at all. The chat
service stores such a reply under the plain prompt, with the instruction in its
``gen_params``; PPO reads it with the round-start pass as its behaviour policy
(``Sample.styled``).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from reinf.errors import BadInput

#: The built-in instructions: length, structure, register, examples, directness, tone,
#: questions back, reasoning. One of them is drawn (without repeats within a prompt) for
#: each styled reply.
BUILTIN_STYLES = (
    "Answer in one or two sentences.",
    "Give a thorough, detailed answer.",
    "Use a bulleted list.",
    "Use numbered steps.",
    "Include a concrete example.",
    "Write in a formal, professional tone.",
    "Write in a casual, friendly tone.",
    "Start with the direct answer, then explain.",
    "Use simple, everyday words.",
    "Keep every sentence short.",
    "Explain your reasoning step by step.",
    "Be warm and encouraging.",
    "Include numbers or figures where they help.",
    "End by asking a follow-up question.",
    "Answer in a single paragraph.",
    "Do not ask any questions.",
)

#: Longest instruction accepted from a styles file, in characters.
MAX_STYLE_CHARS = 500


def load_styles(path: str | None) -> list[str]:
    """The instructions of ``training.styles_file`` (one a line; blank lines and lines
    starting with ``#`` skipped), or the built-in list when it is null."""
    if not path:
        return list(BUILTIN_STYLES)
    file = Path(path).expanduser()
    fix = ("point training.styles_file at a UTF-8 text file with one style instruction a "
           "line, or set it to null for the built-in list")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"training.styles_file {str(file)!r} cannot be read: {exc}", fix=fix) \
            from exc
    styles = [line.strip() for line in text.splitlines()
              if line.strip() and not line.strip().startswith("#")]
    if not styles:
        raise BadInput(f"training.styles_file {str(file)!r} has no instructions", fix=fix)
    long = next((s for s in styles if len(s) > MAX_STYLE_CHARS), None)
    if long is not None:
        raise BadInput(f"training.styles_file {str(file)!r}: an instruction is longer than "
                       f"{MAX_STYLE_CHARS} characters ({long[:40]!r}...)", fix=fix)
    return styles


def template_tail(tokenizer) -> list[int]:
    """The ids the chat template puts after the text of the last user message (the end of
    the user turn and the assistant header): the common suffix of two rendered messages."""
    from reinf.model.modeling import render_chat

    a = render_chat(tokenizer, [], "Hello there.")
    b = render_chat(tokenizer, [], "What is the time")
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:]


def with_instruction(prompt_ids: Sequence[int], instruction_ids: Sequence[int],
                     tail: Sequence[int]) -> list[int] | None:
    """``prompt_ids`` with ``instruction_ids`` at the end of its last user message, or None
    when the prompt does not end with the template's ``tail``."""
    n = len(tail)
    if n == 0 or len(prompt_ids) <= n or list(prompt_ids[-n:]) != list(tail):
        return None
    return list(prompt_ids[:-n]) + list(instruction_ids) + list(tail)


def instruction_ids(tokenizer, style: str) -> list[int]:
    """The ids an instruction adds to the end of a user message: a blank line, then it."""
    return tokenizer.encode("\n\n" + style, add_special_tokens=False)


class Explorer:
    """``generation.explore_styles``: which served replies are asked for in a style.

    ``draw`` decides for one reply: with probability ``share`` the prompt's ids get an
    instruction from ``styles`` at the end of the last user message (as a styled rollout's
    do); otherwise, or where the template cannot be read or the styled prompt would not
    fit in ``limit`` tokens, the prompt is sampled as it is. A ``seed`` makes the draw
    repeatable (``key`` tells apart the replies of one seeded call); without one it comes
    from the explorer's own random stream. The chat service stores the reply under the
    plain prompt, with the instruction in its ``gen_params``, so the person's rating of it
    is a rating of an answer to what they wrote."""

    def __init__(self, tokenizer, styles: Sequence[str], share: float):
        self.tokenizer = tokenizer
        self.styles = list(styles)
        self.share = float(share)
        self._tail: list[int] | None = None
        self._ids: dict[str, list[int]] = {}  # each instruction's ids, encoded once
        self._rng = random.Random()

    def draw(self, prompt_ids: Sequence[int], *, limit: int | None = None,
             seed: int | None = None, key: str = "") -> tuple[list[int], str | None]:
        """(the ids to sample from, the instruction or None)."""
        plain = list(prompt_ids)
        rng = self._rng if seed is None else random.Random(f"{seed}-explore-{key}")
        if not self.styles or rng.random() >= self.share:
            return plain, None
        style = rng.choice(self.styles)
        if self._tail is None:
            self._tail = template_tail(self.tokenizer)
        if style not in self._ids:
            self._ids[style] = instruction_ids(self.tokenizer, style)
        styled = with_instruction(plain, self._ids[style], self._tail)
        if styled is None or (limit is not None and len(styled) > limit):
            return plain, None
        return styled, style


def styled_contexts(tokenizer, prompts: Sequence[Sequence[int]], k: int, styled: int,
                    styles: Sequence[str], *, seed: int, limit: int
                    ) -> tuple[list[list[int]], list[int], list[str | None]]:
    """What to sample, one reply each, for ``k`` replies to each of ``prompts`` of which
    ``styled`` carry an instruction: (contexts, the prompt each belongs to, its instruction
    or None). Instructions are drawn with ``seed``, without repeats within a prompt while
    the list lasts. A prompt the template cannot be read in, or whose styled context is
    longer than ``limit`` tokens (the room left for a reply), is sampled plainly."""
    rng = random.Random(f"{seed}-styles")
    tail = template_tail(tokenizer)
    encoded = {s: instruction_ids(tokenizer, s) for s in styles}
    contexts, owners, used = [], [], []
    for g, prompt in enumerate(prompts):
        drawn = rng.sample(list(styles), min(styled, len(styles)))
        drawn += [rng.choice(list(styles)) for _ in range(styled - len(drawn))]
        for i in range(k):
            style = drawn[i - (k - styled)] if i >= k - styled else None
            context = None if style is None else with_instruction(prompt, encoded[style], tail)
            if context is not None and len(context) > limit:
                context = None
            contexts.append(list(prompt) if context is None else context)
            owners.append(g)
            used.append(None if context is None else style)
    return contexts, owners, used

"""Stored text on a terminal: a message, a reply or a tag may carry escape sequences (from a
model, a pasted text, an API client); the CLI prints none of them, only the text around.

Real SQLite store, the real CLI in-process; the payloads are what a hostile reply would
send: set the clipboard (OSC 52), plant a link (OSC 8), retitle the window (OSC 0),
recolour or clear the screen (CSI, 7-bit and C1), reset the terminal, reorder text (bidi).
"""
from __future__ import annotations

import json
import re

import pytest

from reinf.cli.common import dump_json, strip_escapes

PAYLOADS = {
    "osc52 bel": ("copy\x1b]52;c;ZWNobyBwd25lZA==\x07 me", "copy me"),
    "osc52 st": ("copy\x1b]52;c;ZWNobyBwd25lZA==\x1b\\ me", "copy me"),
    "osc8 link": ("\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ here", "click here"),
    "osc0 title": ("\x1b]0;owned\x07title", "title"),
    "c1 osc": ("\x9d0;owned\x9ctitle", "title"),
    "csi": ("\x1b[2J\x1b[1;31mred\x1b[0m", "red"),
    "c1 csi": ("\x9b2J\x9b31mred\x9b0m", "red"),
    "dcs": ("\x1bP+q544e\x1b\\dcs", "dcs"),
    "reset": ("\x1bcreset", "reset"),
    "cr and backspace": ("safe\rfake\x08!", "safefake!"),
    "bidi": ("abc\u202edcb\u202c", "abcdcb"),
    "lone esc": ("end\x1b", "end"),
}
# Anything a terminal acts on: C0 but newline and tab, DEL, C1, the bidi controls.
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HIDDEN = ("52;c", "evil.example", "owned", "2J", "31m", "+q544e")


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_every_sequence_goes_whole_and_the_text_stays(name):
    raw, shown = PAYLOADS[name]
    assert strip_escapes(raw) == shown


def test_newlines_tabs_and_unicode_text_stay():
    text = "line one\n\tcafé — 😀 ‍ non\u00a0breaking, 日本語"
    assert strip_escapes(text) == text


def stored_turns(store):
    conv = store.create_conversation().id
    ids = []
    for name, (raw, _) in sorted(PAYLOADS.items()):
        turn = store.append_turn(conv, f"ask {raw}", f"reply {raw}", reply_ids=[1, 2],
                                 logprobs=[-1.0, -1.0])  # trainable: rewards preview shows it
        store.rate(turn.id, 4, tags=[f"tag {raw}"[:60]])
        ids.append(turn.id)
    return ids


def test_history_prints_no_escape_from_stored_text(store, invoke):
    stored_turns(store)
    out = invoke("history", "--limit", "100").stdout
    assert CONTROLS.findall(out) == []
    assert not [h for h in HIDDEN if h in out]
    assert "you: ask copy me" in out and "bot: reply click here" in out
    assert "[tag red]" in out


def test_rewards_preview_prints_no_escape_from_tags(store, invoke):
    stored_turns(store)
    out = invoke("rewards", "preview", "--limit", "100").stdout
    assert CONTROLS.findall(out) == []
    assert "tag copy me" in out and "52;c" not in out


def test_json_output_keeps_the_text_but_escapes_what_a_terminal_acts_on(store, invoke):
    stored_turns(store)
    out = invoke("history", "--json", "--limit", "100").stdout
    assert CONTROLS.findall(out) == []  # C0 by json.dumps, C1 and bidi by dump_json
    replies = {t["reply"] for t in json.loads(out)}
    assert replies == {f"reply {raw}" for raw, _ in PAYLOADS.values()}  # nothing lost
    exported = invoke("export").stdout
    assert CONTROLS.findall(exported) == []
    assert {json.loads(line)["reply"] for line in exported.splitlines()} == replies
    assert dump_json({"a": "\x9b\u2028é"}) == '{"a": "\\u009b\\u2028é"}'


def test_an_error_quoting_a_hook_prints_no_escape(store, invoke, home, monkeypatch):
    """The one error boundary strips too: a reward hook's exception message is text from
    a file Reinf did not write."""
    stored_turns(store)
    hook = home / "mapper.py"
    hook.write_text("def reward_mapper(score, metadata):\n"
                    "    raise ValueError('bad \\x1b]0;owned\\x07\\x9b2Jscore')\n")
    monkeypatch.setenv("REINF_REWARD_MAPPER", f"{hook}:reward_mapper")
    out = invoke("rewards", "preview")
    assert out.exit_code == 1
    assert "bad score" in out.output and CONTROLS.findall(out.output) == []

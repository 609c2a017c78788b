"""`reinf chat` as a real terminal program (pexpect) and as a script (`--once --json`)."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import pexpect
import pytest

from conftest import clean_env
from reinf.cli.chat import TURN_FIELDS
from reinf.cli.repl import LEAVE_HINT, RATE_PROMPT, USER_PROMPT
from reinf.config import load_config
from reinf.errors import ReinfError
from reinf.storage.store import Store
from tiny import make_adapter, make_tiny_model
from webui_fakes import FakeChatService
from webui_fakes import app, build_daemon, daemon, live  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e
REINF = [sys.executable, "-m", "reinf"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("repl") / "tiny", seed=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_env(home, model, **extra):
    # REINF_PORT: a port where no daemon listens, so chat runs the model in-process
    return clean_env(home, REINF_MODEL_PATH=str(model), REINF_PORT=str(free_port()), **extra)


def open_store(home) -> Store:
    return Store.open(load_config(environ={"REINF_HOME": str(home)}))


def default_sigint() -> None:
    # As from a terminal. A shell starts background jobs with SIGINT ignored, and an ignored
    # signal stays ignored across exec (Python then leaves it so): a suite run with `&`
    # would hand that to the chat, and Ctrl-C would never arrive.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn_chat(home, env, tmp_path):
    child = pexpect.spawn(REINF[0], REINF[1:] + ["chat"], env=env, cwd=str(tmp_path),
                          encoding="utf-8", timeout=120, dimensions=(40, 200),
                          preexec_fn=default_sigint)
    child.expect_exact(USER_PROMPT)
    return child


def test_chat_rate_undo_quit_in_a_terminal(tiny, home, tmp_path):
    child = spawn_chat(home, chat_env(home, tiny, REINF_MAX_NEW_TOKENS="8"), tmp_path)
    child.sendline("Hello there")
    child.expect_exact("bot> ")
    child.expect_exact(RATE_PROMPT)
    child.sendline("4 too long,wrong")
    child.expect_exact("rated turn 1: 4 [too long, wrong]")
    child.expect_exact(USER_PROMPT)
    child.sendline("Second question")
    child.expect_exact(RATE_PROMPT)
    child.sendline("great")
    child.expect_exact("'great' is not a score")
    child.expect_exact(RATE_PROMPT)
    child.sendline("")  # Enter skips
    child.expect_exact(USER_PROMPT)
    child.sendline("/rate 2 wrong")
    child.expect_exact("rated turn 2: 2 [wrong]")
    child.sendline("/undo")
    child.expect_exact("removed rating 2 from turn 2")
    child.sendline("/history")
    child.expect_exact("#1 ★4 [too long, wrong]")
    child.expect_exact("#2 unrated")
    child.expect_exact(USER_PROMPT)
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    store = open_store(home)
    first, second = store.history(limit=None, oldest_first=True)
    assert first.conversation_id == second.conversation_id
    assert (first.rating.score, first.rating.tags) == (4, ["too long", "wrong"])
    assert second.rating is None and not second.interrupted
    # one log-prob per reply token, at most max_new_tokens of them (the random model may
    # sample EOS before the 8th: CI once saw a 2-token reply)
    assert 1 <= len(second.reply_ids) == len(second.logprobs) <= 8
    assert second.gen_params["max_new_tokens"] == 8 and second.model == tiny.name
    # the second prompt carried the first turn, through the chat template
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny)
    assert tok.decode(second.prompt_ids) == (
        f"<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n{first.reply}"
        "<|im_end|>\n<|im_start|>user\nSecond question<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory):
    # At temperature 0.01 this random model repeats one token and never picks EOS: a reply
    # that runs until it is stopped.
    return make_tiny_model(tmp_path_factory.mktemp("repl") / "long", seed=0, max_positions=4096)


def test_ctrl_c_stops_a_reply_and_keeps_it_marked_interrupted(long_tiny, home, tmp_path):
    env = chat_env(home, long_tiny, REINF_MAX_NEW_TOKENS="3000", REINF_TEMPERATURE="0.01")
    child = spawn_chat(home, env, tmp_path)
    child.sendline("Tell me a long story")
    child.expect_exact("bot> ")
    time.sleep(0.1)  # the reply is streaming now (3000 tokens take well over a second)
    child.sendintr()
    child.expect(r"stopped after (\d+) tokens; kept as turn (\d+), marked interrupted",
                 timeout=30)
    tokens, turn_id = int(child.match.group(1)), int(child.match.group(2))
    child.expect_exact(RATE_PROMPT)
    child.sendline("1")
    child.expect_exact(f"rated turn {turn_id}: 1")
    child.expect_exact(USER_PROMPT)
    child.send("half a line")
    child.sendintr()  # Ctrl-C at the prompt clears the line, as in Python's REPL
    child.expect_exact(LEAVE_HINT)
    child.expect_exact(USER_PROMPT)
    child.sendintr()  # a second one leaves cleanly
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    turn = open_store(home).get_turn(turn_id)
    assert turn.interrupted and turn.rating.score == 1
    assert open_store(home).counts()["turns"] == 1  # "half a line" was never sent
    assert 0 < len(turn.reply_ids) == tokens < 3000
    assert len(turn.logprobs) == tokens


def test_once_json_continues_a_conversation(tiny, home, tmp_path):
    store = open_store(home)
    conv = store.create_conversation().id
    store.append_turn(conv, "Earlier question", "Earlier answer")
    env = chat_env(home, tiny, REINF_MAX_NEW_TOKENS="6")
    done = subprocess.run(REINF + ["chat", "--once", "Hello there", "--json",
                                   "--conversation", str(conv)],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert list(out) == list(TURN_FIELDS)  # README "JSON output": a turn, as history prints
    turn = store.get_turn(out["turn_id"])
    assert (turn.conversation_id, turn.index, turn.reply) == (conv, 2, out["reply"])
    assert out == turn.to_dict()
    assert out["user_message"] == "Hello there" and out["model"] == tiny.name
    assert out["rating"] is None and out["index"] == 2 and out["created_at"]
    assert out["checkpoint_id"] == "base" and out["interrupted"] is False
    assert out["reply_tokens"] == len(turn.reply_ids) == len(turn.logprobs) <= 6
    assert out["ttft_ms"] > 0 and out["latency_ms"] >= out["ttft_ms"]


def test_standalone_chat_serves_the_active_checkpoint(tiny, home, tmp_path):
    """Without a server, `reinf chat` loads the adapter the ratings trained, not the base."""
    from reinf.training.checkpoints import REQUIRED

    store = open_store(home)
    ckpt = make_adapter(tiny, home / "checkpoints" / "r0001-test", seed=3)
    for name in REQUIRED:  # the trainer's other files; the engine only reads the adapter
        if not (ckpt / name).exists():
            (ckpt / name).write_text("{}")
    store.add_checkpoint("r0001-test", str(ckpt))
    store.activate_checkpoint("r0001-test")
    env = chat_env(home, tiny, REINF_MAX_NEW_TOKENS="4")
    done = subprocess.run(REINF + ["chat", "--once", "Hello", "--json"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["checkpoint_id"] == "r0001-test"
    assert store.get_turn(out["turn_id"]).checkpoint_id == "r0001-test"


def test_an_explicit_url_without_a_daemon_is_a_clear_error(invoke):
    url = f"http://127.0.0.1:{free_port()}"
    result = invoke("chat", "--url", url, "--once", "hi")
    assert result.exit_code == 1
    assert f"no Reinf daemon answers at {url}" in result.output
    assert "reinf serve" in result.output


def test_an_unknown_conversation_fails_before_loading_anything(invoke, monkeypatch):
    monkeypatch.setenv("REINF_PORT", str(free_port()))
    result = invoke("chat", "--conversation", "42", "--once", "hi")
    assert result.exit_code == 1 and "no conversation 42" in result.output


def test_a_missing_model_is_one_clear_line(invoke, monkeypatch, tmp_path):
    monkeypatch.setenv("REINF_PORT", str(free_port()))
    monkeypatch.setenv("REINF_MODEL_PATH", str(tmp_path / "no-model"))
    result = invoke("chat", "--once", "hi")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"no model at {tmp_path / 'no-model'} — set model_path to a name from `reinf " \
        "models`" in result.output


class StartingChat(FakeChatService):
    """The echo service of the web tests, where a test can hold the next reply before it
    starts (``hold``): as a server busy with the conversation, or a long prompt, would."""

    def __init__(self, store):
        super().__init__(store)
        self.hold = threading.Event()
        self.entered = threading.Event()   # the held reply is waiting
        self.release = threading.Event()

    def stream(self, message, conversation_id=None, **gen):
        if self.hold.is_set():
            self.entered.set()
            self.release.wait(60)
        return super().stream(message, conversation_id, **gen)


@pytest.fixture
def fake_chat(store):
    return StartingChat(store)


def test_ctrl_c_before_the_reply_starts_stops_only_the_reply(fake_chat, live, home, tmp_path):
    """Ctrl-C before the first token (here: while the server has not started the reply) stops
    that reply, as one after a token does; the session goes on."""
    fake_chat.gate = threading.Event()  # each reply holds after its first piece until stopped
    child = pexpect.spawn(REINF[0], REINF[1:] + ["chat", "--url", live.url], env=clean_env(home),
                          cwd=str(tmp_path), encoding="utf-8", timeout=60, dimensions=(40, 200),
                          preexec_fn=default_sigint)
    try:
        child.expect_exact(USER_PROMPT)
        fake_chat.hold.set()
        child.sendline("Tell me a long story")
        assert fake_chat.entered.wait(30)
        child.sendintr()
        child.expect_exact("^C")  # the terminal has sent SIGINT
        time.sleep(0.5)
        fake_chat.hold.clear()
        fake_chat.release.set()
        kept = child.expect([r"\[stopped (after \d+ tokens|before the first token); kept as "
                             r"turn (\d+), marked interrupted\]",
                             r"\[stopped before any text appeared; nothing kept\]"]) == 0
        turn_id = int(child.match.group(2)) if kept else None
        if child.expect_exact([RATE_PROMPT, USER_PROMPT]) == 0:
            child.sendline("")
            child.expect_exact(USER_PROMPT)
        child.sendline("Second question")  # the session goes on
        child.expect_exact("echo: ")
        fake_chat.gate.set()
        child.expect_exact(RATE_PROMPT)
        child.sendline("/quit")
        child.expect(pexpect.EOF)
        child.close()
    finally:
        fake_chat.release.set()
        fake_chat.gate.set()
        child.close(force=True)
    assert child.exitstatus == 0
    turns = open_store(home).history(limit=None, oldest_first=True)
    if kept:  # stopped at its first piece, which was shown
        first, second = turns
        assert first.id == turn_id and first.interrupted and first.reply == "echo: "
    else:  # stopped before anything was shown: nothing of it is kept
        [second] = turns
    assert second.reply == "echo: Second question" and not second.interrupted


def test_once_json_over_http_prints_the_whole_turn(live, invoke, store):
    result = invoke("chat", "--url", live.url, "--once", "hello there", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert list(out) == list(TURN_FIELDS)
    assert out == store.get_turn(out["turn_id"]).to_dict()
    assert (out["user_message"], out["reply"], out["model"]) == (
        "hello there", "echo: hello there", "fake-echo")
    assert out["rating"] is None and out["index"] == 1 and out["created_at"]


HOSTILE = ("see\x1b]52;c;ZWNobyBwd25lZA==\x07 "
           "\x1b]8;;https://evil.example/\x1b\\this\x1b]8;;\x1b\\ "
           "\x1b]0;owned\x07now\x9b2J\x1b[31m!")


def test_replies_echoed_on_the_terminal_carry_no_escape(live, invoke, store, config):
    """The fake model echoes the message, so the reply streamed over HTTP carries OSC 52,
    OSC 8, OSC 0 and CSI sequences, split across deltas; the terminal gets the text only."""
    import io

    from reinf.client import HttpBackend
    from reinf.cli.repl import Repl

    result = invoke("chat", "--url", live.url, "--once", HOSTILE)
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: see this now!\n"
    assert store.last_turn().reply == "echo: " + HOSTILE  # stored as sent: only printing strips
    keys = iter([HOSTILE, "", "/history", "/quit"])
    screen = io.StringIO()
    Repl(HttpBackend(live.url, config), read=lambda _: next(keys), out=screen).run()
    shown = screen.getvalue()
    assert "bot> echo: see this now!" in shown and "bot: echo: see this now!" in shown
    assert not any(c in shown for c in "\x1b\x07\x9b\x9c") and "52;c" not in shown
    assert "evil.example" not in shown and "owned" not in shown


def test_rewrite_over_http_stores_the_reply_the_person_wanted(live, store, config):
    """/rewrite through a running server (PUT /api/turns/<id>/rewrite), as the local backend
    does it; the server's refusal is one line, and the session goes on."""
    import io

    from reinf.client import HttpBackend
    from reinf.cli.repl import Repl
    from reinf.storage.store import MAX_REWRITE_CHARS

    keys = iter(["hello", "", "/rewrite Hi! How can I help?",
                 "/rewrite " + "x" * (MAX_REWRITE_CHARS + 1), "/rewrite   ", "/history",
                 "/quit"])
    screen = io.StringIO()
    Repl(HttpBackend(live.url, config), read=lambda _: next(keys), out=screen).run()
    shown = screen.getvalue()
    turn = store.last_turn()
    assert (f"turn {turn.id}: rewrite saved (19 characters); the next training round learns "
            "from it") in shown
    assert f"error: a rewrite holds at most {MAX_REWRITE_CHARS:,} characters" in shown
    assert "usage: /rewrite TEXT" in shown
    assert f"#{turn.id} unrated ✎" in shown
    assert store.get_rewrite(turn.id).text == "Hi! How can I help?"
    backend = HttpBackend(live.url, config)
    assert backend.rewrite(turn.id, "Hello.")["text"] == "Hello."  # again: replaced
    assert store.get_rewrite(turn.id).text == "Hello."
    with pytest.raises(ReinfError, match="no turn 999"):
        backend.rewrite(999, "x")


# --- --system ----------------------------------------------------------------------------------

def test_system_starts_the_conversation_with_it_in_the_prompt(tiny, home, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    runs = {}
    for name, args, extra in [("flag", ["--system", "Be a pirate."], {}),
                              ("config", [], {"REINF_SYSTEM_PROMPT": "Be kind."}),
                              ("none", ["--system", ""], {"REINF_SYSTEM_PROMPT": "Be kind."})]:
        done = subprocess.run(REINF + ["chat", "--once", "Hello there", "--json", *args],
                              env=chat_env(home, tiny, REINF_MAX_NEW_TOKENS="4", **extra),
                              cwd=tmp_path, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads(done.stdout)
    store = open_store(home)
    assert runs["flag"]["system_prompt"] == "Be a pirate."
    assert runs["config"]["system_prompt"] == "Be kind."
    assert runs["none"]["system_prompt"] is None
    for name, system in [("flag", "Be a pirate."), ("config", "Be kind.")]:
        turn = store.get_turn(runs[name]["turn_id"])
        assert tok.decode(turn.prompt_ids) == (
            f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
            "<|im_start|>assistant\n")
        assert store.get_conversation(turn.conversation_id).system_prompt == system
    assert tok.decode(store.get_turn(runs["none"]["turn_id"]).prompt_ids).startswith(
        "<|im_start|>user\n")


def test_system_over_http_and_a_conversation_that_has_another(live, invoke, store):
    result = invoke("chat", "--url", live.url, "--once", "hi", "--system", "Be a pirate.",
                    "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    conv = out["conversation_id"]
    assert out["system_prompt"] == "Be a pirate."
    assert store.get_conversation(conv).system_prompt == "Be a pirate."
    same = invoke("chat", "--url", live.url, "--once", "more", "--conversation", conv,
                  "--system", "Be a pirate.", "--json")
    assert same.exit_code == 0 and json.loads(same.output)["index"] == 2
    other = invoke("chat", "--url", live.url, "--once", "x", "--conversation", conv,
                   "--system", "Be formal.")
    assert other.exit_code == 1
    assert "already has turns" in other.output and "leave out --system" in other.output
    assert store.get_conversation(conv).turns == 2  # refused before anything was sent
    empty = store.create_conversation().id  # no turns yet: --system sets it
    fresh = invoke("chat", "--url", live.url, "--once", "y", "--conversation", empty,
                   "--system", "Be formal.", "--json")
    assert fresh.exit_code == 0, fresh.output
    assert store.get_conversation(empty).system_prompt == "Be formal."


def test_system_applies_to_each_conversation_a_terminal_session_starts(live, home, tmp_path,
                                                                       store):
    child = pexpect.spawn(REINF[0], REINF[1:] + ["chat", "--url", live.url, "--system",
                                                 "Be a pirate."],
                          env=clean_env(home), cwd=str(tmp_path), encoding="utf-8",
                          timeout=60, dimensions=(40, 200), preexec_fn=default_sigint)
    try:
        child.expect_exact("system prompt: Be a pirate.")
        for message in ("first", "/new", "second"):
            child.expect_exact(USER_PROMPT)
            child.sendline(message)
            if message != "/new":
                child.expect_exact(RATE_PROMPT)
                child.sendline("")
        child.expect_exact(USER_PROMPT)
        child.sendline("/quit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    first, second = store.history(limit=None, oldest_first=True)
    assert first.conversation_id != second.conversation_id
    assert first.system_prompt == second.system_prompt == "Be a pirate."


def test_a_paste_of_several_lines_is_one_message(tiny, home, tmp_path):
    """A terminal pastes between ESC[200~ and ESC[201~ (bracketed paste): readline keeps the
    lines together, and Enter sends them as one message; the rating prompt reads no line of
    it."""
    child = spawn_chat(home, chat_env(home, tiny, REINF_MAX_NEW_TOKENS="4"), tmp_path)
    child.send("\x1b[200~First line of the paste\rsecond line\rthird line\x1b[201~")
    child.send("\r")
    child.expect_exact(RATE_PROMPT)
    child.sendline("5")
    child.expect_exact("rated turn 1: 5")
    child.expect_exact(USER_PROMPT)
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    (turn,) = open_store(home).history(limit=None)
    assert turn.user_message == "First line of the paste\nsecond line\nthird line"
    assert turn.rating.score == 5

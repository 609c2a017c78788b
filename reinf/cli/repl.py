"""The terminal chat loop behind ``reinf chat``.

The loop talks to a ``Backend``: ``LocalBackend`` runs the model in this process
(ChatService + Store); an HTTP client of a running daemon (reinf/client.py) implements
the same protocol. Turns and ratings cross it as the JSON dicts of the HTTP API
(``TurnRecord.to_dict()``, ``RatingRecord.to_dict()``, ``RewriteRecord.to_dict()``), so
both behave the same here.

Keys: Ctrl-C during a reply stops it: the part shown is stored, marked interrupted, and
nothing when nothing was shown yet. At a prompt, as in Python's REPL, Ctrl-C clears the
line; a second one in a row, or Ctrl-D, leaves.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Callable, Iterator, Protocol, TextIO

from reinf.cli.common import strip_escapes
from reinf.errors import BadInput, ReinfError
from reinf.storage.store import check_score, check_tags

RATE_PROMPT = "rate 1-5 (Enter to skip), tags after a space: "
USER_PROMPT = "you> "
BOT_PREFIX = "bot> "
HELP = """commands:
  /new          start a new conversation
  /history      this conversation's turns and ratings
  /rate N [TAGS] rate the last reply N (1-5), tags comma-separated: /rate 2 too long,wrong
  /undo         remove the last rating made in this session
  /rewrite TEXT the reply you wanted to your last message, in your words: the next training
                round learns from it (a second /rewrite replaces it)
  /again        sample another reply to your last message (kept beside the first)
  /pick N       reply N (1, 2, ... as /again numbered them) is the better one: the
                conversation continues from it, and your preference is stored
  /paste        send several lines as one message (end with a line holding only ".")
  /quit         leave (also Ctrl-D, or Ctrl-C twice)
Ctrl-C stops a reply; the part you saw is kept (nothing, if nothing appeared yet).
At a prompt Ctrl-C clears the line. End a line with \\ to go on on the next one.
Start a message with // to send a leading /."""
LEAVE_HINT = "(Ctrl-C again or Ctrl-D to leave)"
PICK_PROMPT = "which is better, 1-{n}? (Enter: no preference, reply {n} continues): "
MORE_PROMPT = "...> "
# after the session's first rating of 1 or 2 on the last reply, when it has no rewrite: a low
# score says what the person does not want, a rewrite what they do, and on a real model the
# rewrites teach far more (docs/training.md, "Rewrites")
REWRITE_TIP = ("tip: /rewrite TEXT shows it the reply you wanted; a rewrite teaches it more "
               "than any score")


class ReplyHandle(Protocol):
    conversation_id: int

    def __iter__(self) -> Iterator[str]: ...          # text deltas as they are generated
    # end the reply early; shown: the text the person saw (only that is to be kept)
    def stop(self, shown: str | None = None) -> None: ...
    def result(self) -> dict | None: ...              # the stored turn (TurnRecord.to_dict())


class Backend(Protocol):
    def describe(self) -> str: ...                    # one line: model and checkpoint
    # system_prompt (only passed when given): a new conversation's; with conversation_id it
    # must be that conversation's, unless it has no turns yet (then it replaces it)
    def send_stream(self, message: str, conversation_id: int | None, *,
                    system_prompt: str | None = None) -> ReplyHandle: ...
    def rate(self, turn_id: int, score: int, tags: list[str]) -> dict: ...
    def undo(self, turn_id: int | None = None) -> dict | None: ...   # the removed rating
    # the reply the person wanted for turn_id, stored (or replacing theirs): RewriteRecord dict
    def rewrite(self, turn_id: int, text: str) -> dict: ...
    def history(self, conversation_id: int, limit: int = 20) -> list[dict]: ...  # oldest first
    def new_conversation(self) -> int | None: ...     # None: the next message starts one
    def forget(self, turn_id: int) -> None: ...       # delete a turn for good
    # another reply to the message of turn_id (its conversation's last), stored beside it as
    # an alternative, which the conversation continues from
    def send_again(self, turn_id: int) -> ReplyHandle: ...
    # turn_id continues its conversation, preferred over the other alternatives of its slot:
    # {"turn": the turn, "pairs": [PairRecord.to_dict(), ...]}
    def pick(self, turn_id: int) -> dict: ...


class _LocalHandle:
    def __init__(self, chat):
        self._chat = chat
        self.conversation_id = chat.conversation_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._chat)

    def stop(self, shown: str | None = None) -> None:
        self._chat.stop(shown)  # the turn is stored cut to what was shown

    def result(self) -> dict | None:
        turn = self._chat.wait()
        return turn.to_dict() if turn is not None else None


class LocalBackend:
    """The model runs in this process."""

    def __init__(self, service, store):
        self.service = service
        self.store = store

    def describe(self) -> str:
        d = self.service.engine.describe()
        return (f"{d['model_name']} on {d['device_in_use']} ({d['dtype']}), "
                f"checkpoint {d['active_checkpoint']}")

    def send_stream(self, message: str, conversation_id: int | None, *,
                    system_prompt: str | None = None) -> ReplyHandle:
        return _LocalHandle(self.service.stream(message, conversation_id,
                                                system_prompt=system_prompt))

    def rate(self, turn_id: int, score: int, tags: list[str]) -> dict:
        return self.store.rate(turn_id, score, tags=tags).to_dict()

    def undo(self, turn_id: int | None = None) -> dict | None:
        removed = self.store.undo_rating(turn_id)
        return removed.to_dict() if removed else None

    def rewrite(self, turn_id: int, text: str) -> dict:
        return self.store.rewrite(turn_id, text).to_dict()

    def history(self, conversation_id: int, limit: int = 20) -> list[dict]:
        return [t.to_dict() for t in self.store.conversation_turns(conversation_id)[-limit:]]

    def new_conversation(self) -> int | None:
        return None  # created with its first message, so /new twice leaves no empty ones

    def forget(self, turn_id: int) -> None:
        self.store.forget_turn(turn_id)

    def send_again(self, turn_id: int) -> ReplyHandle:
        return _LocalHandle(self.service.stream_again(turn_id))

    def pick(self, turn_id: int) -> dict:
        turn, pairs = self.service.pick(turn_id)
        return {"turn": turn.to_dict(), "pairs": [p.to_dict() for p in pairs]}


def parse_rating(line: str) -> tuple[int, list[str]]:
    """``"4 too long,wrong"`` -> ``(4, ["too long", "wrong"])``; BadInput otherwise."""
    score_text, _, tags_text = line.strip().partition(" ")
    if not score_text.isdigit():
        raise BadInput(f"{score_text!r} is not a score")
    return check_score(int(score_text)), check_tags(tags_text)


PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # a terminal's bracketed paste


class Repl:
    QUIT = object()

    def __init__(self, backend: Backend, *, conversation_id: int | None = None,
                 system_prompt: str | None = None, read: Callable[[str], str] = input,
                 out: TextIO | None = None):
        self.backend = backend
        self.conversation_id = conversation_id
        self.system_prompt = system_prompt  # of the conversations this session starts
        self.read = read
        self.out = out or sys.stdout
        self.last_turn: dict | None = None
        self.rated: list[int] = []   # turns rated in this session, newest last (for /undo)
        self.slot: list[dict] = []   # the replies to the last message, as /again numbers them
        self.tipped = False          # REWRITE_TIP was shown in this session

    def say(self, text: str = "", end: str = "\n") -> None:
        """Print a line; it may hold stored text (a reply, a tag), so escapes are stripped."""
        self.out.write(strip_escapes(text) + end)
        self.out.flush()

    def run(self) -> int:
        self.say(f"reinf chat — {self.backend.describe()}")
        self.say("Rate each reply 1-5 (Enter skips). /help for commands, Ctrl-D to leave.")
        if self.conversation_id is not None:
            self.say(f"continuing conversation {self.conversation_id}")
        if self.system_prompt is not None:
            self.say(f"system prompt: {_clip(self.system_prompt) or '(none)'}")
        while True:
            line = self.prompt(USER_PROMPT)
            if line is None:
                return 0
            line = self.unbracket(line)
            if line.rstrip().endswith("\\") and not line.lstrip().startswith("/"):
                line = self.continued(line)  # a trailing backslash: the message goes on
            elif line.strip().lower() == "/paste":
                line = self.paste()
            elif line.strip().startswith("/") and not line.strip().startswith("//"):
                if self.command(line.strip()) is self.QUIT:
                    return 0
                continue
            else:
                line = line.strip()
                line = line[1:] if line.startswith("//") else line
            if not line or not line.strip():
                continue
            turn = self.chat(line)
            # a reply stopped before its first token has nothing to rate
            unseen = turn is not None and turn.get("interrupted") and not turn.get("reply")
            if turn is not None and not unseen and self.ask_rating(turn) is self.QUIT:
                return 0

    def prompt(self, text: str) -> str | None:
        """Read one line. Ctrl-C clears it and asks again, as Python's REPL does; a second
        Ctrl-C in a row, or Ctrl-D, returns None: leave."""
        interrupted = False
        while True:
            try:
                return self.read(text)
            except EOFError:
                self.say()
                return None
            except KeyboardInterrupt:
                if interrupted:
                    self.say()
                    return None
                interrupted = True
                self.say("\n" + LEAVE_HINT)

    def unbracket(self, line: str) -> str:
        """A paste the terminal marked (ESC[200~ ... ESC[201~, asked for by `reinf chat`):
        its lines, read one by one, are one message, sent with the Enter after it."""
        if PASTE_START not in line:
            return line
        parts = [line.replace(PASTE_START, "")]
        while PASTE_END not in parts[-1]:
            try:
                parts.append(self.read(""))
            except (EOFError, KeyboardInterrupt):
                break
        parts[-1] = parts[-1].replace(PASTE_END, "")
        return "\n".join(parts)

    def continued(self, first: str) -> str | None:
        """A message whose lines end with a backslash, joined with line breaks."""
        parts, line = [], first
        while line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            try:
                line = self.read(MORE_PROMPT)
            except EOFError:
                line = ""
                break
            except KeyboardInterrupt:
                self.say("\n[message dropped]")
                return None
        return "\n".join(parts + [line]).strip("\n")

    def paste(self) -> str | None:
        """/paste: every line up to one holding only "." (or Ctrl-D) is one message, so a
        pasted text with several lines is sent whole, not line by line."""
        self.say('paste or type your message; end it with a line holding only "." '
                 "(or Ctrl-D); Ctrl-C drops it")
        lines = []
        while True:
            try:
                line = self.read("")
            except EOFError:
                break
            except KeyboardInterrupt:
                self.say("\n[message dropped]")
                return None
            if line.strip() == ".":
                break
            lines.append(line)
        return "\n".join(lines).strip("\n")

    def chat(self, message: str) -> dict | None:
        """Send one message, stream the reply; Ctrl-C at any point of it (before or after
        the first token) stops only the reply. Returns the stored turn."""
        extra = {} if self.system_prompt is None else {"system_prompt": self.system_prompt}
        turn = self.stream_reply(
            lambda: self.backend.send_stream(message, self.conversation_id, **extra))
        if turn is not None:
            self.slot = [turn]
        return turn

    def stream_reply(self, start: Callable[[], ReplyHandle]) -> dict | None:
        """Start a reply with ``start()`` and stream it (see ``chat``)."""
        try:
            # Building the prompt or waiting for the server can take a moment; a Ctrl-C
            # then is held until the reply exists and stops it, as one after a token does.
            with held_interrupt() as pressed:
                handle = start()
        except KeyboardInterrupt:  # pressed twice while it was starting
            self.say("\n[stopped before the reply started]")
            return None
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return None
        shown, cut = "", bool(pressed)
        try:
            self.conversation_id = handle.conversation_id
            self.say(BOT_PREFIX, end="")
            if pressed:  # while it was starting: what it still sends is shown, then it ends
                handle.stop()
            for delta in handle:
                self.say(delta, end="")
                shown += delta
        except KeyboardInterrupt:
            cut = True
            handle.stop(shown=shown)  # what came after the last delta shown is not kept
        except ReinfError as exc:
            self.say(f"\nerror: {exc}")
            return None
        try:
            turn = finish(handle)
        except ReinfError as exc:
            self.say(f"\nerror: {exc}")
            return None
        self.say()
        if cut and not shown:
            return self.discard(turn)
        if turn.get("interrupted"):
            done = (f"after {turn['reply_tokens']} tokens" if turn.get("reply_tokens")
                    else "before the first token")
            self.say(f"[stopped {done}; kept as turn {turn['turn_id']}, marked interrupted]")
        if turn.get("style"):  # explore_styles asked for this one in a style
            self.say(f"[asked for in a style: {turn['style']}]")
        self.last_turn = turn
        return turn

    def discard(self, turn: dict | None) -> None:
        """A reply cut before any text appeared: nothing of it is kept. The local backend
        stored nothing; a server stored what it generated, which is forgotten here."""
        if turn is not None and not turn.get("forgotten"):  # a server's cut forgot it
            try:
                self.backend.forget(turn["turn_id"])
            except ReinfError as exc:
                self.say(f"error: {exc}")
                return None
        self.say("[stopped before any text appeared; nothing kept]")
        return None

    def ask(self, prompt: str, answer: Callable[[str], bool]):
        """Read lines at ``prompt`` until ``answer(line)`` takes one (returns True). Enter
        goes on (None), a /command runs instead, Ctrl-D (or a second Ctrl-C) leaves."""
        while True:
            line = self.prompt(prompt)
            if line is None:
                return self.QUIT
            line = line.strip()
            if not line:
                return None
            if line.startswith("/"):
                return self.command(line)
            if answer(line):
                return None

    def ask_rating(self, turn: dict):
        def answer(line: str) -> bool:
            try:
                score, tags = parse_rating(line)
            except BadInput as exc:
                self.say(f"{exc.message} — type a score 1-5, optionally followed by tags "
                         "(e.g. `4 too long,wrong`), or press Enter to skip")
                return False
            self.rate(turn["turn_id"], score, tags)
            return True
        return self.ask(RATE_PROMPT, answer)

    def rate(self, turn_id: int, score: int, tags: list[str]) -> None:
        try:
            rating = self.backend.rate(turn_id, score, tags)
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return
        if turn_id in self.rated:
            self.rated.remove(turn_id)
        self.rated.append(turn_id)
        self.say(f"rated turn {turn_id}: {rating['score']}"
                 + (f" [{', '.join(rating['tags'])}]" if rating["tags"] else ""))
        last = self.last_turn
        if (rating["score"] <= 2 and not self.tipped and last is not None
                and last.get("turn_id") == turn_id and not last.get("rewrite")):
            self.tipped = True
            self.say(REWRITE_TIP)

    def command(self, line: str):
        name, _, arg = line.partition(" ")
        name = name.lower()
        if name in ("/quit", "/exit", "/q"):
            return self.QUIT
        if name == "/help":
            self.say(HELP)
        elif name == "/new":
            self.conversation_id = self.backend.new_conversation()
            self.last_turn = None
            self.slot = []
            self.say("new conversation")
        elif name == "/history":
            self.show_history()
        elif name == "/rate":
            if self.last_turn is None:
                self.say("nothing to rate yet — send a message first")
                return None
            try:
                score, tags = parse_rating(arg)
            except BadInput as exc:
                self.say(f"{exc.message} — usage: /rate N [tags], N from 1 to 5")
                return None
            self.rate(self.last_turn["turn_id"], score, tags)
        elif name == "/undo":
            self.undo()
        elif name == "/rewrite":
            self.rewrite(arg)
        elif name == "/again":
            return self.again()
        elif name == "/pick":
            if not arg.strip().isdigit():
                self.say("usage: /pick N, N a reply's number as /again showed it")
                return None
            self.pick(int(arg.strip()))
        else:
            self.say(f"unknown command {name} — /help lists them")
        return None

    def again(self):
        """/again: another reply to the last message, streamed and kept beside the others;
        then the person picks the better one (Enter: none; the newest continues)."""
        if not self.slot:
            self.say("nothing to sample again — send a message first")
            return None
        turn = self.stream_reply(lambda: self.backend.send_again(self.slot[-1]["turn_id"]))
        if turn is None:
            return None
        self.slot.append(turn)
        n = len(self.slot)
        self.say(f"[reply {n} of {n}, turn {turn['turn_id']}; the conversation continues from "
                 "it unless you pick another]")
        def answer(line: str) -> bool:
            if line.isdigit():
                self.pick(int(line))
                return True
            self.say(f"type a reply's number, 1 to {n}, or press Enter to go on")
            return False
        return self.ask(PICK_PROMPT.format(n=n), answer)

    def pick(self, number: int) -> None:
        if not self.slot:
            self.say("nothing to pick yet — send a message, then /again")
            return
        if not 1 <= number <= len(self.slot):
            self.say(f"there {'is' if len(self.slot) == 1 else 'are'} {len(self.slot)} "
                     f"repl{'y' if len(self.slot) == 1 else 'ies'} to the last message; pick "
                     f"one from 1 to {len(self.slot)}")
            return
        try:
            result = self.backend.pick(self.slot[number - 1]["turn_id"])
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return
        self.last_turn = result["turn"]
        others = [str(i) for i in range(1, len(self.slot) + 1) if i != number]
        self.say(f"reply {number} continues the conversation"
                 + (f", preferred over {', '.join(others)}" if others else ""))

    def rewrite(self, text: str) -> None:
        """/rewrite TEXT: the reply the person wanted to the last message."""
        text = text.strip()
        if not text:
            self.say("usage: /rewrite TEXT, the reply you wanted to your last message (a long "
                     "one: `reinf rewrite last --file PATH`)")
            return
        if self.last_turn is None:
            self.say("nothing to rewrite yet — send a message first")
            return
        turn_id = self.last_turn["turn_id"]
        try:
            record = self.backend.rewrite(turn_id, text)
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return
        self.last_turn = {**self.last_turn, "rewrite": record}
        n = len(record["text"])
        self.say(f"turn {turn_id}: rewrite saved ({n} character{'' if n == 1 else 's'}); "
                 "the next training round learns from it")

    def undo(self) -> None:
        if not self.rated:
            self.say("no rating to undo in this session (`reinf undo` removes older ones)")
            return
        turn_id = self.rated.pop()
        try:
            removed = self.backend.undo(turn_id)
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return
        self.say(f"removed rating {removed['score']} from turn {turn_id}" if removed
                 else f"turn {turn_id} has no rating any more")

    def show_history(self) -> None:
        if self.conversation_id is None:
            self.say("no turns yet in this conversation")
            return
        try:
            turns = self.backend.history(self.conversation_id)
        except ReinfError as exc:
            self.say(f"error: {exc}")
            return
        for t in turns:
            r = t.get("rating")
            mark = (f"★{r['score']}" + (f" [{', '.join(r['tags'])}]" if r["tags"] else "")) \
                if r else "unrated"
            stopped = " (interrupted)" if t.get("interrupted") else ""
            rewritten = " ✎" if t.get("rewrite") else ""  # the person wrote the reply wanted
            self.say(f"#{t['turn_id']} {mark}{rewritten}{stopped}")
            self.say(f"  you: {_clip(t['user_message'])}")
            self.say(f"  bot: {_clip(t['reply'])}")


@contextlib.contextmanager
def held_interrupt() -> Iterator[list[bool]]:
    """Hold a Ctrl-C pressed inside the block: the yielded list gets an item, and the
    caller acts on it once the block is done. A second Ctrl-C raises KeyboardInterrupt at
    once, so a block that hangs can still be left. Outside the main thread (where signal
    handlers cannot be set) nothing is held."""
    pressed: list[bool] = []

    def hold(signum, frame) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)

    previous = signal.getsignal(signal.SIGINT)
    if previous in (signal.SIG_IGN, None) or \
            threading.current_thread() is not threading.main_thread():
        yield pressed  # Ctrl-C is off, or not this thread's to handle
        return
    signal.signal(signal.SIGINT, hold)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def finish(handle: ReplyHandle) -> dict:
    """The stored turn of a reply; a Ctrl-C while waiting for it only stops it again."""
    while True:
        try:
            return handle.result()
        except KeyboardInterrupt:
            handle.stop()


def _clip(text: str, n: int = 100) -> str:
    flat = " ".join(strip_escapes(text).split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"

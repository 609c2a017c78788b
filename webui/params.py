"""Reading request bodies and query strings strictly: every mistake is a 400 that names
the field and says what was expected."""
from __future__ import annotations

import json
import math
from datetime import datetime, time, timezone
from typing import Any, Iterable, Mapping

from flask import request
from werkzeug.exceptions import RequestEntityTooLarge

from reinf.errors import BadInput, ReinfError

MAX_NUMBER_DIGITS = 100  # no field takes more; Python's int() refuses past 4,300 digits


class LongNumber:
    """A JSON integer literal too long for any field, kept so the check can name its field."""

    def __init__(self, literal: str):
        self.digits = len(literal.lstrip("-"))


def parse_int(literal: str) -> int | LongNumber:
    return int(literal) if len(literal) <= MAX_NUMBER_DIGITS else LongNumber(literal)


def refuse_constant(name: str):
    raise BadInput(f"the request body is not valid JSON: {name} is not a JSON number",
                   fix="send numbers as plain decimals")


def is_text(value: str) -> bool:
    """Whether ``value`` can be stored and sent back: UTF-8 encodable (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_values(body: dict[str, Any]) -> None:
    """Every string (field names too) is valid Unicode text and every number a sane size,
    checked once here for every route, so nothing downstream half-stores a request."""
    stack: list[tuple[Any, str, str | None]] = [(body, "", None)]  # value, path, top field
    while stack:
        value, where, field = stack.pop()
        if isinstance(value, dict):
            for name in value:
                if not is_text(name):
                    raise BadInput(f"a field name{' in ' + repr(where) if where else ''} is not "
                                   "valid Unicode text (it holds a lone surrogate)", key=field,
                                   fix="send UTF-8 text")
            stack += [(v, f"{where}.{k}" if where else k, field or k)
                      for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]", field) for i, v in reversed(list(enumerate(value)))]
        elif isinstance(value, str) and not is_text(value):
            bad = next(i for i, c in enumerate(value) if not is_text(c))
            raise BadInput(f"'{where}' is not valid Unicode text: it holds a lone surrogate "
                           f"({value[bad]!r}) at character {bad}", key=field,
                           fix="send UTF-8 text; remove or replace that character")
        elif isinstance(value, LongNumber):
            raise BadInput(f"'{where}' is a number with {value.digits} digits; no field takes "
                           f"more than {MAX_NUMBER_DIGITS}", key=field)


def read_body() -> bytes:
    """The raw body, refusing one over MAX_CONTENT_LENGTH with 413.

    werkzeug raises 413 for a declared Content-Length over the limit, but stops reading a
    chunked body at the limit without an error; the byte after it tells the two apart.
    """
    raw = request.get_data(cache=True)
    limit = request.max_content_length
    if limit is not None and request.content_length is None and len(raw) >= limit:
        if request.environ["wsgi.input"].read(1):
            raise RequestEntityTooLarge()
    return raw


def read_json(allowed: Iterable[str] | None = None, *, required: Iterable[str] = (),
              optional_body: bool = False) -> dict[str, Any]:
    """The request body as a JSON object. ``allowed``: the only keys accepted (None: any)."""
    raw = read_body()
    if not raw.strip():
        if optional_body:
            return {}
        raise BadInput("the request body is empty; expected a JSON object",
                       fix='e.g. {"message": "hello"}')
    try:
        body = json.loads(raw, parse_int=parse_int, parse_constant=refuse_constant)
    except UnicodeDecodeError:
        raise BadInput("the request body is not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise BadInput(f"the request body is not valid JSON: {detail}",
                       fix="send a JSON object with Content-Type: application/json") from None
    if not isinstance(body, dict):
        kind = "int" if isinstance(body, LongNumber) else type(body).__name__
        raise BadInput(f"the request body must be a JSON object, got {kind}",
                       fix='e.g. {"message": "hello"}')
    check_values(body)
    if allowed is not None:
        unknown = sorted(set(body) - set(allowed))
        if unknown:
            raise BadInput(f"unknown field(s): {', '.join(map(str, unknown))}",
                           key=str(unknown[0]),
                           fix=f"accepted fields: {', '.join(sorted(allowed))}")
    for name in required:
        if body.get(name) is None:
            raise BadInput(f"missing field '{name}'", key=name)
    return body


def get_text(body: Mapping[str, Any], name: str, *, max_chars: int, required: bool = True,
             config_key: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise BadInput(f"missing field '{name}'", key=name)
        return None
    if not isinstance(value, str):
        raise BadInput(f"'{name}' must be a string", key=name)
    if required and not value.strip():
        raise BadInput(f"'{name}' is empty", key=name, fix="type something to send")
    if len(value) > max_chars:
        raise ReinfError(f"'{name}' is {len(value)} characters; the limit is {max_chars}",
                         key=config_key or name, status=413,
                         fix="send a shorter message, or raise max_message_chars in config.yaml")
    return value


def get_number(value: Any, name: str, *, low: float, high: float, integer: bool = False):
    """A JSON number in [low, high]; integers for ``integer`` (2.0 is accepted as 2)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadInput(f"'{name}' must be a number", key=name)
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise BadInput(f"'{name}' must be a whole number", key=name)
        value = int(value)
    if not low <= value <= high:
        raise BadInput(f"'{name}' must be between {low:g} and {high:g}, got {value!r}", key=name)
    return value


def get_id(value: Any, name: str, *, required: bool = False) -> int | None:
    """A database id: a positive whole number (JSON number or digit string)."""
    if value is None:
        if required:
            raise BadInput(f"missing field '{name}'", key=name)
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() \
            and len(value.strip()) <= 19:  # "²" is a digit to isdigit(), not to int()
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**63:
        shown = "a huge number" if isinstance(value, int) and value.bit_length() > 200 \
            else repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise BadInput(f"'{name}' must be a positive whole number, got {shown}", key=name)
    return value


def generation_args(body: Mapping[str, Any], config) -> dict[str, Any]:
    """temperature / top_p / max_new_tokens from a request, within the config's ranges."""
    out = {"temperature": get_number(body.get("temperature"), "temperature", low=0.01, high=5.0),
           "top_p": get_number(body.get("top_p"), "top_p", low=0.01, high=1.0),
           "max_new_tokens": get_number(body.get("max_new_tokens"), "max_new_tokens", low=1,
                                        high=32_768, integer=True)}
    return {k: v for k, v in out.items() if v is not None}


# --- query strings ----------------------------------------------------------------------

def query_int(name: str, *, low: int, high: int, default: int | None = None) -> int | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"query parameter '{name}' must be a whole number, got {raw!r}",
                       key=name) from None
    if not low <= value <= high:
        raise BadInput(f"query parameter '{name}' must be between {low} and {high}", key=name)
    return value


def query_bool(name: str) -> bool | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise BadInput(f"query parameter '{name}' must be true or false, got {raw!r}", key=name)


def query_datetime(name: str, *, end_of_day: bool = False) -> datetime | None:
    """An ISO date or date-time; a bare date means its start (or, for ``until``, its end).
    Times without a zone are UTC, as stored."""
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        if len(raw) == 10:
            day = datetime.strptime(raw, "%Y-%m-%d").date()
            value = datetime.combine(day, time.max if end_of_day else time.min)
        else:
            value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"query parameter '{name}' must be a date like 2025-01-31 or an ISO "
                       f"date-time, got {raw!r}", key=name) from None
    if not value.tzinfo:
        return value.replace(tzinfo=timezone.utc)
    try:  # stored times are UTC; 0001-01-01T00:00+14:00 is before year 1 there
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise BadInput(f"query parameter '{name}' is out of range: {raw!r} in UTC falls "
                       "outside the years 1 to 9999", key=name,
                       fix="use a date between 0001-01-02 and 9999-12-30") from None


def query_text(name: str, *, max_chars: int = 200) -> str | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > max_chars:
        raise BadInput(f"query parameter '{name}' is longer than {max_chars} characters",
                       key=name)
    return raw

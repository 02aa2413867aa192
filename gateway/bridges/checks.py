"""Field checks for the bridged request bodies, in the style of `gateway.validation`:
each names the field and the expected form. Only what the bridge relies on, or what
litellm's translation would fail on less clearly, is checked."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.validation import MAX_OUTPUT_TOKENS

Check = Callable[[Any], bool]
TOKENS_FORM = f"an integer in [1, {MAX_OUTPUT_TOKENS:_}]"
FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what OpenAI's chat API takes


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_tokens(value: Any) -> bool:
    return is_int(value) and 1 <= value <= MAX_OUTPUT_TOKENS


def between(low: float, high: float) -> Check:
    return lambda v: v is None or (is_number(v) and low <= v <= high)


def optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def is_objects(value: Any) -> bool:
    """An array of objects."""
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def is_function_name(value: Any) -> bool:
    return isinstance(value, str) and FUNCTION_NAME.match(value) is not None


def show(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "null"
    return text if len(text) <= 40 else text[:37] + "..."


def expect(ok: bool, field: str, expected: str, value: Any) -> None:
    if not ok:
        raise InvalidRequest(f"'{field}' must be {expected}, got {show(value)}", param=field)


def check_fields(
    body: Mapping[str, Any], table: Mapping[str, tuple[Check, str]], prefix: str = ""
) -> None:
    """Each field of `table` that `body` has passes its check."""
    for name, (check, expected) in table.items():
        if name in body:
            expect(check(body[name]), prefix + name, expected, body[name])


def refuse(field: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"'{field}' is not supported here: {why}", param=field)

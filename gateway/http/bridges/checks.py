"""Field checks for the bridged request bodies, in the style of `gateway.http.validation`:
each names the field and the expected form. Only what the bridge relies on, or what
litellm's translation would fail on less clearly, is checked."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gateway.errors import InvalidRequest
from gateway.http.validation import (  # the chat surface's rules, shared
    MAX_TOKENS_FORM,
    Check,
    check_fields,
    is_int,
    is_number,
    is_token_limit,
    show,
)

__all__ = [
    "MAX_TOKENS_FORM",
    "Check",
    "between",
    "check_fields",
    "expect",
    "is_function_name",
    "is_int",
    "is_number",
    "is_objects",
    "is_token_limit",
    "optional",
    "refuse",
    "unbridged_top_field",
]

FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what OpenAI's chat API takes


def between(low: float, high: float) -> Check:
    return lambda v: v is None or (is_number(v) and low <= v <= high)


def optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def is_objects(value: Any) -> bool:
    """An array of objects."""
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def is_function_name(value: Any) -> bool:
    return isinstance(value, str) and FUNCTION_NAME.match(value) is not None


def expect(ok: bool, field: str, expected: str, value: Any) -> None:
    if not ok:
        raise InvalidRequest(f"'{field}' must be {expected}, got {show(value)}", param=field)


def refuse(field: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"'{field}' is not supported here: {why}", param=field)


def unbridged_top_field(
    body: Mapping[str, Any],
    known: Collection[str],
    untranslated: Mapping[str, Callable[[Any], bool]],
    surface: str,
) -> tuple[str, str] | None:
    """The first top-level field a bridge cannot serve, and why: one `surface` (the API)
    does not have, or one whose value asks for what translation to chat cannot give
    (`untranslated`: field -> whether the value does)."""
    for name, value in body.items():
        if name not in known:
            return name, f"'{name}' is not a field of the {surface}"
        if name in untranslated and untranslated[name](value):
            return name, f"'{name}' is not translated for an OpenAI-style deployment"
    return None

"""Checks on OpenAI request bodies: the fields the gateway relies on, the common ones
whose wrong type an upstream would reject less clearly, and the combinations OpenAI
itself refuses (`stream_options` without `stream`, `best_of` below `n`).

Everything else (tool definitions, response_format, logprobs, user, unknown fields)
passes to the upstream untouched. The body stays a plain dict: parsing it into
models would cost time on every request and could reorder or drop fields.

Bounds that keep budgets sound: JSON nesting (`MAX_JSON_DEPTH`, one limit for parsing
and re-serialising: orjson reads 1,023 levels but writes only 254), and the output a
request may ask for (`MAX_OUTPUT_TOKENS` per choice and in all: prompts x n x max).
Numbers reach the upstream as written: an integer orjson cannot hold (beyond 64 bits,
which it would read as a float) is refused wherever it is, naming its field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.request import MAX_OUTPUT_TOKENS, asked_tokens, choices_of
from gateway.upstreams.base import EndpointType

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Deep enough for any tool's JSON schema, well inside what orjson re-serialises (254).
MAX_JSON_DEPTH = 128
MAX_TOKENS_FORM = f"an integer in [1, {MAX_OUTPUT_TOKENS:_}]"
# OpenAI's seed: a signed 64-bit integer.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
SEED_FORM = f"an integer in [{INT64_MIN}, {INT64_MAX}]"
# The integers orjson reads exactly (i64 and u64); beyond them it reads a float. The
# shortest literal beyond them has 19 digits (-9223372036854775809): bodies without such
# a run of digits cannot hold one, so most are never parsed twice. The run is found with
# every digit read as 0 and one `find` (a regex takes ten times as long).
EXACT_INT_MIN, EXACT_INT_MAX = INT64_MIN, 2**64 - 1
MAX_EXACT_INT_CHARS = len(str(EXACT_INT_MIN))
DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"0" * 9)
LONG_DIGIT_RUN = b"0" * 19

Check = Callable[[Any], bool]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_token_limit(value: Any) -> bool:
    return is_int(value) and 1 <= value <= MAX_OUTPUT_TOKENS


# field -> (check, expected form for the message). Only checked when present.
OPTIONAL_FIELDS: Mapping[str, tuple[Check, str]] = {
    # null is OpenAI's "not streaming", as for the other nullable fields (read as falsy)
    "stream": (lambda v: v is None or isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: v is None or isinstance(v, dict), "an object"),
    "seed": (lambda v: v is None or (is_int(v) and INT64_MIN <= v <= INT64_MAX), SEED_FORM),
    "max_tokens": (lambda v: v is None or is_token_limit(v), MAX_TOKENS_FORM),
    "max_completion_tokens": (lambda v: v is None or is_token_limit(v), MAX_TOKENS_FORM),
    "n": (lambda v: v is None or (is_int(v) and 1 <= v <= 128), "an integer in [1, 128]"),
    "best_of": (lambda v: v is None or (is_int(v) and 1 <= v <= 128), "an integer in [1, 128]"),
    "temperature": (lambda v: v is None or (is_number(v) and 0 <= v <= 2), "a number in [0, 2]"),
    "top_p": (lambda v: v is None or (is_number(v) and 0 <= v <= 1), "a number in [0, 1]"),
    "top_logprobs": (lambda v: v is None or (is_int(v) and v >= 0), "a non-negative integer"),
    "dimensions": (lambda v: v is None or (is_int(v) and v >= 1), "a positive integer"),
    "tools": (lambda v: v is None or isinstance(v, list), "an array"),
    "user": (lambda v: v is None or isinstance(v, str), "a string"),
}

REQUIRED_INPUT: Mapping[str, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
}


def parse_body(
    raw: bytes, endpoint: EndpointType, on_model: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Parse and check a request body; raises InvalidRequest naming the field.
    `on_model` sees the model name as soon as it is known (to label errors)."""
    body = parse_object(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    if on_model is not None:
        on_model(model)
    _check_input(body, endpoint)
    check_fields(body, OPTIONAL_FIELDS)
    if body.get("stream") and endpoint == "embeddings":
        raise InvalidRequest("embeddings cannot be streamed", param="stream")
    if body.get("stream_options") is not None and not body.get("stream"):
        # OpenAI's own refusal: options for a stream that is not asked for.
        raise InvalidRequest(
            "'stream_options' is only allowed when 'stream' is enabled", param="stream_options"
        )
    _check_tools(body.get("tools"))
    if endpoint == "completions":
        _check_best_of(body)
    _check_output_total(body, endpoint)
    return body


def parse_object(raw: bytes) -> dict[str, Any]:
    """A body that must be a JSON object nested at most `MAX_JSON_DEPTH` levels deep
    (any API's: the format bridges parse theirs with it too)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    _check_depth(raw, body)
    _check_exact_integers(raw)
    return body


def _check_depth(raw: bytes, body: dict[str, Any]) -> None:
    """Refuse JSON nested deeper than `MAX_JSON_DEPTH`. Bodies with fewer brackets
    than that cannot be, so most are never walked."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return
    level: list[Any] = [body]
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return
    raise InvalidRequest(
        f"request body is nested more than {MAX_JSON_DEPTH} levels deep; "
        f"at most {MAX_JSON_DEPTH} are accepted",
        code="nesting_too_deep",
    )


class _Inexact(str):
    """An integer literal orjson would read as a float, as the client wrote it."""


def _exact_int(literal: str) -> int | _Inexact:
    """`json`'s `parse_int`: the integer, or its literal when orjson cannot hold it
    (only short literals are converted: `int()` refuses over 4,300 digits)."""
    if len(literal) <= MAX_EXACT_INT_CHARS:
        value = int(literal)
        if EXACT_INT_MIN <= value <= EXACT_INT_MAX:
            return value
    return _Inexact(literal)


def _check_exact_integers(raw: bytes) -> None:
    """Refuse an integer beyond 64 bits anywhere in the body: orjson reads it as a
    float, so the upstream would get another number than the client sent (and a check
    would echo the rounded one). Bodies with a long run of digits are parsed again, by
    `json`, which keeps integer literals as written; after `_check_depth`, so its
    recursion stays shallow."""
    if raw.translate(DIGITS_AS_ZERO).find(LONG_DIGIT_RUN) < 0:
        return
    found = _first_inexact(json.loads(raw, parse_int=_exact_int), "")
    if found is not None:
        field, literal = found
        shown = literal if len(literal) <= 40 else literal[:37] + "..."
        raise InvalidRequest(
            f"'{field}' is an integer beyond 64 bits, which would not reach the upstream "
            f"as written; integers must be in [{EXACT_INT_MIN}, {EXACT_INT_MAX}], got {shown}",
            param=field,
        )


def _first_inexact(value: Any, path: str) -> tuple[str, str] | None:
    """The path and literal of the first `_Inexact` in a parsed body."""
    if isinstance(value, _Inexact):
        return path, str(value)
    if isinstance(value, dict):
        children = ((f"{path}.{k}" if path else k, v) for k, v in value.items())
    elif isinstance(value, list):
        children = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for child_path, child in children:
        if (found := _first_inexact(child, child_path)) is not None:
            return found
    return None


def _check_tools(tools: Any) -> None:
    """Tools are objects (their contents are the upstream's to check)."""
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict):
            raise InvalidRequest(
                f"'tools[{i}]' must be an object, got {show(tool)}", param=f"tools[{i}]"
            )


def _check_best_of(body: dict[str, Any]) -> None:
    """A completion's `best_of` picks the best `n` of its answers: no fewer than `n`."""
    best_of, n = body.get("best_of"), body.get("n") or 1
    if best_of is not None and best_of < n:
        raise InvalidRequest(
            f"'best_of' must be at least 'n' ({n}), got {best_of}", param="best_of"
        )


def _check_output_total(body: dict[str, Any], endpoint: EndpointType) -> None:
    """Choices x max tokens within `MAX_OUTPUT_TOKENS` (what budgets reserve)."""
    if endpoint == "embeddings":
        return
    per_choice = asked_tokens(body) or 1
    choices = choices_of(endpoint, body)
    if per_choice * choices > MAX_OUTPUT_TOKENS:
        field = "max_completion_tokens" if body.get("max_completion_tokens") else "max_tokens"
        raise InvalidRequest(
            f"the request asks for up to {per_choice * choices:_} output tokens ({choices} "
            f"choices x {per_choice:_} '{field}'); at most {MAX_OUTPUT_TOKENS:_} are accepted",
            param=field,
        )


def _check_input(body: dict[str, Any], endpoint: EndpointType) -> None:
    field = REQUIRED_INPUT[endpoint]
    if field not in body:
        raise InvalidRequest(f"'{field}' is required", param=field)
    value = body[field]
    if endpoint == "chat":
        _check_messages(value)
    elif not _is_prompt(value):
        raise InvalidRequest(
            f"'{field}' must be a string, an array of strings, an array of token ids "
            f"(integers) or an array of such arrays, none of them empty; got {show(value)}",
            param=field,
        )


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_int(t) and t >= 0 for t in value)


def _is_prompt(value: Any) -> bool:
    """OpenAI's four prompt forms; anything else would be counted as nothing."""
    if isinstance(value, str):
        return True
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    if isinstance(first, str):
        return all(isinstance(v, str) for v in value)
    if isinstance(first, list):
        return all(_is_token_ids(v) for v in value)
    return _is_token_ids(value)


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            f"'messages' must be a non-empty array, got {show(messages)}", param="messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object, got {show(message)}", param=f"messages[{i}]"
            )
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise InvalidRequest(
                f"'messages[{i}].role' must be one of {', '.join(sorted(CHAT_ROLES))}, "
                f"got {show(role)}",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not (
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
        ):
            raise InvalidRequest(
                f"'messages[{i}].content' must be a string, an array of parts (objects) or "
                f"null, got {show(content)}",
                param=f"messages[{i}].content",
            )


def check_fields(
    body: Mapping[str, Any], table: Mapping[str, tuple[Check, str]], prefix: str = ""
) -> None:
    """Each field of `table` that `body` has passes its check, else a 400 naming it."""
    for name, (check, expected) in table.items():
        if name in body and not check(body[name]):
            field = prefix + name
            raise InvalidRequest(
                f"'{field}' must be {expected}, got {show(body[name])}", param=field
            )


def show(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "null"
    return text if len(text) <= 40 else text[:37] + "..."

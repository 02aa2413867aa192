"""Checks on OpenAI request bodies: the fields the gateway relies on, and the
common ones whose wrong type an upstream would reject less clearly.

Everything else (tools, response_format, logprobs, seed, user, unknown fields)
passes to the upstream untouched. The body stays a plain dict: parsing it into
models would cost time on every request and could reorder or drop fields.

Bounds that keep budgets sound: JSON nesting (`MAX_JSON_DEPTH`, one limit for parsing
and re-serialising: orjson reads 1,023 levels but writes only 254), and the output a
request may ask for (`MAX_OUTPUT_TOKENS` per choice and in all: prompts x n x max).
"""

from __future__ import annotations

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
    "max_tokens": (lambda v: v is None or is_token_limit(v), MAX_TOKENS_FORM),
    "max_completion_tokens": (lambda v: v is None or is_token_limit(v), MAX_TOKENS_FORM),
    "n": (lambda v: v is None or (is_int(v) and 1 <= v <= 128), "an integer in [1, 128]"),
    "best_of": (lambda v: v is None or (is_int(v) and 1 <= v <= 128), "an integer in [1, 128]"),
    "temperature": (lambda v: v is None or (is_number(v) and 0 <= v <= 2), "a number in [0, 2]"),
    "top_p": (lambda v: v is None or (is_number(v) and 0 <= v <= 1), "a number in [0, 1]"),
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

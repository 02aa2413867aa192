"""Checks on OpenAI request bodies: the fields the gateway relies on, and the
common ones whose wrong type an upstream would reject less clearly.

Everything else (tools, response_format, logprobs, seed, user, unknown fields)
passes to the upstream untouched. The body stays a plain dict: parsing it into
models would cost time on every request and could reorder or drop fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.upstreams.base import EndpointType

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

Check = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# field -> (check, expected form for the message). Only checked when present.
OPTIONAL_FIELDS: Mapping[str, tuple[Check, str]] = {
    # null is OpenAI's "not streaming", as for the other nullable fields (read as falsy)
    "stream": (lambda v: v is None or isinstance(v, bool), "a boolean"),
    "stream_options": (lambda v: v is None or isinstance(v, dict), "an object"),
    "max_tokens": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1"),
    "max_completion_tokens": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1"),
    "n": (lambda v: v is None or (_is_int(v) and 1 <= v <= 128), "an integer in [1, 128]"),
    "temperature": (lambda v: v is None or (_is_number(v) and 0 <= v <= 2), "a number in [0, 2]"),
    "top_p": (lambda v: v is None or (_is_number(v) and 0 <= v <= 1), "a number in [0, 1]"),
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
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    if on_model is not None:
        on_model(model)
    _check_input(body, endpoint)
    for name, (check, expected) in OPTIONAL_FIELDS.items():
        if name in body and not check(body[name]):
            raise InvalidRequest(
                f"'{name}' must be {expected}, got {_show(body[name])}", param=name
            )
    if body.get("stream") and endpoint == "embeddings":
        raise InvalidRequest("embeddings cannot be streamed", param="stream")
    return body


def _check_input(body: dict[str, Any], endpoint: EndpointType) -> None:
    field = REQUIRED_INPUT[endpoint]
    if field not in body:
        raise InvalidRequest(f"'{field}' is required", param=field)
    value = body[field]
    if endpoint == "chat":
        _check_messages(value)
    elif not isinstance(value, str | list) or (isinstance(value, list) and not value):
        raise InvalidRequest(
            f"'{field}' must be a string or a non-empty array, got {_show(value)}", param=field
        )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            f"'messages' must be a non-empty array, got {_show(messages)}", param="messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(
                f"'messages[{i}]' must be an object, got {_show(message)}", param=f"messages[{i}]"
            )
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidRequest(
                f"'messages[{i}].role' must be one of {', '.join(sorted(CHAT_ROLES))}, "
                f"got {_show(role)}",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"'messages[{i}].content' must be a string, an array of parts or null, "
                f"got {_show(content)}",
                param=f"messages[{i}].content",
            )


def _show(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "null"
    return text if len(text) <= 40 else text[:37] + "..."

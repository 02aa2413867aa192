"""Checks on OpenAI request bodies: the fields the gateway relies on, the common ones
whose wrong type an upstream would reject less clearly, and the combinations OpenAI
itself refuses (`stream_options` without `stream`, `best_of` below `n`).

Everything else (tool definitions, response_format, logprobs, user, unknown fields)
passes to the upstream untouched. The body stays a plain dict: parsing it into
models would cost time on every request and could reorder or drop fields.

Bounds that keep budgets sound: JSON nesting (`MAX_JSON_DEPTH`, one limit for parsing
and re-serialising: orjson reads 1,023 levels but writes only 254), and the output a
request may ask for (`MAX_OUTPUT_TOKENS` per choice and in all: prompts x n x max).
Integers reach the upstream as written (floats are re-serialised: 1e+20 for
100000000000000000000e0): an integer orjson cannot hold (beyond 64 bits, which it
would read as a float) is refused wherever it is, naming its field.
"""

from __future__ import annotations

import json
import re
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
# The integers orjson reads exactly (i64 and u64); beyond them it reads a float. Their
# literals are runs of digits and `-`: the shortest beyond them is 20 characters long
# (-9223372036854775809, 18446744073709551616; every 19-digit number is a u64, so
# nanosecond timestamps and 19-digit IDs are not candidates). Bodies without such a run
# cannot hold one, so most are never parsed twice. Runs are found with every digit and
# `-` read as 0 (`OUTLINE`) and `find` (a regex takes ten times as long); only a run
# that is one integer, out of range, where an integer token can stand has the body
# parsed again.
EXACT_INT_MIN, EXACT_INT_MAX = INT64_MIN, 2**64 - 1
MAX_EXACT_INT_CHARS = len(str(EXACT_INT_MIN))
MAX_EXACT_INT_DIGITS = len(str(EXACT_INT_MAX))
# What both prefilters read, one copy of the body: digits and `-` as 0 (runs that may
# be integers), `{` as `[` (brackets that may nest), counted once.
OUTLINE = bytes.maketrans(b"123456789-{", b"0" * 10 + b"[")
LONG_NUMBER_RUN = b"0" * min(len(str(EXACT_INT_MIN - 1)), len(str(EXACT_INT_MAX + 1)))
ZEROS = re.compile(rb"0*")
JSON_SPACE = b" \t\n\r"
SPACES = re.compile(rb"[ \t\n\r]*")
BEFORE_VALUE = frozenset(b":,[")  # what a value in an object or array follows
AFTER_VALUE = frozenset(b",]}")  # ... and what it is followed by
MINUS = ord("-")
# Field paths are built from the client's keys: an error echoes at most this much.
MAX_SHOWN_PATH = 128

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
    outline = raw.translate(OUTLINE)
    _check_depth(body, outline.count(b"["))
    _check_exact_integers(raw, outline)
    return body


def _check_depth(body: dict[str, Any], brackets: int) -> None:
    """Refuse JSON nested deeper than `MAX_JSON_DEPTH`. Bodies with fewer opening
    `brackets` than that cannot be, so most are never walked."""
    if brackets <= MAX_JSON_DEPTH:
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
    """`json`'s `parse_int` for bodies with a literal over `int()`'s 4,300 digits: the
    integer, or its literal when orjson cannot hold it (only short ones are converted).
    A callback per integer: three times as slow as `json`'s own."""
    if len(literal) <= MAX_EXACT_INT_CHARS:
        value = int(literal)
        if EXACT_INT_MIN <= value <= EXACT_INT_MAX:
            return value
    return _Inexact(literal)


def _check_exact_integers(raw: bytes, outline: bytes | None = None) -> None:
    """Refuse an integer beyond 64 bits anywhere in the body: orjson reads it as a
    float, so the upstream would get another number than the client sent (and a check
    would echo the rounded one). Bodies that may hold one are parsed again, by `json`,
    which keeps integers exact; after `_check_depth`, so its recursion stays shallow."""
    if not _may_hold_inexact_integer(raw, outline):
        return
    try:
        parsed = json.loads(raw)
    except ValueError:  # an integer literal over int()'s 4,300 digits
        parsed = json.loads(raw, parse_int=_exact_int)
    found = _first_inexact(parsed)
    if found is not None:
        field, literal = found
        shown = literal if len(literal) <= 40 else literal[:37] + "..."
        raise InvalidRequest(
            f"'{field}' is an integer beyond 64 bits, which would not reach the upstream "
            f"as written; integers must be in [{EXACT_INT_MIN}, {EXACT_INT_MAX}], got {shown}",
            param=field,
        )


def _may_hold_inexact_integer(raw: bytes, outline: bytes | None = None) -> bool:
    """Whether valid JSON `raw` may hold an integer orjson cannot read exactly: a run of
    digits (a `-` before them) out of [`EXACT_INT_MIN`, `EXACT_INT_MAX`] that stands
    where an integer token can: after `:`, `,`, `[` or nothing, and before `,`, `]`, `}`
    or nothing, JSON whitespace between. Runs inside strings, in floats (a `.`, `e` or
    `E` beside them) and in range are passed over. Never false for a body that holds
    one (a string holding `, 12345678901234567890,` may make it true: the parse that
    follows decides). Linear, each scan in C; some Python per run of 20 characters.
    `outline` is `raw` translated by `OUTLINE`, when the caller has it."""
    zeros = raw.translate(OUTLINE) if outline is None else outline
    start = zeros.find(LONG_NUMBER_RUN)
    while start >= 0:
        # `start` begins a run: the first search is from 0, the others from its end.
        end = start + len(LONG_NUMBER_RUN)
        if zeros.startswith(b"0", end):  # a longer run: to its end, in C
            end = _match_end(ZEROS, zeros, end)
        if _may_be_inexact(raw, start, end):
            return True
        start = zeros.find(LONG_NUMBER_RUN, end)
    return False


def _match_end(pattern: re.Pattern[bytes], raw: bytes, at: int) -> int:
    """Where `pattern` (one that matches the empty string) stops matching from `at`."""
    match = pattern.match(raw, at)
    return match.end() if match is not None else at


def _may_be_inexact(raw: bytes, start: int, end: int) -> bool:
    """Whether `raw[start:end]`, a whole run of digits and `-`, may be an integer token
    orjson cannot read exactly."""
    digits = start + 1 if raw[start] == MINUS else start
    if raw.find(b"-", digits, end) >= 0:
        return False  # not one integer: a date, a rule, an exponent
    if (
        end - digits <= MAX_EXACT_INT_DIGITS
        and EXACT_INT_MIN <= int(raw[start:end]) <= EXACT_INT_MAX
    ):
        return False  # in range: a u64 ID, an i64
    after = _match_end(SPACES, raw, end)
    if after < len(raw) and raw[after] not in AFTER_VALUE:
        return False  # in a string, or a float's mantissa
    before = _last_non_space(raw, start)
    return before < 0 or raw[before] in BEFORE_VALUE


def _last_non_space(raw: bytes, end: int) -> int:
    """The index of the last byte before `end` that is not JSON whitespace, -1 if there
    is none: stripped in chunks that double, so a long run of it costs C time."""
    size = 16
    while end > 0:
        start = max(0, end - size)
        kept = len(raw[start:end].rstrip(JSON_SPACE))
        if kept:
            return start + kept - 1
        end, size = start, size * 2
    return -1


def _first_inexact(body: Any) -> tuple[str, str] | None:
    """The path (as `show_path` shows it) and literal of the first integer orjson
    cannot read exactly in a body parsed by `json`. The path is joined once, found:
    joined at each level, a long key would be copied at each."""
    found = _inexact_steps(body) if isinstance(body, dict | list) else None
    if found is None:
        return None
    steps, literal = found
    parts: list[str] = []
    for step in reversed(steps):
        if isinstance(step, int):
            parts.append(f"[{step}]")
        else:
            parts.append(f".{step}" if any(parts) else step)
    return show_path("".join(parts)), literal


def _inexact_steps(node: dict[str, Any] | list[Any]) -> tuple[list[str | int], str] | None:
    """The keys and indexes (innermost first) to the first integer out of range or
    `_Inexact` under `node`, and its literal. Scalars are checked in the loop (a call
    each would double the walk's time)."""
    children: Any = node.items() if isinstance(node, dict) else enumerate(node)
    for step, child in children:
        if type(child) is int:
            if EXACT_INT_MIN <= child <= EXACT_INT_MAX:
                continue
            return [step], str(child)
        if isinstance(child, _Inexact):
            return [step], str(child)
        if isinstance(child, dict | list) and (found := _inexact_steps(child)) is not None:
            found[0].append(step)
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
    if endpoint == "embeddings":
        _check_no_empty_text(value)


def _check_no_empty_text(value: Any) -> None:
    """OpenAI embeds no empty string (a completion's prompt may be one)."""
    texts = [value] if isinstance(value, str) else value
    for i, text in enumerate(texts):
        if text == "":
            field = "input" if isinstance(value, str) else f"input[{i}]"
            raise InvalidRequest(f"'{field}' must not be an empty string", param=field)


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
            field = show_path(prefix + name)
            raise InvalidRequest(
                f"'{field}' must be {expected}, got {show(body[name])}", param=field
            )


def show(value: Any) -> str:
    text = orjson.dumps(value).decode() if value is not None else "null"
    return text if len(text) <= 40 else text[:37] + "..."


def show_path(path: str) -> str:
    """A field path as errors echo it (`param` and message): built from the client's
    keys, so cut as `show` cuts values."""
    return path if len(path) <= MAX_SHOWN_PATH else path[: MAX_SHOWN_PATH - 3] + "..."

"""Checks OpenAI itself makes, made before any upstream is called: `stream_options`
only on a stream, tools that are objects, `best_of` no fewer than `n`; and numbers
that reach the upstream as the client wrote them (an integer beyond 64 bits, which
orjson would read as a float, is refused naming its field; `seed` is OpenAI's signed
64-bit integer). Through the running gateway over loopback, and as properties of the
parser itself."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.http.validation import parse_body, parse_object
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, openai_compatible_policy

MESSAGES = [{"role": "user", "content": "hi"}]
U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
FUNCTION = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url


def post(base: str, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{base}{path}", content=body, headers=AUTH, timeout=30)
    return httpx.post(f"{base}{path}", json=body, headers=AUTH, timeout=30)


def refused(response: httpx.Response, param: str) -> str:
    """The message of a 400 in OpenAI's shape naming `param`."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert f"'{param}'" in error["message"]
    return str(error["message"])


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": MESSAGES, **extra}


# OpenAI's own checks.


@pytest.mark.parametrize(
    "extra",
    [
        {"stream_options": {"include_usage": True}},
        {"stream": False, "stream_options": {"include_usage": True}},
        {"stream": None, "stream_options": {}},
    ],
)
def test_stream_options_need_a_stream(
    base: str, fake_openai: FakeOpenAI, extra: dict[str, Any]
) -> None:
    message = refused(post(base, "/v1/chat/completions", chat(**extra)), "stream_options")
    assert "only allowed when 'stream' is enabled" in message
    assert fake_openai.requests == []


def test_stream_options_on_completions_need_a_stream_too(base: str) -> None:
    body = {"model": "auto", "prompt": "hi", "stream_options": {"include_usage": True}}
    refused(post(base, "/v1/completions", body), "stream_options")


def test_stream_options_on_a_stream_are_passed_on(base: str, fake_openai: FakeOpenAI) -> None:
    body = chat(stream=True, stream_options={"include_usage": True})
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        chunks = [line for line in response.iter_lines() if line.startswith("data: {")]
    assert json.loads(chunks[-1][6:])["usage"]["completion_tokens"] > 0
    assert fake_openai.requests[-1]["body"]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    ("tools", "param"),
    [([1], "tools[0]"), ([FUNCTION, "f"], "tools[1]"), ([FUNCTION, None], "tools[1]")],
)
def test_tools_must_be_objects(
    base: str, fake_openai: FakeOpenAI, tools: list[Any], param: str
) -> None:
    message = refused(post(base, "/v1/chat/completions", chat(tools=tools)), param)
    assert "must be an object" in message
    assert fake_openai.requests == []


def test_tool_objects_are_passed_on(base: str, fake_openai: FakeOpenAI) -> None:
    response = post(base, "/v1/chat/completions", chat(tools=[FUNCTION]))
    assert response.status_code == 200, response.text
    assert fake_openai.requests[-1]["body"]["tools"] == [FUNCTION]


@pytest.mark.parametrize(("n", "best_of"), [(2, 1), (5, 4), (128, 1)])
def test_best_of_below_n_is_refused(
    base: str, fake_openai: FakeOpenAI, n: int, best_of: int
) -> None:
    body = {"model": "auto", "prompt": "hi", "max_tokens": 5, "n": n, "best_of": best_of}
    message = refused(post(base, "/v1/completions", body), "best_of")
    assert f"at least 'n' ({n}), got {best_of}" in message
    assert fake_openai.requests == []


@pytest.mark.parametrize(("n", "best_of"), [(2, 2), (1, 3), (None, 1), (3, None)])
def test_best_of_at_least_n_is_served(
    base: str, fake_openai: FakeOpenAI, n: int | None, best_of: int | None
) -> None:
    body = {"model": "auto", "prompt": "hi", "max_tokens": 5, "n": n, "best_of": best_of}
    response = post(base, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert fake_openai.requests[-1]["body"]["best_of"] == best_of


# Integers as written.


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("max_tokens", 2**64),
        ("n", 10**30),
        ("max_completion_tokens", -(10**25)),
        ("top_logprobs", 2**70),
    ],
)
def test_integers_beyond_64_bits_are_refused_as_written(
    base: str, fake_openai: FakeOpenAI, field: str, value: int
) -> None:
    """Before: orjson read them as floats; `seed` went upstream as 1.8446744073709552e+19,
    `max_tokens` was refused echoing that float."""
    message = refused(post(base, "/v1/chat/completions", chat(**{field: value})), field)
    assert f"got {value}" in message and "e+" not in message
    assert fake_openai.requests == []


def test_an_integer_beyond_64_bits_anywhere_is_named(base: str, fake_openai: FakeOpenAI) -> None:
    raw = b'{"model": "auto", "messages": [{"role": "user", "content": "hi"}], '
    raw += b'"metadata": {"ids": [1, 123456789012345678901234567890]}}'
    message = refused(post(base, "/v1/chat/completions", raw), "metadata.ids[1]")
    assert "123456789012345678901234567890" in message
    assert fake_openai.requests == []


@pytest.mark.parametrize("seed", [2**63, U64_MAX, 1.5, 1e19, "7", True])
def test_a_seed_is_a_signed_64_bit_integer(base: str, fake_openai: FakeOpenAI, seed: Any) -> None:
    message = refused(post(base, "/v1/chat/completions", chat(seed=seed)), "seed")
    assert f"[{I64_MIN}, {I64_MAX}]" in message
    assert fake_openai.requests == []


@pytest.mark.parametrize("seed", [I64_MIN, I64_MAX, 0, None])
def test_seeds_in_range_reach_the_upstream_exactly(
    base: str, fake_openai: FakeOpenAI, seed: int | None
) -> None:
    raw = json.dumps(chat(seed=seed, metadata={"big": U64_MAX})).encode()
    response = post(base, "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text
    sent = fake_openai.requests[-1]["body"]
    assert sent["seed"] == seed and type(sent["seed"]) is type(seed)
    assert sent["metadata"]["big"] == U64_MAX and isinstance(sent["metadata"]["big"], int)


def test_long_digit_runs_in_strings_and_floats_are_left_alone(
    base: str, fake_openai: FakeOpenAI
) -> None:
    content = "call 123456789012345678901234567890 now"
    raw = json.dumps(chat(messages=[{"role": "user", "content": content}])).encode()
    raw = raw[:-1] + b', "metadata": {"x": 12345678901234567890.5}}'
    response = post(base, "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text
    sent = fake_openai.requests[-1]["body"]
    assert sent["messages"][0]["content"] == content
    assert sent["metadata"]["x"] == 12345678901234567890.5


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", chat(top_logprobs=-1, logprobs=True), "top_logprobs"),
        ("/v1/chat/completions", chat(top_logprobs=1.0, logprobs=True), "top_logprobs"),
        ("/v1/embeddings", {"model": "auto", "input": "hi", "dimensions": 0}, "dimensions"),
        ("/v1/embeddings", {"model": "auto", "input": "hi", "dimensions": "8"}, "dimensions"),
    ],
)
def test_other_integer_fields_are_integers(
    base: str, fake_openai: FakeOpenAI, path: str, body: dict[str, Any], param: str
) -> None:
    refused(post(base, path, body), param)
    assert fake_openai.requests == []


# The parser's properties.

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False)
)
WIDE_INTEGERS = st.integers(min_value=-(2**80), max_value=2**80) | st.sampled_from(
    [I64_MIN - 1, I64_MIN, I64_MAX, I64_MAX + 1, U64_MAX, U64_MAX + 1, -(2**64)]
)
JSON_VALUES = st.recursive(
    JSON_SCALARS | WIDE_INTEGERS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=10,
)


def inexact_paths(value: Any, path: str = "") -> list[str]:
    """Where `value` holds an integer orjson cannot read exactly."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [] if I64_MIN <= value <= U64_MAX else [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in inexact_paths(v, f"{path}.{k}" if path else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in inexact_paths(v, f"{path}[{i}]")]
    return []


@settings(deadline=None, database=None, max_examples=300)
@given(body=st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=4))
def test_a_parsed_body_holds_the_numbers_written_or_is_refused(body: dict[str, Any]) -> None:
    """Every number parsed is the one written (same JSON when written again), or the
    body is refused naming the first integer that would not be."""
    raw = json.dumps(body).encode()
    wrong = inexact_paths(body)
    try:
        parsed = parse_object(raw)
    except InvalidRequest as error:
        assert wrong and error.param == wrong[0]
    else:
        assert not wrong
        assert json.dumps(parsed) == raw.decode()


@settings(deadline=None, database=None, max_examples=300)
@given(seed=WIDE_INTEGERS)
def test_a_seed_is_kept_exactly_or_refused_naming_it(seed: int) -> None:
    raw = json.dumps(chat(seed=seed)).encode()
    try:
        parsed = parse_body(raw, "chat")
    except InvalidRequest as error:
        assert error.param == "seed" and str(seed) in error.message
        assert not I64_MIN <= seed <= I64_MAX
    else:
        assert I64_MIN <= seed <= I64_MAX
        assert type(parsed["seed"]) is int and parsed["seed"] == seed

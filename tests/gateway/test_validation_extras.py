"""Checks OpenAI itself makes, made before any upstream is called: `stream_options`
only on a stream, tools that are objects, `best_of` no fewer than `n`; and integers
that reach the upstream as the client wrote them (an integer beyond 64 bits, which
orjson would read as a float, is refused naming its field; `seed` is OpenAI's signed
64-bit integer), without parsing a body twice for digits in its strings. Through the
running gateway over loopback, and as properties of the parser itself."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.http import validation
from gateway.http.validation import (
    MAX_SHOWN_PATH,
    _may_hold_inexact_integer,
    parse_body,
    parse_object,
)
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


def assert_kept_or_refused(body: dict[str, Any], layout: dict[str, Any]) -> tuple[bytes, list[str]]:
    """`body` written with `layout` is refused naming its first integer beyond 64 bits,
    or parsed holding what was written; the bytes and the integers' paths."""
    raw = json.dumps(body, **layout).encode()
    wrong = inexact_paths(body)
    try:
        parsed = parse_object(raw)
    except InvalidRequest as error:
        assert wrong and error.param == wrong[0]
    else:
        assert not wrong
        assert json.dumps(parsed, **layout) == raw.decode()
    return raw, wrong


@settings(deadline=None, database=None, max_examples=300)
@given(body=st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=4))
def test_a_parsed_body_holds_the_numbers_written_or_is_refused(body: dict[str, Any]) -> None:
    """Every number parsed is the one written (same JSON when written again), or the
    body is refused naming the first integer that would not be."""
    assert_kept_or_refused(body, {})


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


# Long digit runs: only one that may be an integer beyond 64 bits costs a second parse.

LONG_DIGITS = st.text(alphabet="0123456789", min_size=19, max_size=24)
# Digits inside strings, at their edges and beside what follows or precedes a value.
DIGIT_STRINGS = st.builds(
    lambda before, digits, after: before + digits + after,
    st.sampled_from(["", " ", "-", "ts=", ", ", "[", ": ", "\n"]),
    LONG_DIGITS,
    st.sampled_from(["", " ", "ns", ",", ", ", "]", "}", ".5", "e3", "\n"]),
)
# 19- and 20-digit integers orjson holds (nanosecond timestamps, u64 IDs), and beyond.
LONG_INTEGERS = (
    st.integers(min_value=10**18, max_value=U64_MAX)
    | st.integers(min_value=I64_MIN, max_value=-(10**18))
    | st.integers(min_value=U64_MAX + 1, max_value=10**24)
    | st.integers(min_value=-(10**24), max_value=I64_MIN - 1)
    | st.sampled_from([I64_MIN - 1, I64_MIN, I64_MAX, U64_MAX, U64_MAX + 1, -(2**64)])
)
LONG_RUN_VALUES = st.recursive(
    JSON_SCALARS | WIDE_INTEGERS | LONG_INTEGERS | DIGIT_STRINGS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | DIGIT_STRINGS, children, max_size=4)
    ),
    max_leaves=10,
)
# json.dumps' layouts: compact, indented with spaces or tabs, whitespace around ',' ':'.
LAYOUTS = st.sampled_from(
    [
        {},
        {"separators": (",", ":")},
        {"indent": 2},
        {"indent": "\t"},
        {"separators": (" ,\r\n ", " :\n\t")},
    ]
)


@settings(deadline=None, database=None, max_examples=500)
@given(body=st.dictionaries(st.text(max_size=4), LONG_RUN_VALUES, max_size=4), layout=LAYOUTS)
def test_long_digit_runs_anywhere_are_kept_or_refused_as_written(
    body: dict[str, Any], layout: dict[str, Any]
) -> None:
    """Digit runs in strings, keys, in-range and out-of-range integers, negative, nested,
    after any whitespace: a body is refused naming its first integer beyond 64 bits,
    or parsed holding what was written. The prefilter never misses one."""
    raw, wrong = assert_kept_or_refused(body, layout)
    if wrong:
        assert _may_hold_inexact_integer(raw)


# Digits inside a string with no value delimiter beside them, in floats, in range.
STRING_DIGITS = st.builds(
    lambda before, digits, after: before + digits + after,
    st.sampled_from(["", "ts=", "id ", "-", "x-"]),
    LONG_DIGITS,
    st.sampled_from(["", "ns", " z", ".5", "e3"]),
)
IN_RANGE_LONG = st.integers(min_value=I64_MIN, max_value=-(10**18)) | st.integers(
    min_value=10**18, max_value=U64_MAX
)
NO_INEXACT_VALUES = st.recursive(
    JSON_SCALARS | IN_RANGE_LONG | STRING_DIGITS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | STRING_DIGITS, children, max_size=4)
    ),
    max_leaves=10,
)


@settings(deadline=None, database=None, max_examples=300)
@given(body=st.dictionaries(STRING_DIGITS, NO_INEXACT_VALUES, max_size=4), layout=LAYOUTS)
def test_digit_runs_in_strings_and_in_range_integers_are_not_parsed_twice(
    body: dict[str, Any], layout: dict[str, Any]
) -> None:
    raw = json.dumps(body, **layout).encode()
    assert not _may_hold_inexact_integer(raw)
    assert parse_object(raw) == body


@settings(deadline=None, database=None, max_examples=200)
@given(
    digits=LONG_DIGITS.filter(lambda d: d[0] != "0"),
    sign=st.sampled_from(["", "-"]),
    tail=st.sampled_from([".5", ".0", "e3", "E-2", "e+40", ".25e1", "0.5"]),
    space=st.sampled_from(["", " ", "\n  ", "\t"]),
)
def test_long_floats_are_not_parsed_twice(digits: str, sign: str, tail: str, space: str) -> None:
    """Floats are orjson's to read (and re-serialise): no second parse, no refusal."""
    raw = f'{{"x":{space}{sign}{digits}{tail}{space},"y":[{space}{sign}{digits}{tail}]}}'
    assert not _may_hold_inexact_integer(raw.encode())
    parsed = parse_object(raw.encode())
    assert parsed["x"] == float(sign + digits + tail) == parsed["y"][0]


@pytest.mark.parametrize(
    ("raw", "may"),
    [
        (b'{"ts": "1712345678901234567"}', False),
        (b'{"user": "user-1712345678901234567"}', False),
        (b'{"id": "1234567890123456789012345678901234567890"}', False),
        (b'{"text": "at 1712345678901234567 ns, then"}', False),
        (b'{"1712345678901234567": 1}', False),
        (b'{"ts": 1712345678901234567}', False),
        (b'{"ids": [18446744073709551615, -9223372036854775808]}', False),
        (b'{"x": 12345678901234567890.5}', False),
        (b'{"x": 12345678901234567890e2}', False),
        (b'{"x": 1e-12345678901234567890}', False),
        (b'{"x": 1.5E-12345678901234567890, "y": [-0.123456789012345678901]}', False),
        (b'{"ids": [12345678901234567890, -1234567890123456789]}', False),
        (b'{"rule": "' + b"-" * 80 + b'", "d": "2024-01-01-1234567890123456"}', False),
        (b'{"x": [-' + b"-" * 30 + b"1]}", False),  # never valid JSON
        (b'{"x": 18446744073709551616}', True),
        (b'{"x": -9223372036854775809}', True),
        (b'{"x": [1,\n\t123456789012345678901234567890\r\n]}', True),
        (b'{"x": {"y": 00000000000000000000000000001}}', True),  # never valid JSON
        (b'{"x":' + b" " * 100_000 + b"123456789012345678901234}", True),
        (b"123456789012345678901234", True),
        # a string that looks like an array's middle: the second parse decides
        (b'{"text": "a, 123456789012345678901234, b"}', True),
    ],
)
def test_which_digit_runs_may_be_an_integer_beyond_64_bits(raw: bytes, may: bool) -> None:
    assert _may_hold_inexact_integer(raw) is may


@pytest.fixture
def second_parses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The bodies `parse_object` walks for an inexact integer (the slow path)."""
    walked: list[Any] = []
    first_inexact = validation._first_inexact

    def counting(body: Any) -> tuple[str, str] | None:
        walked.append(body)
        return first_inexact(body)

    monkeypatch.setattr(validation, "_first_inexact", counting)
    return walked


@pytest.mark.parametrize(
    "extra",
    [
        {"user": "1712345678901234567"},
        {"metadata": {"trace": "9" * 40, "ts_ns": 1712345678901234567}},
        {"metadata": {"snowflake": 1234567890123456789, "u64": U64_MAX, "i64": I64_MIN}},
        {"messages": [{"role": "user", "content": "logged at 1712345678901234567ns " * 1000}]},
        {"prompt": list(range(50_000)), "user": "1712345678901234567"},
    ],
)
def test_digit_runs_in_strings_and_in_range_take_the_fast_path(
    second_parses: list[Any], extra: dict[str, Any]
) -> None:
    body = chat(**extra)
    assert parse_object(json.dumps(body).encode()) == body
    assert second_parses == []


def test_an_integer_beyond_64_bits_takes_the_slow_path(second_parses: list[Any]) -> None:
    raw = json.dumps(chat(user="1712345678901234567", metadata={"n": [1, U64_MAX + 1]}))
    with pytest.raises(InvalidRequest) as refused_:
        parse_object(raw.encode())
    assert refused_.value.param == "metadata.n[1]"
    assert len(second_parses) == 1


def test_a_string_that_looks_like_one_is_parsed_twice_and_kept(second_parses: list[Any]) -> None:
    body = chat(user="a, 123456789012345678901234, b")
    assert parse_object(json.dumps(body).encode()) == body
    assert len(second_parses) == 1


@pytest.mark.parametrize(
    ("digits", "check"),
    [
        (308, parse_object),  # orjson refuses longer integers: "infinity"
        (4_300, validation._check_exact_integers),
        (4_301, validation._check_exact_integers),  # past int()'s 4,300 digits
        (100_000, validation._check_exact_integers),
    ],
)
def test_a_long_integer_is_refused_naming_it(digits: int, check: Any) -> None:
    literal = "9" * digits
    raw = f'{{"model": "auto", "metadata": {{"n": [1, 2, -{literal}], "m": 1e5}}}}'.encode()
    with pytest.raises(InvalidRequest) as refused_:
        check(raw)
    assert refused_.value.param == "metadata.n[2]"
    assert refused_.value.message.endswith(f"got -{'9' * 36}...")


@pytest.mark.parametrize("key", ["k" * 10_000, "é" * 200, "a.b" * 100])
def test_a_field_path_is_echoed_cut(key: str) -> None:
    """The path of an integer beyond 64 bits is built from the client's keys: `param`
    and the message echo at most `MAX_SHOWN_PATH` characters of it."""
    raw = json.dumps({key: {"inner": [0, 2**70]}}).encode()
    with pytest.raises(InvalidRequest) as refused_:
        parse_object(raw)
    param = refused_.value.param
    assert param is not None and len(param) == MAX_SHOWN_PATH and param.endswith("...")
    assert (key + ".inner[1]").startswith(param[:-3])
    assert f"'{param}'" in refused_.value.message
    assert len(refused_.value.message) < MAX_SHOWN_PATH + 200


def test_a_short_field_path_is_echoed_whole() -> None:
    key = "k" * (MAX_SHOWN_PATH - len(".inner[1]"))
    raw = json.dumps({key: {"inner": [0, 2**70]}}).encode()
    with pytest.raises(InvalidRequest) as refused_:
        parse_object(raw)
    assert refused_.value.param == key + ".inner[1]"

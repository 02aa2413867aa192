"""Strategies and checks for the fuzz suite (tests/gateway/test_fuzz_api.py).

`Extras` is what rides along with each schemathesis case: the credential (the right
key for the operation, another key, or a hostile Authorization header), odd headers
(X-Forwarded-For, Content-Type, huge values) and query parameters the operation does
not declare. The checks hold every reply to the gateway's error contract.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, Response

from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY

FINANCE_KEY = "fake-finance-key"
METRICS_KEY = "fake-metrics-key"
TIGHT_KEY = "fake-tight-key"  # one request a minute, one route, a tiny budget

ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")  # errors in Anthropic's shape

# Statuses that mean an upstream (or the ledger) failed, documented as such; any other
# 5xx is the gateway's own fault.
UPSTREAM_STATUSES = frozenset({502, 503, 504})
FAKE_MAX_DIMENSIONS = 3072

# Examples per operation, and for the raw-body test; CASCADE_FUZZ_LONG=1 (pytest
# --fuzz-long) raises them for a run of thousands.
LONG = os.environ.get("CASCADE_FUZZ_LONG", "") not in ("", "0")
settings.register_profile(
    "cascade-fuzz",
    max_examples=30,
    deadline=None,
    database=None,  # no .hypothesis/ in the tree; a failure prints its reproducer
    print_blob=True,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one gateway serves every example, on purpose
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
settings.register_profile(
    "cascade-fuzz-long", settings.get_profile("cascade-fuzz"), max_examples=1500
)
PROFILE = settings.get_profile("cascade-fuzz-long" if LONG else "cascade-fuzz")
TIMEOUT_S = 3600 if LONG else 120  # per test (pytest-timeout): one operation's examples

# The key each API takes, by path prefix (the first match wins).
PROPER_KEYS: tuple[tuple[str, str | None], ...] = (
    ("/v1/spend", FINANCE_KEY),
    ("/admin", ADMIN_KEY),
    ("/metrics", METRICS_KEY),
    ("/v1", CLIENT_KEY),
    ("/", None),
)
HOSTILE_AUTHORIZATIONS = (
    "",
    "Bearer",
    "Bearer\t" + CLIENT_KEY,
    "bearer " + CLIENT_KEY,
    "BEARER  " + CLIENT_KEY,
    "Basic Zm9vOmJhcg==",
    "Token " + CLIENT_KEY,
    "Bearer " + CLIENT_KEY + "x",
    "Bearer " + CLIENT_KEY[:-1],
    "Bearer " + CLIENT_KEY + " " + CLIENT_KEY,
    "Bearer " + "A" * 9000,
    "Bearer \t" + CLIENT_KEY,
    "Bearer \u00e9\u00ff",
    CLIENT_KEY,
)
# Printable ASCII and Latin-1, no control characters: what HTTP lets a header carry
# (uvicorn itself answers a NUL or DEL with a plain-text 400, before any app sees it).
HEADER_CHARS = st.characters(codec="latin-1", exclude_categories=["Cc"])
HEADER_TEXT = st.text(HEADER_CHARS, max_size=64).map(str.strip)  # OWS is not part of a value
FORWARDED_FOR = st.one_of(
    st.sampled_from(
        ["127.0.0.1", "8.8.8.8", "::1", "[::1]:80", "10.0.0.1, 127.0.0.1", "unknown", "", ","]
    ),
    st.ip_addresses().map(str),
    HEADER_TEXT,
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=utf-16",
        "*/*",
    ]
)
HUGE_VALUE = st.integers(min_value=4_000, max_value=20_000).map(lambda n: "v" * n)
ODD_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "x-real-ip",
            "forwarded",
            "x-request-id",
            "accept",
            "accept-encoding",
            "user-agent",
            "x-junk",
            "openai-organization",
            "openai-project",
            "x-stainless-retry-count",
        ]
    ),
    st.one_of(HEADER_TEXT, HUGE_VALUE),
    max_size=3,
)
# The policy's routes and deployments (test_fuzz_api.POLICY), mostly: a generated
# model name is almost never one, and the proxy behind it would go untested.
MODELS = st.sampled_from(["auto", "auto", "careful", "cheap", "premium", "auto/x", None])
DASHBOARD_FILES = st.sampled_from(["app.js", "style.css", "vendor/chartjs/LICENSE.md", ""])
QUERY_NAMES = st.sampled_from(["api-version", "stream", "model", "from", "limit", "x", ""])
QUERY_VALUES = st.one_of(st.text(max_size=40), st.integers().map(str), st.just("%00"))


@dataclass(frozen=True)
class Extras:
    """A known model (else the generated one stays), headers and query parameters
    laid over a generated case."""

    model: str | None
    dashboard_file: str
    authorization: str | None  # None: no Authorization header at all
    headers: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)

    def apply(self, case: Case[Any]) -> None:
        bound_for_the_fake(case.body)
        if self.model is not None:
            if isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = self.model
            if case.path_parameters and "model" in case.path_parameters:
                case.path_parameters["model"] = self.model
        if case.path_parameters and "name" in case.path_parameters and self.dashboard_file:
            case.path_parameters["name"] = self.dashboard_file
        case.headers.pop("authorization", None)  # a case-insensitive dict
        if self.authorization is not None:
            case.headers["Authorization"] = self.authorization
        case.headers.update(self.headers)
        if self.query:
            case.query = {**(case.query or {}), **self.query}

    @classmethod
    def proper(cls, case: Case[Any]) -> Extras:
        """The right key and, where the case has a valid model, a route: for the
        deterministic edge cases, whose own values stay as generated."""
        key = proper_key(case.operation.path)
        model = case.body.get("model") if isinstance(case.body, dict) else None
        route = "auto" if isinstance(model, str) and model else None
        return cls(route, "", None if key is None else f"Bearer {key}")

    def raw_headers(self) -> dict[bytes, bytes]:
        """The headers as Latin-1 bytes (httpx sends str headers as ASCII only)."""
        auth = {} if self.authorization is None else {"authorization": self.authorization}
        headers = {**self.headers, **auth}
        return {name.encode(): value.encode("latin-1") for name, value in headers.items()}


def bound_for_the_fake(body: Any) -> None:
    """The fake upstream builds `dimensions` floats per embedding, unchecked (OpenAI
    caps it): a generated 10**12 would hang it, and every later request with it."""
    dimensions = body.get("dimensions") if isinstance(body, dict) else None
    if isinstance(dimensions, int | float) and abs(dimensions) > FAKE_MAX_DIMENSIONS:
        body["dimensions"] = FAKE_MAX_DIMENSIONS


def proper_key(path: str) -> str | None:
    return next(key for prefix, key in PROPER_KEYS if path.startswith(prefix))


@st.composite
def extras(draw: st.DrawFn, path: str) -> Extras:
    """Mostly the right key and a few odd headers; now and then anything at all."""
    key = proper_key(path)
    authorization = draw(
        st.one_of(
            st.just(None if key is None else f"Bearer {key}"),
            st.just(None if key is None else f"Bearer {key}"),
            st.just(None if key is None else f"Bearer {key}"),
            st.sampled_from(
                [
                    f"Bearer {k}"
                    for k in (CLIENT_KEY, ADMIN_KEY, FINANCE_KEY, METRICS_KEY, TIGHT_KEY)
                ]
            ),
            st.sampled_from(HOSTILE_AUTHORIZATIONS),
            st.none(),
            HEADER_TEXT.map(lambda text: f"Bearer {text}".strip()),  # no OWS at the end
        )
    )
    headers = dict(draw(ODD_HEADERS))
    if draw(st.booleans()):  # read from a trusted proxy (loopback), never obeyed for auth
        headers["x-forwarded-for"] = draw(FORWARDED_FOR)
    if draw(st.booleans()):
        headers["content-type"] = draw(CONTENT_TYPES)
    query = (
        draw(st.dictionaries(QUERY_NAMES, QUERY_VALUES, max_size=2)) if draw(st.booleans()) else {}
    )
    return Extras(draw(MODELS), draw(DASHBOARD_FILES), authorization, headers, query)


# Any JSON at all; integers unbounded (JSON has no limit; Python's json writes them).
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Values at the edges of what the gateway checks and counts.
EDGE_VALUES = st.one_of(
    st.sampled_from([0, -1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), 10**30, 1e308]),
    st.sampled_from([True, False, None, "", "auto", [], {}, [[]], [0], [-1], [2**40]]),
    st.lists(st.integers(min_value=-(2**64), max_value=2**64), min_size=1, max_size=5),
    st.lists(st.lists(st.integers(min_value=-1, max_value=300_000), max_size=4), max_size=3),
    JSON_VALUES,
)
BODY_FIELDS = (
    "messages",
    "prompt",
    "input",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "best_of",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "response_format",
    "logprobs",
    "user",
    "seed",
    # The bridged APIs' own (Responses, Anthropic Messages)
    "instructions",
    "max_output_tokens",
    "text",
    "store",
    "previous_response_id",
    "system",
    "stop_sequences",
    "top_k",
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]) | EDGE_VALUES},
    optional={"content": EDGE_VALUES, "name": EDGE_VALUES},
)
REQUEST_BODIES = st.fixed_dictionaries(
    {"model": MODELS.map(lambda model: model or "auto")},
    optional={
        "messages": st.lists(MESSAGE, max_size=3) | EDGE_VALUES,
        **{name: EDGE_VALUES for name in BODY_FIELDS[1:]},
    },
)


def nested(depth: int, body: dict[str, Any]) -> bytes:
    """`body` with a `depth`-deep array for its messages, prompt and input."""
    deep = "[" * depth + "]" * depth
    text = json.dumps({**body, "prompt": "@", "input": "@", "messages": "@"})
    return text.replace('"@"', deep).encode()


RAW_BODIES = st.one_of(
    REQUEST_BODIES.map(lambda body: json.dumps(body).encode()),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=200),
    st.builds(nested, st.integers(min_value=1, max_value=1500), REQUEST_BODIES),
    st.sampled_from([b"", b"{", b"[]", b"null", b'{"model": NaN}', b'{"model": "auto"}\x00']),
)


def is_readiness(case: Case[Any], response: Response) -> bool:
    """/readyz answers 503 with its own document, not an error."""
    return case.operation.path == "/readyz" and response.status_code == 503


def no_server_error(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """No 5xx but the documented upstream failures (502, 503, 504)."""
    status = response.status_code
    if status >= 500 and status not in UPSTREAM_STATUSES:
        raise AssertionError(f"{case.operation.label} answered {status}: {response.text[:500]}")
    return None


def openai_error_shape(ctx: CheckContext, response: Response, case: Case[Any]) -> bool | None:
    """Every 4xx and 5xx is `{"error": {"message": str, "type": str, "param", "code"}}`
    (Anthropic's shape on its Messages API)."""
    if response.status_code < 400 or is_readiness(case, response):
        return None
    problem = error_shape_problem(response.content, case.operation.path)
    if problem is not None:
        raise AssertionError(
            f"{case.operation.label} answered {response.status_code} {problem}: "
            f"{response.content[:300]!r}"
        )
    return None


def error_shape_problem(content: bytes, path: str = "") -> str | None:
    """What is wrong with an error body, or None if it has its API's shape: OpenAI's,
    or on the Messages API's paths Anthropic's (`{"type": "error", "error": {"type",
    "message"}}`)."""
    try:
        body: Any = json.loads(content)
    except ValueError:
        return "with a body that is not JSON"
    error = body.get("error") if isinstance(body, dict) else None
    if path in ANTHROPIC_PATHS:
        shaped = body.get("type") == "error" and isinstance(error, dict)
        typed = shaped and all(isinstance(error.get(k), str) for k in ("type", "message"))
        return None if typed else "not in Anthropic's error shape"
    if not isinstance(error, dict):
        return "without an `error` object"
    if not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        return "without a string `error.message` and `error.type`"
    if "param" not in error or "code" not in error:
        return "without `error.param` and `error.code`"
    return None

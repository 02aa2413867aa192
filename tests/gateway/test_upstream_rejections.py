"""An upstream's 400 reaches the client with the upstream's error `type`, `code` and
`param` (apps truncate and retry on `context_length_exceeded`), streamed or not, on
fallback and cascade routes; nothing else of the upstream's error body comes along.
The OpenAI SDK talks to the real gateway over loopback, in front of the fake upstreams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from starlette.responses import JSONResponse

from gateway.pipeline.upstream_errors import upstream_error_fields
from tests.fakes import openai_upstream
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway

POLICY = """
deployments:
  first:
    api_base: ${FIRST_URL}
    model: first-model
    tier: local
    price: {input_per_mtok: 1, output_per_mtok: 2}
  second:
    api_base: ${SECOND_URL}
    model: second-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 20}
routes:
  auto: {strategy: fallback, deployments: [first, second], reference_model: second}
  careful:
    strategy: cascade
    deployments: [first, second]
    verify_threshold: 0.5
    max_escalations: 1
    reference_model: second
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
TOO_LONG = {
    "message": "This model's maximum context length is 8 tokens.",
    "type": "invalid_request_error",
    "param": "messages",
    "code": "context_length_exceeded",
}
MESSAGES: Any = [{"role": "user", "content": "a prompt far too long for the model"}]


@pytest.fixture
def second() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def client(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, second: FakeOpenAI
) -> Iterator[openai.OpenAI]:
    base = start_gateway(POLICY, FIRST_URL=fake_openai.url, SECOND_URL=second.url).url
    with openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY, max_retries=0) as sdk:
        yield sdk


def answer_errors_with(monkeypatch: pytest.MonkeyPatch, error: dict[str, Any]) -> None:
    """The fake's error responses (its `fail` knob) carry this `error` object."""

    def respond(status: int, *_: Any, **__: Any) -> JSONResponse:
        return JSONResponse({"error": error}, status_code=status)

    monkeypatch.setattr(openai_upstream, "openai_error", respond)


@pytest.mark.parametrize("route", ["auto", "careful"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_upstreams_code_and_param_reach_the_client(
    client: openai.OpenAI,
    fake_openai: FakeOpenAI,
    second: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
    stream: bool,
) -> None:
    answer_errors_with(monkeypatch, TOO_LONG)
    fake_openai.fail(400, times=None)
    with pytest.raises(openai.BadRequestError) as rejected:
        client.chat.completions.create(model=route, messages=MESSAGES, stream=stream)
    error = rejected.value
    assert (error.code, error.param, error.type) == (
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert "maximum context length" in error.message
    assert second.requests == []  # the client's fault: not tried elsewhere


@pytest.mark.parametrize(
    "upstream",
    [
        {"message": "no code", "type": "invalid_request_error", "param": None, "code": None},
        {"message": "odd", "type": {"nested": 1}, "param": ["messages"], "code": 400},
        {"message": "long", "type": "", "param": "p" * 500, "code": "c" * 500},
    ],
)
def test_other_upstream_values_give_the_gateways_own(
    client: openai.OpenAI,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    upstream: dict[str, Any],
) -> None:
    answer_errors_with(monkeypatch, {**upstream, "internal": "not for the client"})
    fake_openai.fail(400, times=None)
    with pytest.raises(openai.BadRequestError) as rejected:
        client.chat.completions.create(model="auto", messages=MESSAGES)
    error = rejected.value
    assert (error.code, error.param, error.type) == (None, None, "invalid_request_error")
    assert isinstance(error.body, dict)
    assert set(error.body) == {"message", "type", "param", "code"}


def test_a_413_keeps_the_upstreams_code_or_its_own(
    client: openai.OpenAI, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer_errors_with(monkeypatch, {"message": "too big", "type": "invalid_request_error"})
    fake_openai.fail(413, times=1)
    with pytest.raises(openai.APIStatusError) as rejected:
        client.chat.completions.create(model="auto", messages=MESSAGES)
    assert (rejected.value.status_code, rejected.value.code) == (413, "payload_too_large")

    answer_errors_with(monkeypatch, {"message": "too big", "code": "request_too_large"})
    fake_openai.fail(413, times=1)
    with pytest.raises(openai.APIStatusError) as rejected:
        client.chat.completions.create(model="auto", messages=MESSAGES)
    assert (rejected.value.status_code, rejected.value.code) == (413, "request_too_large")


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            b'{"error": {"code": "c", "param": "p", "type": "t", "x": 1}}',
            {"code": "c", "param": "p", "type": "t"},
        ),
        (
            {"type": "error", "error": {"type": "invalid_request_error", "message": "m"}},
            {"type": "invalid_request_error"},
        ),
        (b"not json", {}),
        (b'["error"]', {}),
        (b'{"error": "a string"}', {}),
        (None, {}),
    ],
)
def test_upstream_error_fields(body: Any, fields: dict[str, str]) -> None:
    """Raw bytes (OpenAI-compatible upstreams) or parsed JSON (litellm's providers)."""
    assert upstream_error_fields(body) == fields

"""An OpenAI parameter a litellm provider does not support (`n`, `seed`, `logprobs` on
Anthropic) means that deployment cannot serve the request: the route's next one is
tried, and only when every deployment tried lacks it is the client told, in a 400
naming the field, without litellm's advice to its own users. Raw HTTP over loopback
to the gateway, litellm to the Anthropic fake, the OpenAI fake behind it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway

POLICY = """
deployments:
  claude:
    provider: anthropic
    api_base: ${ANTHROPIC_BASE_URL}
    api_key: ${ANTHROPIC_API_KEY}
    model: claude-sonnet-4-5
    max_retries: 2
    tier: cheap
  local:
    api_base: ${LOCAL_URL}
    model: fake-model
    max_retries: 0
    tier: premium
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  broken:
    api_base: ${BROKEN_URL}
    model: fake-model
    max_retries: 0
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
routes:
  either: {strategy: fallback, deployments: [claude, local]}
  claude-only: {deployments: [claude]}
  claude-then-broken: {strategy: fallback, deployments: [claude, broken]}
  climb:
    strategy: cascade
    deployments: [claude, local]
    verify_threshold: 0.5
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
LITELLM_ADVICE = ("drop_params", "litellm", "allowed_openai_params", "proxy")


@pytest.fixture
def base(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> str:
    server = start_gateway(
        POLICY,
        ANTHROPIC_BASE_URL=fake_anthropic.url,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
        LOCAL_URL=fake_openai.url,
        BROKEN_URL="http://127.0.0.1:9",  # nothing listens on the discard port
    )
    return server.url


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def post(base: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def attempts(base: str, deployment: str) -> dict[str, float]:
    """The deployment's upstream attempts by outcome, from /metrics."""
    prefix = f'cascade_upstream_attempts_total{{deployment="{deployment}",outcome="'
    lines = httpx.get(f"{base}/metrics").text.splitlines()
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(prefix)
    }


@pytest.mark.parametrize(
    "extra",
    [{"n": 2}, {"seed": 7}, {"logprobs": True, "top_logprobs": 2}, {"frequency_penalty": 0.5}],
)
def test_the_next_deployment_serves_what_the_first_cannot(
    base: str,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    extra: dict[str, Any],
) -> None:
    response = post(base, chat("either", **extra))
    assert response.status_code == 200, response.text
    assert response.headers["x-cascade-deployment"] == "local"
    assert response.headers["x-cascade-attempts"] == "1"  # claude refused before any call
    assert len(response.json()["choices"]) == extra.get("n", 1)
    sent = fake_openai.requests[-1]["body"]
    assert {name: sent[name] for name in extra} == extra  # passed on, not dropped
    assert fake_anthropic.requests == []  # litellm refused before calling


def test_a_stream_moves_on_too(base: str, fake_openai: FakeOpenAI) -> None:
    body = chat("either", stream=True, seed=7)
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["x-cascade-deployment"] == "local"
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert fake_openai.requests[-1]["body"]["seed"] == 7


@pytest.mark.parametrize("stream", [False, True])
def test_a_route_that_cannot_serve_it_names_the_field(
    base: str, fake_anthropic: FakeAnthropic, stream: bool
) -> None:
    response = post(base, chat("claude-only", n=2, seed=7, stream=stream))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "unsupported_parameter"
    assert error["param"] == "n"
    assert "'n', 'seed'" in error["message"]
    assert "deployment 'claude'" in error["message"] and "anthropic" in error["message"]
    assert not [word for word in LITELLM_ADVICE if word in error["message"]]
    assert fake_anthropic.requests == []
    assert attempts(base, "claude") == {"fallback": 1.0}  # not retried (max_retries: 2)


def test_the_same_route_serves_the_request_without_the_field(
    base: str, fake_anthropic: FakeAnthropic
) -> None:
    response = post(base, chat("claude-only", max_tokens=20))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "claude-sonnet-4-5"
    assert len(fake_anthropic.requests) == 1


def test_mixed_failures_are_an_upstream_failure(base: str) -> None:
    """Unsupported on one deployment, unreachable on the other: the upstreams failed
    (a 5xx, as before), not the client."""
    response = post(base, chat("claude-then-broken", seed=7))
    assert response.status_code in (502, 503), response.text
    error = response.json()["error"]
    assert error["type"] == "upstream_error"
    assert "does not support parameters: seed" in error["message"]
    assert "drop_params" not in error["message"]


def test_a_busy_deployment_behind_one_that_cannot_serve_it_says_busy(
    base: str, fake_openai: FakeOpenAI
) -> None:
    """Unsupported on claude, rate limited on the one that could serve it: the client
    is told to wait (429, Retry-After), not that the upstreams are broken."""
    fake_openai.fail(429, times=None, retry_after="7")
    response = post(base, chat("either", seed=7))
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "upstream_rate_limited"


def test_a_cascade_climbs_past_a_tier_that_cannot_serve_it(
    base: str, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> None:
    """The cheap tier lacks `n`: the next tier answers, as when a tier fails."""
    response = post(base, chat("climb", n=2))
    assert response.status_code == 200, response.text
    assert response.headers["x-cascade-deployment"] == "local"
    assert response.headers["x-cascade-escalations"] == "1"
    assert len(response.json()["choices"]) == 2
    assert fake_anthropic.requests == []

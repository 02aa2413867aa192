"""Bounds on what a request may ask, through the running gateway: JSON nesting (one
limit for parsing and re-serialising), output tokens (per choice and in all), prompt
forms; the output cap sent upstream (what a budget reserved, a deployment's own cap);
and what an upstream bills past it (settled, counted, logged once)."""

from __future__ import annotations

import logging
import re
from typing import Any

import httpx
import pytest

from gateway.http.validation import MAX_JSON_DEPTH
from gateway.request import MAX_OUTPUT_TOKENS
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway
from tests.gateway.server import GatewayServer

MESSAGES = [{"role": "user", "content": "hi there"}]
ROUTE_MAX_OUTPUT = 16

POLICY = f"""
deployments:
  premium:
    api_base: ${{PREMIUM_URL}}
    model: big-model
    tier: premium
    price: {{input_per_mtok: 10, output_per_mtok: 10}}
  capped:
    api_base: ${{PREMIUM_URL}}
    model: small-context-model
    max_output_tokens: 3
    price: {{input_per_mtok: 1, output_per_mtok: 1}}
routes:
  auto: {{deployments: [premium], max_output_tokens: {ROUTE_MAX_OUTPUT}}}
keys:
  k:
    secret: "${{GATEWAY_TEST_KEY}}"
    team: research
    rate_limit: {{tokens_per_minute: 10000000}}
teams:
  research: {{}}
budgets:
  - {{scope: team, name: research, period: day, limit_usd: 100}}
"""


@pytest.fixture
def gateway(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> GatewayServer:
    return start_gateway(POLICY, PREMIUM_URL=fake_openai.url)


def nested(depth: int) -> Any:
    """A JSON value `depth` levels deep (the body around it adds two more)."""
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 254, 600, 1_020])
def test_deep_json_is_refused_with_400_naming_the_limit(
    gateway: GatewayServer, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture, depth: int
) -> None:
    """Before: a 500 with two tracebacks (orjson reads 1,023 levels, writes 254)."""
    deep = "[" * depth + '"x"' + "]" * depth  # past what json.dumps itself can write
    body = '{"model": "auto", "messages": [{"role": "user", "content": "hi"}], "metadata": '
    body += '{"deep": ' + deep + "}}"
    with httpx.Client(base_url=gateway.url, headers=AUTH) as client, caplog.at_level("INFO"):
        response = client.post("/v1/chat/completions", content=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "nesting_too_deep"
        assert f"more than {MAX_JSON_DEPTH} levels" in error["message"]
        # The same keep-alive connection serves the next request.
        ok = client.post("/v1/chat/completions", json={"model": "auto", "messages": MESSAGES})
        assert ok.status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert len(fake_openai.requests) == 1


def test_json_just_within_the_limit_is_forwarded(
    gateway: GatewayServer, fake_openai: FakeOpenAI
) -> None:
    deep = nested(MAX_JSON_DEPTH - 3)  # body -> metadata -> deep: MAX_JSON_DEPTH in all
    body = {"model": "auto", "messages": MESSAGES, "metadata": {"deep": deep}}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert fake_openai.requests[-1]["body"]["metadata"]["deep"] == deep


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 2**63 - 1}, "max_tokens"),
        ({"max_completion_tokens": MAX_OUTPUT_TOKENS + 1}, "max_completion_tokens"),
        ({"n": 128, "max_tokens": 100_000}, "max_tokens"),  # 12.8 M in all
        ({"best_of": 129}, "best_of"),
    ],
)
def test_output_beyond_the_bound_is_refused(
    gateway: GatewayServer, fake_openai: FakeOpenAI, extra: dict[str, Any], param: str
) -> None:
    """Before: 200, and the rate limit's Redis counter overflowed to -2^63."""
    body = {"model": "auto", "messages": MESSAGES, **extra}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    if len(extra) == 1 and param.startswith("max"):
        assert "must be an integer in [1, 10_000_000]" in error["message"]
    assert not fake_openai.requests


@pytest.mark.parametrize(
    "prompt", [[1, "a"], [[]], [[1], "a"], [True, 2], [{"text": "hi"}], [-1, 5], [], {"a": 1}]
)
def test_prompts_in_no_openai_form_are_refused(gateway: GatewayServer, prompt: Any) -> None:
    """Forms a budget could not count (before: counted as nothing, and served)."""
    body = {"model": "auto", "prompt": prompt, "max_tokens": 5}
    response = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "prompt"


def test_content_parts_must_be_objects(gateway: GatewayServer) -> None:
    messages = [{"role": "user", "content": ["hi", "there"]}]
    body = {"model": "auto", "messages": messages}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content"


def test_upstreams_are_asked_for_no_more_than_was_reserved(
    gateway: GatewayServer, fake_openai: FakeOpenAI
) -> None:
    """A request without max_tokens on a budgeted key reserves the route's
    max_output_tokens and sends it; a client's own smaller cap is kept as it is."""
    url = f"{gateway.url}/v1/chat/completions"
    fake_openai.tokens = 40
    reply = httpx.post(url, json={"model": "auto", "messages": MESSAGES}, headers=AUTH)
    assert reply.status_code == 200
    sent = fake_openai.requests[-1]["body"]
    assert sent["max_completion_tokens"] == ROUTE_MAX_OUTPUT and "max_tokens" not in sent
    assert reply.json()["usage"]["completion_tokens"] == ROUTE_MAX_OUTPUT
    httpx.post(url, json={"model": "auto", "messages": MESSAGES, "max_tokens": 5}, headers=AUTH)
    sent = fake_openai.requests[-1]["body"]
    assert sent["max_tokens"] == 5 and "max_completion_tokens" not in sent
    text = {"model": "auto", "prompt": "once upon a time"}
    httpx.post(f"{gateway.url}/v1/completions", json=text, headers=AUTH)
    assert fake_openai.requests[-1]["body"]["max_tokens"] == ROUTE_MAX_OUTPUT


def test_a_deployment_is_never_asked_for_more_than_its_own_cap(
    gateway: GatewayServer, fake_openai: FakeOpenAI
) -> None:
    url = f"{gateway.url}/v1/chat/completions"
    body = {"model": "capped", "messages": MESSAGES, "max_tokens": 10}
    assert httpx.post(url, json=body, headers=AUTH).status_code == 200
    assert fake_openai.requests[-1]["body"]["max_tokens"] == 3


def test_an_upstream_billing_past_the_cap_is_settled_counted_and_logged_once(
    gateway: GatewayServer, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_openai.tokens, fake_openai.ignore_max_tokens = 32, True
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": 1}
    with caplog.at_level(logging.WARNING, logger="gateway.limits.limiter"):
        reply = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, headers=AUTH)
    assert reply.status_code == 200
    request_id = reply.headers["x-request-id"]
    billed = float(reply.headers["x-cascade-cost-usd"])
    assert billed == pytest.approx((2 + 32) * 10 / 1e6)  # the real cost, as billed
    lines = [r.getMessage() for r in caplog.records if request_id in r.getMessage()]
    assert len(lines) == 1 and "more than its budgets reserved" in lines[0]
    metrics = httpx.get(f"{gateway.url}/metrics").text
    found = re.search(
        r'cascade_budget_overrun_usd_total\{deployment="premium",route="auto"\} (\S+)', metrics
    )
    assert found is not None
    overrun = float(found.group(1))
    assert 0 < overrun < billed  # what it cost beyond the hold, which was not nothing

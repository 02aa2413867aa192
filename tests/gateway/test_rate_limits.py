"""Rate limits through running gateways on real Redis: requests and tokens per minute
per key and team, shared by every gateway instance, with OpenAI's headers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from gateway.billing.tokens import THREADED_PROMPT_CHARS, count_prompt
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway
from tests.gateway.server import GatewayServer
from tests.support import eventually

OTHER_KEY = "fake-other-key"
MESSAGES = [{"role": "user", "content": "hi there"}]
MAX_TOKENS = 10
PROMPT = count_prompt("big-model", "chat", {"messages": MESSAGES})
COUNTED = PROMPT + MAX_TOKENS  # tokens a request counts at admission
USED = 2 + 5  # what the fake bills it: 2 prompt words, 5 reply words

POLICY = """
deployments:
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto: {deployments: [premium]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research, __KEY_LIMIT__}
  other: {secret: "${OTHER_KEY}", team: research}
teams:
  research: {__TEAM_LIMIT__}
"""


def policy(key: str = "", team: str = "") -> str:
    key_limit = f"rate_limit: {{{key}}}" if key else ""
    team_limit = f"rate_limit: {{{team}}}" if team else ""
    return POLICY.replace("__KEY_LIMIT__", key_limit).replace("__TEAM_LIMIT__", team_limit)


@pytest.fixture
def start(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> Any:
    fake_openai.tokens = 5

    def run(text: str) -> GatewayServer:
        return start_gateway(text, PREMIUM_URL=fake_openai.url, OTHER_KEY=OTHER_KEY)

    return run


def one_minute_window(seconds_needed: float) -> None:
    """Wait for the next minute if this one ends within `seconds_needed`: a test that
    counts admissions must see one window (Redis runs on this machine's clock)."""
    left = 60 - time.time() % 60
    if left < seconds_needed:
        time.sleep(left + 0.05)


def ask(base: str, key: str = CLIENT_KEY, **extra: Any) -> httpx.Response:
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS, **extra}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)


async def test_two_gateways_admit_exactly_the_limit_in_a_window(start: Any) -> None:
    servers = [start(policy(key="requests_per_minute: 20")) for _ in range(2)]
    one_minute_window(15)
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        responses = await asyncio.gather(
            *(
                client.post(f"{servers[i % 2].url}/v1/chat/completions", json=body, headers=headers)
                for i in range(60)
            )
        )
    assert Counter(r.status_code for r in responses) == {200: 20, 429: 40}
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "key 'k'" in refused.json()["error"]["message"]
    assert 1 <= int(refused.headers["retry-after"]) <= 63  # 20 * (1 - f) + 1 <= 20: 3 s in
    assert refused.headers["x-ratelimit-limit-requests"] == "20"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    admitted = [r for r in responses if r.status_code == 200]
    left = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in admitted)
    assert left == list(range(20))  # each admission saw the others, on either gateway


def test_success_headers_count_down(start: Any) -> None:
    base = start(policy(key="requests_per_minute: 5, tokens_per_minute: 1000")).url
    one_minute_window(10)
    first, second = ask(base), ask(base)
    assert first.headers["x-ratelimit-limit-requests"] == "5"
    assert first.headers["x-ratelimit-limit-tokens"] == "1000"
    left = [r.headers["x-ratelimit-remaining-requests"] for r in (first, second)]
    assert left == ["4", "3"]
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 1000 - COUNTED


def test_tokens_are_counted_at_admission_and_corrected_at_settlement(start: Any) -> None:
    base = start(policy(key=f"tokens_per_minute: {2 * COUNTED + USED}")).url
    one_minute_window(15)
    assert ask(base).status_code == 200
    assert ask(base).status_code == 200

    # Until both settle, a third does not fit; after, it does (they used 7 tokens each).
    def settled() -> httpx.Response | None:
        response = ask(base)
        if response.status_code != 429:
            return response
        assert response.json()["error"]["code"] == "rate_limit_exceeded"
        assert "tokens per minute" in response.json()["error"]["message"]
        return None

    response = eventually(settled, 5, "both to settle")
    limit, counted_now = 2 * COUNTED + USED, 2 * USED + COUNTED
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == limit - counted_now


def test_a_long_prompt_is_counted_as_a_short_one_is(start: Any) -> None:
    """A prompt long enough to be counted off the event loop counts exactly the same."""
    long = [{"role": "user", "content": "a long pasted report. " * 5_000}]
    counted = count_prompt("big-model", "chat", {"messages": long}) + MAX_TOKENS
    assert len(long[0]["content"]) > THREADED_PROMPT_CHARS  # counted in the worker thread
    base = start(policy(key=f"tokens_per_minute: {2 * counted}")).url
    one_minute_window(10)
    response = ask(base, messages=long)
    assert response.status_code == 200
    # The limit holds two such requests: one request's count is left.
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == counted


def test_a_team_limit_is_shared_by_its_keys(start: Any) -> None:
    base = start(policy(team="requests_per_minute: 3")).url
    one_minute_window(10)
    statuses = [ask(base, key).status_code for key in (CLIENT_KEY, OTHER_KEY) * 3]
    assert statuses == [200, 200, 200, 429, 429, 429]
    refused = ask(base, OTHER_KEY)
    assert "team 'research'" in refused.json()["error"]["message"]


def test_the_tighter_of_key_and_team_limits_is_reported(start: Any) -> None:
    base = start(policy(key="requests_per_minute: 10", team="requests_per_minute: 4")).url
    one_minute_window(10)
    response = ask(base)
    assert response.headers["x-ratelimit-limit-requests"] == "4"
    assert response.headers["x-ratelimit-remaining-requests"] == "3"


def test_a_request_larger_than_the_token_limit_is_told_not_to_retry(start: Any) -> None:
    base = start(policy(team="tokens_per_minute: 50")).url
    refused = ask(base, max_tokens=100)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"] == (
        f"request too large for team 'research': it counts {PROMPT + 100} tokens (prompt + "
        "max output tokens), more than the team's limit of 50 tokens per minute; lower "
        "max_tokens or shorten the prompt"
    )
    # No wait makes it fit: the OpenAI SDKs must not wait and retry.
    assert refused.headers["x-should-retry"] == "false"
    assert "retry-after" not in refused.headers
    assert refused.headers["x-ratelimit-limit-tokens"] == "50"
    assert ask(base).status_code == 200


def test_streams_carry_the_headers_too(start: Any) -> None:
    base = start(policy(key="requests_per_minute: 50")).url
    body = {"model": "auto", "messages": MESSAGES, "stream": True}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.headers["x-ratelimit-limit-requests"] == "50"
        assert response.read().endswith(b"data: [DONE]\n\n")

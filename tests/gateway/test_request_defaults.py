"""Defaults a client meets without setting anything: the request body limit (20 MiB by
default, so that one multi-MB base64 image passes, as OpenAI takes it) and the output
cap a legacy completion without `max_tokens` is sent when limits apply (OpenAI's own
default, 16 tokens, not the route's `max_output_tokens` chat requests get).

Through the real gateway over loopback, in front of a fake upstream; real Redis."""

from __future__ import annotations

import base64
import os

import httpx
import pytest

from policies.schema import GatewaySection
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway

POLICY = """
deployments:
  only:
    api_base: ${UPSTREAM_URL}
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {strategy: fixed, deployments: [only]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
  free: {secret: "${FREE_KEY}"}
budgets:
  - {scope: key, name: k, period: day, limit_usd: 100}
"""
FREE = {"authorization": "Bearer fake-free-key"}  # a key no budget applies to
MIB = 1024 * 1024


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(POLICY, UPSTREAM_URL=fake_openai.url, FREE_KEY="fake-free-key").url


def image_request(size: int) -> bytes:
    """A chat body of about `size` bytes: a question and a base64 PNG's data URL."""
    data = base64.b64encode(os.urandom(size * 3 // 4)).decode()
    body = (
        '{"model": "auto", "messages": [{"role": "user", "content": [{"type": "text", '
        '"text": "What is in this picture?"}, {"type": "image_url", "image_url": '
        f'{{"url": "data:image/png;base64,{data}"}}}}]}}]}}'
    )
    return body.encode()


def test_the_default_body_limit_is_20_mib() -> None:
    assert GatewaySection().max_body_bytes == 20 * MIB


@pytest.mark.parametrize("transport", ["aiohttp", "httpcore"])
def test_a_6_mb_image_passes_and_a_body_over_the_limit_is_413(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    transport: str,
) -> None:
    monkeypatch.setenv("CASCADE_UPSTREAM_TRANSPORT", transport)  # both send it upstream
    base = start_gateway(POLICY, UPSTREAM_URL=fake_openai.url, FREE_KEY="fake-free-key").url
    headers = {**AUTH, "content-type": "application/json"}
    url = f"{base}/v1/chat/completions"
    response = httpx.post(url, content=image_request(6_000_000), headers=headers, timeout=60)
    assert response.status_code == 200
    assert len(fake_openai.requests[-1]["raw"]) > 6_000_000  # all of it went upstream

    response = httpx.post(url, content=image_request(21 * MIB), headers=headers, timeout=60)
    assert response.status_code == 413
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "payload_too_large")
    assert f"the limit is {20 * MIB}" in error["message"]
    assert len(fake_openai.requests) == 1


def test_a_legacy_completion_without_max_tokens_is_sent_openais_default(
    base: str, fake_openai: FakeOpenAI
) -> None:
    """Under a budget the cap is sent (what was held); for a completion that is the
    API's own default, so the answer is what OpenAI would give."""

    def sent(path: str, headers: dict[str, str], **body: object) -> dict[str, object]:
        response = httpx.post(f"{base}/v1/{path}", json={"model": "auto", **body}, headers=headers)
        assert response.status_code == 200
        upstream: dict[str, object] = fake_openai.requests[-1]["body"]
        return upstream

    assert sent("completions", AUTH, prompt="Once upon a time")["max_tokens"] == 16
    assert sent("completions", AUTH, prompt="Once", max_tokens=40)["max_tokens"] == 40
    chat = sent("chat/completions", AUTH, messages=[{"role": "user", "content": "hi"}])
    assert chat["max_completion_tokens"] == 4096 and "max_tokens" not in chat  # as before
    assert "max_tokens" not in sent("completions", FREE, prompt="Once")  # no limit: untouched

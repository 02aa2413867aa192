"""An upstream whose error quotes the key it was sent (as some providers' 401s do, and
a proxy's echo of its request may): the key never reaches the client or the logs, on
the direct OpenAI path, through litellm and on the native Messages path.

Over real sockets: the gateway under uvicorn, the fakes answering errors that quote
their own key, the client's reply and the gateway's log records read back."""

from __future__ import annotations

import logging

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstreams.base import MIN_SECRET_CHARS, UpstreamTarget
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway

POLICY = """
deployments:
  gpt:
    api_base: ${OPENAI_URL}
    api_key: ${OPENAI_KEY}
    model: gpt-4o-mini
    max_retries: 0
  claude:
    provider: anthropic
    api_base: ${ANTHROPIC_URL}
    api_key: ${ANTHROPIC_KEY}
    model: claude-sonnet-4-5
    max_retries: 0
routes:
  gpt-only: {deployments: [gpt]}
  claude-only: {deployments: [claude]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
OPENAI_KEY = "fake-key-of-the-openai-fake"
ANTHROPIC_KEY = "fake-key-of-the-claude-fake"


@pytest.fixture
def base(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> str:
    fake_openai.api_key, fake_anthropic.api_key = OPENAI_KEY, ANTHROPIC_KEY
    server = start_gateway(
        POLICY,
        OPENAI_URL=fake_openai.url,
        OPENAI_KEY=OPENAI_KEY,
        ANTHROPIC_URL=fake_anthropic.url,
        ANTHROPIC_KEY=ANTHROPIC_KEY,
    )
    return server.url


def chat(base: str, route: str) -> httpx.Response:
    body = {"model": route, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def messages(base: str, route: str) -> httpx.Response:
    body = {"model": route, "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"}
    return httpx.post(f"{base}/v1/messages", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize("status", [400, 401, 500])
@pytest.mark.parametrize("surface", ["openai", "litellm", "native"])
def test_an_upstream_error_quoting_its_key_is_relayed_without_it(
    base: str,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    caplog: pytest.LogCaptureFixture,
    surface: str,
    status: int,
) -> None:
    fake, key = (
        (fake_openai, OPENAI_KEY) if surface == "openai" else (fake_anthropic, ANTHROPIC_KEY)
    )
    fake.fail_message = f"Incorrect API key provided: {key}. You passed {key[:14]}..."
    fake.fail(status, times=None)
    with caplog.at_level(logging.DEBUG):
        if surface == "native":
            response = messages(base, "claude-only")
        else:
            response = chat(base, "gpt-only" if surface == "openai" else "claude-only")
    assert response.status_code >= 400
    assert fake.requests  # the upstream was asked, and answered its error
    assert key not in response.text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert key not in logged


@settings(max_examples=300, deadline=None)
@given(
    before=st.text(max_size=40),
    after=st.text(max_size=40),
    key=st.text(alphabet="abcdef-0123456789", min_size=MIN_SECRET_CHARS, max_size=40),
    cut=st.integers(min_value=0, max_value=40),
)
def test_redaction_leaves_no_run_of_a_secret_long_enough_to_matter(
    before: str, after: str, key: str, cut: int
) -> None:
    """Whatever surrounds it, and however much of it is quoted (all, or a prefix of at
    least MIN_SECRET_CHARS), no MIN_SECRET_CHARS-long start of the key is left, and text
    that quotes none of it is unchanged."""
    target = UpstreamTarget("d", "openai", "m", None, key)
    quoted = key[: max(MIN_SECRET_CHARS, cut)]
    text = before + quoted + after
    redacted = target.redact(text)
    assert key[:MIN_SECRET_CHARS] not in redacted
    assert target.redact_bytes(text.encode()) == redacted.encode()
    if key[:MIN_SECRET_CHARS] not in before + after:
        assert target.redact(before + after) == before + after


def test_a_credential_headers_token_is_redacted_and_other_headers_are_not() -> None:
    """`Authorization: Bearer <token>` (a proxy's credential): the token an error
    quotes, without its scheme, is a secret; a beta flag's long value is not."""
    target = UpstreamTarget(
        "d",
        "openai",
        "m",
        None,
        None,
        headers={
            "Authorization": "Bearer fake-proxy-token-of-a-test",
            "anthropic-beta": "prompt-caching-2024-07-31",
        },
    )
    text = "token fake-proxy-token-of-a-test refused; beta prompt-caching-2024-07-31 on"
    assert target.redact(text) == "token [redacted] refused; beta prompt-caching-2024-07-31 on"

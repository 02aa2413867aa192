"""A non-OpenAI provider behind the gateway: the OpenAI SDK talks to the gateway,
litellm talks Anthropic's Messages API to a fake that speaks it, the ledger prices
the tokens from litellm's price map."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway, wait_for_record

POLICY = """
deployments:
  local:
    api_base: ${LOCAL_URL}
    model: small
    max_retries: 0
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  claude:
    provider: anthropic
    api_base: ${ANTHROPIC_BASE_URL}
    api_key: ${ANTHROPIC_API_KEY}
    model: claude-sonnet-4-5
    tier: premium
routes:
  auto: {deployments: [local, claude], reference_model: claude}
  claude-only: {deployments: [claude]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
SONNET_INPUT_USD, SONNET_OUTPUT_USD = 3e-6, 15e-6  # litellm's map for claude-sonnet-4-5


@pytest.fixture
def client(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> openai.OpenAI:
    server = start_gateway(
        POLICY,
        LOCAL_URL=fake_openai.url,
        ANTHROPIC_BASE_URL=fake_anthropic.url,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
    )
    return openai.OpenAI(base_url=server.url + "/v1", api_key=CLIENT_KEY, max_retries=0)


async def test_chat_through_litellm_is_openai_shaped_and_priced(
    client: openai.OpenAI, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="claude-only",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    reply = raw.parse()
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.content
    sent = fake_anthropic.requests[-1]
    assert sent["path"] == "/v1/messages"
    assert sent["body"]["system"] and sent["body"]["max_tokens"] == 4096
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert reply.usage is not None
    assert record.prompt_tokens == reply.usage.prompt_tokens
    expected = (
        record.prompt_tokens * SONNET_INPUT_USD + record.completion_tokens * SONNET_OUTPUT_USD
    )
    assert record.cost_nanos == round(expected * 1e9)
    # `claude-only` has no reference_model: nothing to compare with, so no reference cost
    assert (record.reference_model, record.reference_cost_nanos) == (None, 0)
    client.close()


async def test_stream_through_litellm(
    client: openai.OpenAI, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="claude-only",
        messages=[{"role": "user", "content": "tell me something"}],
        stream=True,
        max_tokens=50,
    )
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert all(c.usage is None for c in chunks)  # not asked for: stripped
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert record.usage_source == "upstream" and record.completion_tokens > 0
    client.close()


def test_fallback_from_openai_compatible_to_anthropic(
    client: openai.OpenAI, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> None:
    fake_openai.fail(503, times=None)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-cascade-deployment"] == "claude"
    assert raw.parse().choices[0].message.content
    fake_anthropic.fail(529, times=None)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 503
    client.close()


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "/v1/messages"])
def test_one_api_base_serves_openai_and_anthropic_clients(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    suffix: str,
) -> None:
    """An Anthropic deployment's `api_base` as an API root, a `/v1` base or the Messages
    endpoint itself: chat through litellm and Anthropic's Messages API, passed on
    natively, reach the same endpoint (litellm alone would ask `/v1/v1/messages`)."""
    server = start_gateway(
        POLICY,
        LOCAL_URL=fake_openai.url,
        ANTHROPIC_BASE_URL=fake_anthropic.url + suffix,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
    )
    with openai.OpenAI(base_url=server.url + "/v1", api_key=CLIENT_KEY, max_retries=0) as client:
        reply = client.chat.completions.create(
            model="claude-only", messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.choices[0].message.content
    native = httpx.post(
        server.url + "/v1/messages",
        headers={"x-api-key": CLIENT_KEY, "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-only",
            "max_tokens": 20,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert native.status_code == 200, native.text
    assert [r["path"] for r in fake_anthropic.requests] == ["/v1/messages", "/v1/messages"]


def test_a_streams_usage_through_litellm_carries_no_list_price(
    client: openai.OpenAI, fake_anthropic: FakeAnthropic
) -> None:
    """litellm adds its own `usage.cost` (its list price) to the last chunk: not what
    the gateway charges, so not the client's to read."""
    stream = client.chat.completions.create(
        model="claude-only",
        messages=[{"role": "user", "content": "tell me something"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [c.usage for c in stream if c.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens > 0
    assert "cost" not in usages[0].model_dump()
    client.close()

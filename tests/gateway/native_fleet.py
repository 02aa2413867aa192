"""Deployments that serve /v1/responses and /v1/messages natively (capabilities
`responses` and `messages`) beside bridged ones, behind one gateway: the policy, the
fixtures that start it (`base`, and a `fake_responses` that wants its own key), the
official SDKs pointed at it, and the request's one ledger record. Used by
test_native_surfaces and test_native_passthrough."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.ledger import RedisStore, SpendRecord
from policies.schema import Price
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.conftest import CLIENT_KEY, StartGateway, wait_for_record

RESPONSES_KEY = "fake-responses-key"
NATIVE_PRICE = Price(input_per_mtok=1, output_per_mtok=4, cached_input_per_mtok=0.25)
POLICY = f"""
deployments:
  native:
    api_base: ${{RESPONSES_URL}}
    api_key: ${{RESPONSES_KEY}}
    model: native-model
    tier: cheap
    max_output_tokens: 40
    capabilities: [chat, tools, json_schema, responses]
    price: {NATIVE_PRICE.model_dump(exclude_none=True)}
  chat:
    api_base: ${{CHAT_URL}}
    model: chat-model
    tier: premium
    price: {{input_per_mtok: 5, output_per_mtok: 15}}
  chat-cheap:
    api_base: ${{CHAT_URL}}
    model: chat-model
    tier: cheap
    price: {{input_per_mtok: 0.1, output_per_mtok: 0.1}}
  native-premium:
    api_base: ${{RESPONSES_URL}}
    api_key: ${{RESPONSES_KEY}}
    model: native-big
    tier: premium
    capabilities: [chat, responses]
    price: {{input_per_mtok: 5, output_per_mtok: 15}}
  claude:
    provider: anthropic
    api_base: ${{ANTHROPIC_BASE_URL}}
    api_key: ${{ANTHROPIC_API_KEY}}
    model: claude-sonnet-4-5
  claude-mcp:
    provider: anthropic
    api_base: ${{ANTHROPIC_BASE_URL}}
    api_key: ${{ANTHROPIC_API_KEY}}
    model: claude-sonnet-4-5
    capabilities: [chat, tools, vision, json_schema, messages, remote_mcp]
  claude-bridged:
    provider: anthropic
    api_base: ${{ANTHROPIC_BASE_URL}}
    api_key: ${{ANTHROPIC_API_KEY}}
    model: claude-sonnet-4-5
    capabilities: [chat, tools, vision, json_schema]
routes:
  auto: {{deployments: [native]}}
  bridged: {{deployments: [chat]}}
  mixed: {{strategy: fallback, deployments: [chat, native]}}
  claude: {{deployments: [claude]}}
  claude-mcp: {{deployments: [claude-mcp]}}
  claude-bridged: {{deployments: [claude-bridged]}}
  careful:
    strategy: cascade
    deployments: [native, chat]
    verify_threshold: 0.5
    max_escalations: 1
  careful-up:
    strategy: cascade
    deployments: [chat-cheap, native-premium]
    verify_threshold: 0.5
    max_escalations: 1
  claude-careful: {{strategy: cascade, deployments: [claude], verify_threshold: 0.5}}
keys:
  k: {{secret: "${{GATEWAY_TEST_KEY}}"}}
"""
HELLO = [{"role": "user", "content": "say hello to me"}]


@pytest.fixture
def fake_responses() -> Iterator[FakeResponses]:
    """A running FakeResponses that wants RESPONSES_KEY."""
    with FakeResponses() as fake:
        fake.api_key = RESPONSES_KEY
        yield fake


@pytest.fixture
def base(
    start_gateway: StartGateway,
    fake_responses: FakeResponses,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
) -> str:
    """The URL of a gateway serving POLICY in front of the three fakes."""
    server = start_gateway(
        POLICY,
        RESPONSES_URL=fake_responses.url,
        RESPONSES_KEY=RESPONSES_KEY,
        CHAT_URL=fake_openai.url,
        ANTHROPIC_BASE_URL=fake_anthropic.url,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
    )
    return server.url


def openai_sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY, max_retries=0)


def anthropic_sdk(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=CLIENT_KEY, max_retries=0)


async def only_record(store: RedisStore, request_id: str) -> SpendRecord:
    """The request's one record: no escalation, hedge or retry priced beside it."""
    record = await wait_for_record(store, request_id)
    records = [r for r in await store.events() if r.request_id == request_id]
    assert records == [record]
    return record

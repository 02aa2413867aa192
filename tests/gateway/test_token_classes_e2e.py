"""Billed as providers bill, through the running gateway: fake OpenAI and Anthropic
upstreams report cached prompt reads, cache writes and reasoning tokens, streamed and
not, and the ledger prices each class to the nano-dollar from the usage the client got.

Rates from litellm's map, in nano-dollars per token:
gpt-4o: input 2500, cached input 1250, output 10000 (reasoning: output).
claude-sonnet-4-5: input 3000, cache read 300, cache write 3750, output 15000.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from gateway.ledger import RedisStore, SpendRecord
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import CLIENT_KEY, StartGateway, wait_for_record

FINANCE_KEY = "fake-finance-key"
POLICY = """
deployments:
  gpt:
    api_base: ${OPENAI_BASE_URL}
    model: gpt-4o
    max_retries: 0
  house:
    api_base: ${OPENAI_BASE_URL}
    model: house-model
    max_retries: 0
    price: {input_per_mtok: 1.0, output_per_mtok: 4.0, cached_input_per_mtok: 0.25,
            reasoning_per_mtok: 8.0}
  claude:
    provider: anthropic
    api_base: ${ANTHROPIC_BASE_URL}
    api_key: ${ANTHROPIC_API_KEY}
    model: claude-sonnet-4-5
routes:
  gpt: {deployments: [gpt], reference_model: claude-sonnet-4-5}
  house: {deployments: [house]}
  claude: {deployments: [claude], reference_model: gpt-4o}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
finance_keys: ["${FINANCE_KEY}"]
"""
LONG_PROMPT = "word " * 1500  # OpenAI caches prompts of 1024 tokens and more
GPT4O = {"input": 2500, "cache_read": 1250, "output": 10000}
SONNET = {"input": 3000, "cache_read": 300, "cache_write": 3750, "output": 15000}


@pytest.fixture
def base_url(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> str:
    server = start_gateway(
        POLICY,
        OPENAI_BASE_URL=fake_openai.url,
        ANTHROPIC_BASE_URL=fake_anthropic.url,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
        FINANCE_KEY=FINANCE_KEY,
    )
    return server.url


def ask(base_url: str, route: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """(the request id, the usage the client got), streamed or not."""
    body: dict[str, Any] = {
        "model": route,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 20,
    }
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    request_id = response.headers["x-request-id"]
    if not stream:
        return request_id, response.json()["usage"]
    events = [
        orjson.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    [usage] = [event["usage"] for event in events if event.get("usage")]  # the final chunk
    return request_id, usage


def cached(usage: dict[str, Any]) -> int:
    return int(usage["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
async def test_an_openai_cached_prompt_is_priced_as_its_usage_says(
    base_url: str, fake_openai: FakeOpenAI, ledger_store: RedisStore, stream: bool
) -> None:
    fake_openai.cached_tokens, fake_openai.reasoning_tokens = 1024, 64
    request_id, usage = ask(base_url, "gpt", stream)
    prompt, completion, read = usage["prompt_tokens"], usage["completion_tokens"], cached(usage)
    reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
    assert (read, reasoning) == (1024, 64) and prompt > read and completion > reasoning
    record = await wait_for_record(ledger_store, request_id)
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
    assert (record.cache_read_tokens, record.reasoning_tokens) == (read, reasoning)
    assert record.cost_nanos == (
        (prompt - read) * GPT4O["input"] + read * GPT4O["cache_read"] + completion * GPT4O["output"]
    )
    assert record.cache_savings_nanos == read * (GPT4O["input"] - GPT4O["cache_read"])
    # The counterfactual: the same tokens, cache reads too, on the reference model.
    assert record.reference_cost_nanos == (
        (prompt - read) * SONNET["input"]
        + read * SONNET["cache_read"]
        + completion * SONNET["output"]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
async def test_anthropic_cache_reads_and_writes_are_priced_apart(
    base_url: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore, stream: bool
) -> None:
    fake_anthropic.cached_tokens, fake_anthropic.cache_write_tokens = 1000, 200
    request_id, usage = ask(base_url, "claude", stream)
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    # Anthropic's input_tokens leaves the cache out; the OpenAI-shaped usage has it in.
    assert prompt > 1000 + 200
    record = await wait_for_record(ledger_store, request_id)
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
    assert (record.cache_read_tokens, record.cache_write_tokens) == (1000, 200)
    plain = prompt - 1000 - 200
    assert record.cost_nanos == (
        plain * SONNET["input"]
        + 1000 * SONNET["cache_read"]
        + 200 * SONNET["cache_write"]
        + completion * SONNET["output"]
    )
    saved = 1000 * (SONNET["input"] - SONNET["cache_read"]) - 200 * (
        SONNET["cache_write"] - SONNET["input"]
    )
    assert record.cache_savings_nanos == saved
    # gpt-4o has no cache-write price: on it the writes would be plain input.
    assert record.reference_cost_nanos == (
        (plain + 200) * GPT4O["input"] + 1000 * GPT4O["cache_read"] + completion * GPT4O["output"]
    )


async def test_the_policys_own_class_prices(
    base_url: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """house-model: input $1, cached input $0.25, output $4, reasoning $8 per million."""
    fake_openai.cached_tokens, fake_openai.reasoning_tokens = 1024, 10
    request_id, usage = ask(base_url, "house", stream=False)
    prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
    record = await wait_for_record(ledger_store, request_id)
    assert record.cost_nanos == (
        (prompt - 1024) * 1000 + 1024 * 250 + (completion - 10) * 4000 + 10 * 8000
    )
    assert (record.reference_model, record.reference_cost_nanos) == (None, 0)


async def test_finance_reads_each_class_and_the_cache_savings(
    base_url: str,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    ledger_store: RedisStore,
) -> None:
    fake_openai.cached_tokens = 1024
    fake_anthropic.cached_tokens, fake_anthropic.cache_write_tokens = 1000, 200
    ids = [
        ask(base_url, route, stream)[0] for route in ("gpt", "claude") for stream in (False, True)
    ]
    records: list[SpendRecord] = [await wait_for_record(ledger_store, i) for i in ids]
    headers = {"authorization": f"Bearer {FINANCE_KEY}"}
    today = datetime.now(UTC).date().isoformat()
    params = {"from": today, "to": today, "group_by": "route"}
    reply = httpx.get(f"{base_url}/v1/spend", params=params, headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    total = reply.json()["total"]
    assert total["cache_read_tokens"] == 2 * 1024 + 2 * 1000
    assert total["cache_write_tokens"] == 2 * 200
    assert total["cache_savings_nanos"] == sum(r.cache_savings_nanos for r in records) > 0
    assert total["cost_nanos"] == sum(r.cost_nanos for r in records)
    csv = httpx.get(
        f"{base_url}/v1/spend", params={**params, "format": "csv"}, headers=headers, timeout=10
    ).text
    header, *lines = csv.splitlines()
    rows = {
        line.split(",")[0]: dict(zip(header.split(","), line.split(","), strict=True))
        for line in lines
    }
    claude = [r for r in records if r.route == "claude"]
    assert rows["claude"]["cache_write_tokens"] == "400"
    nanos = sum(r.cache_savings_nanos for r in claude)
    assert rows["claude"]["cache_savings_usd"] == f"0.{nanos:09d}"


async def test_a_stream_whose_client_wants_no_usage_is_still_priced_by_class(
    base_url: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """The gateway asks for the usage chunk anyway and strips it from the client's stream."""
    fake_openai.cached_tokens = 1024
    body = {"model": "gpt", "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 200 and '"usage":{' not in response.text
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert (record.usage_source, record.cache_read_tokens) == ("upstream", 1024)
    assert record.cache_savings_nanos == 1024 * (GPT4O["input"] - GPT4O["cache_read"])

"""/v1/responses and /v1/messages on deployments that serve those wire formats natively
(capabilities `responses` and `messages`), through the running gateway with the
official SDKs: the upstream gets the client's body untranslated at its own path, the
client gets the upstream's answer as it came, and the ledger prices each request once,
token classes included, as the bridge would have. Stored state goes to native
deployments only; cascades mixing native and bridged tiers answer in the client's
format."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.billing.pricing import policy_price
from gateway.billing.usage import TokenClasses
from gateway.ledger import RedisStore, SpendRecord
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.cascade_scenario import GOOD, QUESTION, REFUSAL
from tests.gateway.conftest import AUTH, wait_for_record
from tests.gateway.native_fleet import (
    HELLO,
    NATIVE_PRICE,
    RESPONSES_KEY,
    anthropic_sdk,
    base,
    fake_responses,
    only_record,
    openai_sdk,
)
from tests.support import eventually_async

__all__ = ["base", "fake_responses"]  # fixtures

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def native_cost(record: SpendRecord) -> int:
    classes = TokenClasses(cache_read=record.cache_read_tokens, reasoning=record.reasoning_tokens)
    price = policy_price(NATIVE_PRICE)
    return price.cost_nanos(record.prompt_tokens, record.completion_tokens, classes)


async def test_a_plain_response_goes_untranslated_and_is_priced_with_its_classes(
    base: str, fake_responses: FakeResponses, ledger_store: RedisStore
) -> None:
    fake_responses.cached_tokens, fake_responses.reasoning_tokens = 2, 3
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="auto", instructions="Be brief.", input="say hello to me", max_output_tokens=50
        )
    reply = raw.parse()
    assert reply.output_text == fake_responses.reply_text
    assert reply.id in fake_responses.stored  # the upstream's own answer, id and all
    [sent] = fake_responses.requests
    assert sent["path"] == "/v1/responses"
    assert sent["headers"]["authorization"] == f"Bearer {RESPONSES_KEY}"
    # The client's body: the deployment's model, its max_output_tokens cap (40).
    assert sent["body"] == {
        "model": "native-model",
        "instructions": "Be brief.",
        "input": "say hello to me",
        "max_output_tokens": 40,
    }
    record = await only_record(ledger_store, raw.headers["x-request-id"])
    assert reply.usage is not None
    assert (record.prompt_tokens, record.completion_tokens) == (
        reply.usage.input_tokens,
        reply.usage.output_tokens,
    )
    assert (record.cache_read_tokens, record.reasoning_tokens) == (2, 3)
    assert (record.surface, record.deployment, record.usage_source) == (
        "responses",
        "native",
        "upstream",
    )
    assert record.cost_nanos == native_cost(record) > 0
    assert float(raw.headers["x-cascade-cost-usd"]) == pytest.approx(record.cost_nanos / 1e9)


async def test_a_streamed_response_relays_the_upstreams_events(
    base: str, fake_responses: FakeResponses, ledger_store: RedisStore
) -> None:
    fake_responses.tokens, fake_responses.cached_tokens = 5, 1
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="auto", input=[{"role": "user", "content": "count to five"}], stream=True
        )
        events = list(raw.parse())
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events].count("response.output_text.delta") == 5
    completed = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type == "response.completed" and completed.id in fake_responses.stored
    sent = fake_responses.requests[-1]["body"]
    assert sent["stream"] is True and "stream_options" not in sent
    record = await only_record(ledger_store, raw.headers["x-request-id"])
    assert record.stream and record.status == "ok" and record.surface == "responses"
    assert completed.usage is not None
    assert record.completion_tokens == completed.usage.output_tokens == 5
    assert record.cache_read_tokens == 1
    assert record.cost_nanos == native_cost(record)


async def test_a_function_tool_goes_as_the_client_wrote_it(
    base: str, fake_responses: FakeResponses, ledger_store: RedisStore
) -> None:
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="auto",
            input="weather in Paris?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
        )
        events = list(
            client.responses.create(
                model="auto",
                input="weather?",
                tools=[WEATHER],  # type: ignore[list-item]
                tool_choice="required",
                stream=True,
            )
        )
    [call] = raw.parse().output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "test"}
    assert fake_responses.requests[0]["body"]["tools"] == [WEATHER]  # not chat's shape
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "test"}]
    record = await only_record(ledger_store, raw.headers["x-request-id"])
    assert record.completion_tokens > 0 and record.surface == "responses"


def test_stored_state_goes_to_native_deployments_only(
    base: str, fake_responses: FakeResponses, fake_openai: FakeOpenAI
) -> None:
    with openai_sdk(base) as client:
        first = client.responses.create(model="mixed", input="hi", store=False)
        assert fake_openai.requests and not fake_responses.requests  # chat is tried first
        fake_openai.requests.clear()
        stored = client.responses.create(model="auto", input="hi", store=True)
        raw = client.responses.with_raw_response.create(
            model="mixed", input="and then?", previous_response_id=stored.id
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="bridged", input="x", previous_response_id=stored.id)
        with pytest.raises(openai.BadRequestError) as unknown:  # the upstream's own 400
            client.responses.create(model="auto", input="x", previous_response_id="resp_nope")
    assert first.output_text == fake_openai.reply_text
    assert raw.headers["x-cascade-deployment"] == "native"
    assert fake_responses.requests[-2]["body"]["previous_response_id"] == stored.id
    assert raw.parse().previous_response_id == stored.id
    assert fake_openai.requests == []  # neither stateful request went to the bridge
    assert refused.value.param == "previous_response_id"
    assert "'previous_response_id'" in refused.value.message
    assert "responses" in refused.value.message
    assert unknown.value.param == "previous_response_id"
    assert "resp_nope" in unknown.value.message


async def test_a_native_stream_that_breaks_ends_with_the_apis_error_event(
    base: str, fake_responses: FakeResponses, ledger_store: RedisStore
) -> None:
    fake_responses.reset_after_chunks = 2
    body = {"model": "auto", "input": "count to five", "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/responses", json=body, headers=AUTH, timeout=30
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith(("event:", "data:"))]
    assert lines[0] == "event: response.created"
    assert lines[-2] == "event: error"
    error = json.loads(lines[-1].removeprefix("data: "))
    assert error["type"] == "error" and "upstream" in error["message"]
    assert error["sequence_number"] == sum(line.startswith("event:") for line in lines) - 1
    record = await only_record(ledger_store, response.headers["x-request-id"])
    assert record.status == "partial" and record.usage_source == "counted"
    assert record.completion_tokens > 0 and record.prompt_tokens > 0  # what was relayed


async def test_a_native_stream_the_upstream_fails_in_band_is_recorded_partial(
    base: str, fake_responses: FakeResponses, ledger_store: RedisStore
) -> None:
    fake_responses.fail_in_stream = True
    body = {"model": "auto", "input": "count to five", "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/responses", json=body, headers=AUTH, timeout=30
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("event:")]
    assert lines[-1] == "event: response.failed"  # relayed as the upstream sent it
    record = await only_record(ledger_store, response.headers["x-request-id"])
    assert record.status == "partial" and record.usage_source == "upstream"
    assert record.cost_nanos > 0  # what the failed answer reported is still billed


async def test_a_native_message_is_priced_as_the_bridged_one(
    base: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    fake_anthropic.cached_tokens, fake_anthropic.cache_write_tokens = 40, 8
    body: dict[str, Any] = {"max_tokens": 100, "system": "Be brief.", "messages": HELLO}
    with anthropic_sdk(base) as client:
        native = client.messages.with_raw_response.create(
            model="claude",
            extra_headers={"anthropic-beta": "fake-beta-1"},
            **body,
        )
        sent = fake_anthropic.requests[-1]
        bridged = client.messages.with_raw_response.create(model="claude-bridged", **body)
    message = native.parse()
    assert message.content[0].text == fake_anthropic.reply_text  # type: ignore[union-attr]
    assert sent["path"] == "/v1/messages"
    assert sent["body"] == {**body, "model": "claude-sonnet-4-5"}
    assert sent["headers"]["x-api-key"] == fake_anthropic.api_key  # the deployment's key
    assert sent["headers"]["anthropic-beta"] == "fake-beta-1"
    assert "authorization" not in sent["headers"]
    assert bridged.parse().content[0].text == message.content[0].text  # type: ignore[union-attr]
    record = await only_record(ledger_store, native.headers["x-request-id"])
    twin = await only_record(ledger_store, bridged.headers["x-request-id"])
    assert (record.surface, twin.surface) == ("messages", "messages")
    assert (record.cache_read_tokens, record.cache_write_tokens) == (40, 8)
    assert record.prompt_tokens == message.usage.input_tokens + 40 + 8
    for name in ("prompt_tokens", "completion_tokens", "cache_read_tokens", "cost_nanos"):
        assert getattr(record, name) == getattr(twin, name), name
    assert record.cost_nanos > 0


async def test_a_native_message_stream_relays_anthropics_events(
    base: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    fake_anthropic.tokens, fake_anthropic.cached_tokens = 4, 10
    with (
        anthropic_sdk(base) as client,
        client.messages.stream(model="claude", max_tokens=100, messages=HELLO) as stream,  # type: ignore[arg-type]
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == "word0 word1 word2 word3"  # type: ignore[union-attr]
    assert fake_anthropic.requests[-1]["body"]["stream"] is True
    record = await only_record(ledger_store, request_id)
    assert record.stream and record.status == "ok" and record.surface == "messages"
    assert record.completion_tokens == final.usage.output_tokens == 4
    assert record.prompt_tokens == final.usage.input_tokens + 10
    assert record.cache_read_tokens == 10


async def test_cascades_answer_in_the_clients_format_across_wire_formats(
    base: str,
    fake_responses: FakeResponses,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    question = QUESTION["content"]
    fake_responses.reply_text, fake_openai.reply_text = REFUSAL, GOOD  # native cheap fails
    with openai_sdk(base) as client:
        up = client.responses.with_raw_response.create(model="careful", input=question)
        streamed = list(client.responses.create(model="careful", input=question, stream=True))
        fake_responses.reply_text, fake_openai.reply_text = GOOD, REFUSAL  # and the reverse
        down = client.responses.with_raw_response.create(model="careful-up", input=question)
        streamed_down = list(
            client.responses.create(model="careful-up", input=question, stream=True)
        )
    assert (up.headers["x-cascade-deployment"], up.headers["x-cascade-escalations"]) == (
        "chat",
        "1",
    )
    assert up.parse().output_text == GOOD and up.parse().object == "response"
    assert streamed[-1].type == "response.completed"
    assert streamed[-1].response.output_text == GOOD  # type: ignore[union-attr]
    assert down.headers["x-cascade-deployment"] == "native-premium"
    assert down.parse().output_text == GOOD and down.parse().id in fake_responses.stored
    assert streamed_down[-1].response.output_text == GOOD  # type: ignore[union-attr]
    request_id = up.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    premium = await wait_for_record(ledger_store, request_id + ":1")
    assert (cheap.deployment, premium.deployment) == ("native", "chat")
    assert cheap.verifier_score is not None and cheap.verifier_score < 0.5
    assert cheap.cost_nanos == native_cost(cheap) > 0
    assert {cheap.surface, premium.surface} == {"responses"}


async def test_every_endpoint_names_its_surface(base: str, ledger_store: RedisStore) -> None:
    body = {"model": "bridged", "messages": HELLO}
    chat = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    record = await wait_for_record(ledger_store, chat.headers["x-request-id"])
    assert record.surface == "chat"
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(model="bridged", input="hi")
    bridged = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert (bridged.surface, bridged.deployment) == ("responses", "chat")
    stored = await eventually_async(lambda: ledger_store.get(raw.headers["x-request-id"]))
    assert stored is not None and stored.surface == "responses"

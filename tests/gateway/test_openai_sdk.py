"""The official OpenAI SDK, pointed at the gateway, works unchanged: sync, async,
streaming, errors. The gateway runs for real on loopback with the example policy
external checks use, in front of a fake OpenAI-compatible upstream; the ledger is Redis."""

from __future__ import annotations

import openai
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import (
    CLIENT_KEY,
    StartGateway,
    openai_compatible_policy,
    wait_for_record,
)

# policies/examples/openai-compatible.yaml prices the upstream at 0.15 / 0.60 USD per Mtok.
INPUT_USD, OUTPUT_USD = 0.15e-6, 0.60e-6
GPT4O_INPUT_USD, GPT4O_OUTPUT_USD = 2.5e-6, 10e-6  # the route's reference model


@pytest.fixture
def gateway_url(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    server = start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url)
    return server.url + "/v1"


def sdk(url: str, key: str = CLIENT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0)


async def test_sync_chat_is_answered_priced_and_recorded(
    gateway_url: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    client = sdk(gateway_url)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "say hello to me"}]
    )
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert raw.headers["x-cascade-route"] == "auto"
    assert raw.headers["x-cascade-deployment"] == "upstream"
    assert raw.headers["x-cascade-tier"] == "default"
    assert raw.headers["x-cascade-escalations"] == "0"
    request_id = raw.headers["x-request-id"]

    record = await wait_for_record(ledger_store, request_id)
    assert reply.usage is not None
    assert (record.prompt_tokens, record.completion_tokens) == (
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )
    expected = record.prompt_tokens * INPUT_USD + record.completion_tokens * OUTPUT_USD
    assert float(raw.headers["x-cascade-cost-usd"]) == pytest.approx(expected, abs=1e-9)
    assert record.cost_nanos == round(expected * 1e9)
    reference = record.prompt_tokens * GPT4O_INPUT_USD + record.completion_tokens * GPT4O_OUTPUT_USD
    assert record.reference_cost_nanos == round(reference * 1e9)
    assert (record.team, record.key, record.usage_source) == ("test", "test", "upstream")
    assert fake_openai.requests[-1]["body"]["model"] == "fake-model"
    client.close()


async def test_async_stream_with_usage(gateway_url: str, ledger_store: RedisStore) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_url, api_key=CLIENT_KEY, max_retries=0)
    raw = await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "count to five"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    stream = raw.parse()
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert record.stream and record.status == "ok"
    assert record.completion_tokens == usage.completion_tokens
    assert record.ttft_ms is not None
    await client.close()


async def test_stream_without_usage_option_hides_usage_but_ledger_has_it(
    gateway_url: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    client = sdk(gateway_url)
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chunks = list(raw.parse())
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    # The gateway asked the upstream for usage anyway, to price the stream.
    assert fake_openai.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert record.usage_source == "upstream" and record.completion_tokens > 0
    client.close()


async def test_openai_fields_pass_through_untouched(
    gateway_url: str, fake_openai: FakeOpenAI
) -> None:
    client = sdk(gateway_url)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    reply = client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=tools,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        response_format={"type": "json_object"},
        n=2,
        logprobs=True,
        top_logprobs=2,
        seed=7,
        user="end-user-1",
        extra_body={"vendor_knob": {"a": 1}, "priority": 3},
    )
    sent = fake_openai.requests[-1]["body"]
    assert sent["tools"] == tools
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["response_format"] == {"type": "json_object"}
    assert (sent["n"], sent["logprobs"], sent["top_logprobs"], sent["seed"]) == (2, True, 2, 7)
    assert sent["user"] == "end-user-1"
    assert sent["vendor_knob"] == {"a": 1} and sent["priority"] == 3
    assert len(reply.choices) == 2
    assert reply.choices[0].message.tool_calls
    client.close()


async def test_completions_embeddings_and_models(
    gateway_url: str, ledger_store: RedisStore
) -> None:
    client = sdk(gateway_url)
    raw = client.completions.with_raw_response.create(model="auto", prompt="Once upon a time")
    assert raw.parse().choices[0].text
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert record.prompt_tokens > 0

    embedded = client.embeddings.with_raw_response.create(model="auto", input=["a", "b c"])
    assert len(embedded.parse().data) == 2
    record = await wait_for_record(ledger_store, embedded.headers["x-request-id"])
    assert record.completion_tokens == 0 and record.prompt_tokens > 0

    ids = {m.id for m in client.models.list()}
    assert {"auto", "upstream"} <= ids
    client.close()


def test_models_retrieve_gives_the_listed_entry(gateway_url: str) -> None:
    with sdk(gateway_url) as client:
        listed = {m.id: m for m in client.models.list()}
        for name in ("auto", "upstream"):
            assert client.models.retrieve(name) == listed[name]
        assert listed["auto"].object == "model" and listed["auto"].owned_by
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("nope")
    assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    assert "nope" in missing.value.message


def test_sdk_errors(gateway_url: str) -> None:
    with (
        sdk(gateway_url, key="fake-wrong-key") as wrong,
        pytest.raises(openai.AuthenticationError) as auth,
    ):
        wrong.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert auth.value.status_code == 401
    assert auth.value.code == "invalid_api_key"

    client = sdk(gateway_url)
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert "nope" in missing.value.message

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="auto", messages="not a list")  # type: ignore[arg-type]
    assert bad.value.param == "messages"
    client.close()

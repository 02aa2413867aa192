"""`POST /v1/responses` with the official OpenAI SDK (`client.responses.create`), through
the running gateway, bridged to a fake OpenAI-compatible chat upstream: plain, streamed,
with a function tool, through a cascade; each request priced once in the ledger at its
chat equivalent's cost."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import GOOD, POLICY, QUESTION, REFUSAL
from tests.gateway.conftest import (
    ADMIN,
    AUTH,
    CLIENT_KEY,
    StartGateway,
    openai_compatible_policy,
    wait_for_record,
)

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


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY, max_retries=0)


def chat(base: str, **body: Any) -> httpx.Response:
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response


async def test_a_plain_response_is_answered_and_priced_as_its_chat_equivalent(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    with sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="auto", instructions="Be brief.", input="say hello to me", max_output_tokens=50
        )
    reply = raw.parse()
    assert reply.object == "response" and reply.status == "completed"
    assert reply.output_text == fake_openai.reply_text
    assert reply.id.startswith("resp_")
    sent = fake_openai.requests[-1]["body"]
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "say hello to me"},
    ]
    assert sent["max_completion_tokens"] == 50 and sent["model"] == "fake-model"
    assert raw.headers["x-cascade-route"] == "auto"
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert reply.usage is not None
    assert (record.prompt_tokens, record.completion_tokens) == (
        reply.usage.input_tokens,
        reply.usage.output_tokens,
    )
    assert float(raw.headers["x-cascade-cost-usd"]) == pytest.approx(record.cost_nanos / 1e9)

    equivalent = chat(base, model="auto", messages=sent["messages"], max_tokens=50)
    twin = await wait_for_record(ledger_store, equivalent.headers["x-request-id"])
    assert record.cost_nanos == twin.cost_nanos > 0
    assert await ledger_store.get(raw.headers["x-request-id"] + ":1") is None  # priced once

    spend = httpx.get(f"{base}/v1/spend", params={"group_by": "route"}, headers=ADMIN)
    [row] = spend.json()["data"]
    assert row["requests"] == 2
    assert row["cost_usd"] == pytest.approx(2 * record.cost_nanos / 1e9)


async def test_a_streamed_response_sends_the_responses_events(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    with sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="auto", input=[{"role": "user", "content": "count to five"}], stream=True
        )
        events = list(raw.parse())
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == fake_openai.reply_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == text and completed.usage is not None
    assert completed.id == events[0].response.id  # type: ignore[union-attr]
    assert fake_openai.requests[-1]["body"]["stream_options"] == {"include_usage": True}
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert record.stream and record.status == "ok"
    assert record.completion_tokens == completed.usage.output_tokens


def test_a_stream_names_the_model_the_reply_names(base: str) -> None:
    """Before: `response.created` and `response.in_progress` named the route the client
    asked for ("auto"), `response.completed` and the reply the upstream's model."""
    body = {"model": "auto", "input": "count to five"}
    reply = httpx.post(f"{base}/v1/responses", json=body, headers=AUTH, timeout=30).json()
    with httpx.stream(
        "POST", f"{base}/v1/responses", json={**body, "stream": True}, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line[:6] == "data: "]
    named = {e["type"]: e["response"]["model"] for e in events if "response" in e}
    assert set(named) == {"response.created", "response.in_progress", "response.completed"}
    assert set(named.values()) == {reply["model"]} == {"fake-model"}


def test_a_function_tool_is_called_and_its_output_sent_back(
    base: str, fake_openai: FakeOpenAI
) -> None:
    with sdk(base) as client:
        reply = client.responses.create(
            model="auto",
            input="weather in Paris?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "name": "get_weather"},
        )
        [call] = [item for item in reply.output if item.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "test"}
        sent = fake_openai.requests[-1]["body"]
        assert sent["tools"][0]["function"]["name"] == "get_weather"
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}

        follow_up = client.responses.create(
            model="auto",
            input=[
                {"role": "user", "content": "weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER],  # type: ignore[list-item]
        )
    assert follow_up.output_text == fake_openai.reply_text
    messages = fake_openai.requests[-1]["body"]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == call.call_id
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": call.call_id}


def test_a_streamed_tool_call_and_a_json_schema_format(base: str, fake_openai: FakeOpenAI) -> None:
    with sdk(base) as client:
        events = list(
            client.responses.create(
                model="auto",
                input="weather?",
                tools=[WEATHER],  # type: ignore[list-item]
                tool_choice="required",
                stream=True,
            )
        )
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert [json.loads(e.arguments) for e in done] == [{"city": "test"}]
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
        client.responses.create(
            model="auto",
            input="a number",
            text={"format": {"type": "json_schema", "name": "num", "schema": schema}},
        )
    assert fake_openai.requests[-1]["body"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "num", "schema": schema, "strict": False},
    }


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ],
)
def test_what_the_bridge_cannot_serve_is_a_400_naming_the_field(
    base: str, fake_openai: FakeOpenAI, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "auto", "input": "hi", **extra}
    with sdk(base) as client, pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**body)
    assert refused.value.param == param
    assert param.split("[")[0].split(".")[0] in refused.value.message
    assert fake_openai.requests == []


def test_a_cascade_escalates_and_answers_in_the_responses_format(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    with FakeOpenAI() as premium:
        fake_openai.reply_text, premium.reply_text = REFUSAL, GOOD
        base = start_gateway(POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
        with sdk(base) as client:
            raw = client.responses.with_raw_response.create(
                model="careful", input=QUESTION["content"]
            )
            assert raw.parse().output_text == GOOD
            assert raw.headers["x-cascade-escalations"] == "1"
            assert raw.headers["x-cascade-deployment"] == "premium"
            events = list(
                client.responses.create(model="careful", input=QUESTION["content"], stream=True)
            )
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == GOOD  # type: ignore[union-attr]


def test_a_stream_that_breaks_ends_with_an_error_event(base: str, fake_openai: FakeOpenAI) -> None:
    fake_openai.reset_after_chunks = 2
    body = {"model": "auto", "input": "count to five", "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/responses", json=body, headers=AUTH, timeout=30
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("event: ")]
    assert lines[0] == "event: response.created"
    assert lines[-1] == "event: error"
    assert "event: response.completed" not in lines


async def test_a_stream_the_client_leaves_is_still_priced(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    fake_openai.itl_s = 0.05
    body = {"model": "auto", "input": "count to five", "stream": True}
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"{base}/v1/responses", json=body, headers=AUTH) as response,
    ):
        async for line in response.aiter_lines():
            if "response.output_text.delta" in line:
                break  # gone after the first words
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.status == "partial" and record.prompt_tokens > 0

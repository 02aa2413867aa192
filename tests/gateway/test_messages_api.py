"""`POST /v1/messages` with the official Anthropic SDK (`client.messages.create`), through
the running gateway, bridged to a fake OpenAI-compatible chat upstream: plain, streamed,
a tool call both ways, errors in Anthropic's shape; each request priced once in the
ledger at its chat equivalent's cost."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import (
    ADMIN,
    AUTH,
    CLIENT_KEY,
    StartGateway,
    openai_compatible_policy,
    wait_for_record,
)

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HELLO = [{"role": "user", "content": "say hello to me"}]


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url


def sdk(base: str, key: str = CLIENT_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)


async def test_a_plain_message_is_answered_and_priced_as_its_chat_equivalent(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    with sdk(base) as client:
        raw = client.messages.with_raw_response.create(
            model="auto",
            max_tokens=100,
            system="Be brief.",
            messages=HELLO,  # type: ignore[arg-type]
        )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text == fake_openai.reply_text
    assert message.stop_reason == "end_turn" and message.id.startswith("msg_")
    sent = fake_openai.requests[-1]["body"]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, *HELLO]
    assert (
        sent["max_completion_tokens"] == 100 and "max_tokens" not in sent
    )  # reasoning models refuse it
    assert fake_openai.requests[-1]["headers"].get("x-api-key") is None  # our key stays ours
    record = await wait_for_record(ledger_store, raw.headers["x-request-id"])
    assert (record.prompt_tokens, record.completion_tokens) == (
        message.usage.input_tokens,
        message.usage.output_tokens,
    )
    body = {"model": "auto", "messages": sent["messages"], "max_tokens": 100}
    equivalent = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    twin = await wait_for_record(ledger_store, equivalent.headers["x-request-id"])
    assert record.cost_nanos == twin.cost_nanos > 0
    assert await ledger_store.get(raw.headers["x-request-id"] + ":1") is None  # priced once
    spend = httpx.get(f"{base}/v1/spend", params={"group_by": "route"}, headers=ADMIN)
    [row] = spend.json()["data"]
    assert row["requests"] == 2
    assert row["cost_usd"] == pytest.approx(2 * record.cost_nanos / 1e9)


async def test_a_streamed_message_sends_anthropic_events(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    with (
        sdk(base) as client,
        client.messages.stream(model="auto", max_tokens=100, messages=HELLO) as stream,  # type: ignore[arg-type]
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        request_id = stream.response.headers["x-request-id"]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    assert final.content[0].text == fake_openai.reply_text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    record = await wait_for_record(ledger_store, request_id)
    assert record.stream and record.status == "ok"
    assert record.completion_tokens == final.usage.output_tokens > 0


def test_a_tool_call_and_its_result(base: str, fake_openai: FakeOpenAI) -> None:
    with sdk(base) as client:
        message = client.messages.create(
            model="auto",
            max_tokens=100,
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "tool", "name": "get_weather"},
        )
        [use] = [block for block in message.content if block.type == "tool_use"]
        assert use.name == "get_weather" and use.input == {"city": "test"}
        assert message.stop_reason == "tool_use"
        assert fake_openai.requests[-1]["body"]["tool_choice"] == {
            "type": "function",
            "function": {"name": "get_weather"},
        }
        reply = client.messages.create(
            model="auto",
            max_tokens=100,
            messages=[
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[list-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
                },
            ],
            tools=[WEATHER],  # type: ignore[list-item]
        )
        with client.messages.stream(
            model="auto",
            max_tokens=100,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "any"},
        ) as stream:
            streamed = stream.get_final_message()
    assert reply.content[0].text == fake_openai.reply_text  # type: ignore[union-attr]
    assert [b.type for b in streamed.content] == ["tool_use"]
    assert streamed.content[0].input == {"city": "test"}  # type: ignore[union-attr]


def test_a_stream_names_the_model_the_reply_names(base: str) -> None:
    """Before: `message_start` named the route the client asked for ("auto"), the
    reply the upstream's model."""
    body = {"model": "auto", "max_tokens": 10, "messages": HELLO}
    reply = httpx.post(f"{base}/v1/messages", json=body, headers=AUTH, timeout=30).json()
    with httpx.stream(
        "POST", f"{base}/v1/messages", json={**body, "stream": True}, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    start = json.loads(lines[0])
    assert start["type"] == "message_start"
    assert start["message"]["model"] == reply["model"] == "fake-model"
    assert json.loads(lines[-1])["type"] == "message_stop"


def test_the_bearer_header_works_too(base: str) -> None:
    body = {"model": "auto", "max_tokens": 10, "messages": HELLO}
    reply = httpx.post(f"{base}/v1/messages", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 200 and reply.json()["type"] == "message"


def test_errors_are_in_anthropic_shape(base: str, fake_openai: FakeOpenAI) -> None:
    with sdk(base, key="fake-wrong-key") as wrong, pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="auto", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
    with sdk(base) as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            client.messages.create(model="nope", max_tokens=10, messages=HELLO)  # type: ignore[arg-type]
        assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    fake_openai.fail(503, times=None)
    body = {"model": "auto", "max_tokens": 10, "messages": HELLO}
    failed = httpx.post(f"{base}/v1/messages", json=body, headers=AUTH, timeout=30)
    assert failed.status_code >= 500
    assert failed.json()["type"] == "error" and failed.json()["error"]["message"]
    wrong_method = httpx.get(f"{base}/v1/messages", headers=AUTH)
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": HELLO}, "max_tokens"),
        ({"max_tokens": 10}, "messages"),
        ({"max_tokens": 10, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 10, "messages": HELLO, "temperature": 1.5}, "temperature"),
        (
            {
                "max_tokens": 10,
                "messages": HELLO,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "tools[0].type",
        ),
        (
            {"max_tokens": 10, "messages": HELLO, "tool_choice": {"type": "tool"}},
            "tool_choice.name",
        ),
        ({"max_tokens": 2**64, "messages": HELLO}, "max_tokens"),  # not read as a float
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    base: str, fake_openai: FakeOpenAI, body: dict[str, Any], field: str
) -> None:
    reply = httpx.post(
        f"{base}/v1/messages", json={"model": "auto", **body}, headers=AUTH, timeout=30
    )
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in reply.json()["error"]["message"]
    assert fake_openai.requests == []


def test_a_stream_that_breaks_raises_in_the_sdk(base: str, fake_openai: FakeOpenAI) -> None:
    fake_openai.reset_after_chunks = 2
    with (
        sdk(base) as client,
        pytest.raises(anthropic.APIStatusError, match="upstream"),
        client.messages.stream(model="auto", max_tokens=100, messages=HELLO) as stream,  # type: ignore[arg-type]
    ):
        list(stream)

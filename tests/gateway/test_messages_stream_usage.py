"""The input tokens a streamed `/v1/messages` reports, through the running gateway. An
OpenAI-style upstream reports usage only in its stream's last chunk, after the bridge
sent `message_start`: that event carries the gateway's count of the prompt (what
`/v1/messages/count_tokens` answers), and `message_delta` the upstream's own. A native
Anthropic deployment's events pass as it sent them."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI, chat_prompt_tokens
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway, openai_compatible_policy
from tests.gateway.native_fleet import base as fleet
from tests.gateway.native_fleet import fake_responses

__all__ = ["fake_responses", "fleet"]  # fixtures

HELLO = [{"role": "user", "content": "say hello to me"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(openai_compatible_policy(), UPSTREAM_BASE_URL=fake_openai.url).url


def streamed(base: str, body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The stream's events by type (the last of each), read raw."""
    body = {"model": "auto", "max_tokens": 100, **body, "stream": True}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    return {event["type"]: event for event in events}


def counted(base: str, body: dict[str, Any]) -> int:
    reply = httpx.post(
        f"{base}/v1/messages/count_tokens", json={"model": "auto", **body}, headers=AUTH
    )
    assert reply.status_code == 200
    result: int = reply.json()["input_tokens"]
    return result


@pytest.mark.parametrize(
    "body",
    [
        {"messages": HELLO},
        {"messages": HELLO, "system": "Be brief.", "tools": [WEATHER]},
        {"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "any"}},
    ],
)
def test_message_start_has_the_gateways_count_and_message_delta_the_upstreams(
    base: str, fake_openai: FakeOpenAI, body: dict[str, Any]
) -> None:
    events = streamed(base, body)
    start = events["message_start"]["message"]["usage"]
    delta = events["message_delta"]["usage"]
    assert start["input_tokens"] == counted(base, body) > 0
    assert start["output_tokens"] == 0
    reported = chat_prompt_tokens(fake_openai.requests[-1]["body"])  # the fake's own count
    assert reported != start["input_tokens"]  # so the two are told apart
    assert delta["input_tokens"] == reported
    assert delta["output_tokens"] > 0


def test_the_count_grows_with_the_prompt(base: str) -> None:
    short = streamed(base, {"messages": HELLO})["message_start"]
    longer = streamed(base, {"messages": HELLO, "tools": [WEATHER]})["message_start"]
    assert (
        0 < short["message"]["usage"]["input_tokens"] < longer["message"]["usage"]["input_tokens"]
    )


def test_without_upstream_usage_message_delta_keeps_the_count(
    base: str, fake_openai: FakeOpenAI
) -> None:
    fake_openai.omit_usage = True
    events = streamed(base, {"messages": HELLO})
    start = events["message_start"]["message"]["usage"]
    assert events["message_delta"]["usage"]["input_tokens"] == start["input_tokens"] > 0


def test_the_sdk_reads_the_count_then_the_upstreams(base: str, fake_openai: FakeOpenAI) -> None:
    with (
        anthropic.Anthropic(base_url=base, api_key=CLIENT_KEY, max_retries=0) as client,
        client.messages.stream(model="auto", max_tokens=100, messages=HELLO) as stream,  # type: ignore[arg-type]
    ):
        events = list(stream)
        final = stream.get_final_message()
    assert events[0].type == "message_start"
    assert events[0].message.usage.input_tokens == counted(base, {"messages": HELLO}) > 0
    assert final.usage.input_tokens == chat_prompt_tokens(fake_openai.requests[-1]["body"])


def test_a_native_stream_passes_untouched(fleet: str, fake_anthropic: FakeAnthropic) -> None:
    """The fake counts words (4 here), not tokens, and its `message_delta` has no
    `input_tokens`: both reach the client as sent."""
    body = {"model": "claude", "max_tokens": 100, "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{fleet}/v1/messages", json=body, headers=AUTH, timeout=30) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    by_type = {event["type"]: event for event in events}
    assert by_type["message_start"]["message"]["usage"]["input_tokens"] == 4
    assert by_type["message_delta"]["usage"] == {
        "output_tokens": len(fake_anthropic.reply_text.split())
    }

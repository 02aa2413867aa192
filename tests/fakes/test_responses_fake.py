"""FakeResponses speaks OpenAI's Responses API as the official SDK reads it: plain,
streamed, a function call, stored responses, and its knobs."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.fakes.fixtures import fake_responses
from tests.fakes.responses_upstream import FakeResponses
from tests.fakes.sse import sse_payloads

__all__ = ["fake_responses"]

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def sdk(fake: FakeResponses) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url, api_key="fake-key", max_retries=0)


def test_a_plain_response_and_its_usage(fake_responses: FakeResponses) -> None:
    fake_responses.reply_text = "Bonjour tout le monde"
    fake_responses.cached_tokens, fake_responses.reasoning_tokens = 2, 3
    with sdk(fake_responses) as client:
        reply = client.responses.create(
            model="m", instructions="be brief", input="one two three", max_output_tokens=50
        )
    assert reply.object == "response" and reply.status == "completed"
    assert reply.output_text == "Bonjour tout le monde"
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (5, 4 + 3)
    assert reply.usage.input_tokens_details.cached_tokens == 2
    assert reply.usage.output_tokens_details.reasoning_tokens == 3
    assert fake_responses.requests[-1]["path"] == "/v1/responses"
    assert reply.id in fake_responses.stored


def test_a_stream_sends_the_responses_events(fake_responses: FakeResponses) -> None:
    fake_responses.tokens = 3
    with sdk(fake_responses) as client:
        events = list(client.responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == "word0 word1 word2"
    assert completed.usage is not None and completed.usage.output_tokens == 3


def test_a_forced_function_call_plain_and_streamed(fake_responses: FakeResponses) -> None:
    choice = {"type": "function", "name": "get_weather"}
    with sdk(fake_responses) as client:
        reply = client.responses.create(
            model="m",
            input="weather?",
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice=choice,  # type: ignore[arg-type]
        )
        events = list(
            client.responses.create(
                model="m",
                input="weather?",
                tools=[WEATHER],  # type: ignore[list-item]
                tool_choice="required",
                stream=True,
            )
        )
    [call] = reply.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "test"}
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "test"}]


def test_previous_response_id_needs_a_stored_response(fake_responses: FakeResponses) -> None:
    with sdk(fake_responses) as client:
        first = client.responses.create(model="m", input="hi")
        client.responses.create(model="m", input="again", previous_response_id=first.id)
        unstored = client.responses.create(model="m", input="hi", store=False)
        with pytest.raises(openai.BadRequestError) as missing:
            client.responses.create(model="m", input="again", previous_response_id=unstored.id)
    assert missing.value.param == "previous_response_id"


def test_knobs_limit_and_key(fake_responses: FakeResponses) -> None:
    fake_responses.tokens, fake_responses.api_key = 10, "fake-responses-key"
    body = {"model": "m", "input": "hi", "max_output_tokens": 4}
    with httpx.Client(base_url=fake_responses.url) as client:
        refused = client.post("/responses", json=body)
        headers = {"authorization": "Bearer fake-responses-key"}
        cut = client.post("/responses", json=body, headers=headers).json()
        streamed = client.post("/responses", json={**body, "stream": True}, headers=headers)
        fake_responses.fail(503)
        failed = client.post("/responses", json=body, headers=headers)
    assert refused.status_code == 401
    assert cut["status"] == "incomplete" and cut["usage"]["output_tokens"] == 4
    assert sse_payloads(streamed)[-1]["type"] == "response.incomplete"
    assert "event: response.incomplete" in streamed.text
    assert failed.status_code == 503 and failed.json()["error"]["type"] == "server_error"

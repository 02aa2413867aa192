"""The fakes speak their APIs' wire formats and obey their knobs."""

from __future__ import annotations

import base64
import time

import httpx
import orjson
import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.fixtures import fake_anthropic, fake_openai
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.fakes.sse import sse_payloads

__all__ = ["fake_anthropic", "fake_openai"]

CHAT = {"model": "gpt-test", "messages": [{"role": "user", "content": "one two three"}]}


async def test_openai_chat_body_and_usage(fake_openai: FakeOpenAI) -> None:
    fake_openai.reply_text = "Paris is the capital."
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        response = await client.post("/chat/completions", json={**CHAT, "n": 2, "x_extra": 1})
    body = response.json()
    assert response.status_code == 200
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "gpt-test"
    assert [c["message"]["content"] for c in body["choices"]] == ["Paris is the capital."] * 2
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["prompt_tokens"] == 3
    assert body["usage"]["completion_tokens"] == 8  # 4 words x 2 choices
    assert fake_openai.requests[-1]["body"]["x_extra"] == 1
    assert fake_openai.requests[-1]["path"] == "/v1/chat/completions"


async def test_openai_stream_with_usage(fake_openai: FakeOpenAI) -> None:
    fake_openai.tokens = 4
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        response = await client.post("/chat/completions", json=body)
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "word0 word1 word2 word3"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_openai_stream_omits_usage_when_asked(fake_openai: FakeOpenAI) -> None:
    fake_openai.omit_usage = True
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        response = await client.post("/chat/completions", json=body)
        plain = await client.post("/chat/completions", json=CHAT)
    assert all(p == "[DONE]" or p["choices"] for p in sse_payloads(response))
    assert "usage" not in plain.json()


async def test_openai_forced_tool_call(fake_openai: FakeOpenAI) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    choice = {"type": "function", "function": {"name": "weather"}}
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        response = await client.post(
            "/chat/completions", json={**CHAT, "tools": [tool], "tool_choice": choice}
        )
    result = response.json()["choices"][0]
    assert result["finish_reason"] == "tool_calls"
    call = result["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "test"}


async def test_openai_completions_embeddings_models(fake_openai: FakeOpenAI) -> None:
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        text = (await client.post("/completions", json={"model": "m", "prompt": "a b"})).json()
        vectors = await client.post(
            "/embeddings", json={"model": "e", "input": ["a b", "c"], "encoding_format": "base64"}
        )
        models = (await client.get("/models")).json()
        health = await client.get(f"{fake_openai.base_url}/health")
    assert text["object"] == "text_completion"
    assert text["usage"]["prompt_tokens"] == 2
    data = vectors.json()["data"]
    assert len(data) == 2
    assert len(base64.b64decode(data[0]["embedding"])) == 8 * 4
    assert models["data"][0]["id"] == "fake-model"
    assert health.status_code == 200


async def test_openai_fail_status_then_recovers(fake_openai: FakeOpenAI) -> None:
    fake_openai.fail(429, times=1, retry_after="2")
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        first = await client.post("/chat/completions", json=CHAT)
        second = await client.post("/chat/completions", json=CHAT)
    assert first.status_code == 429
    assert first.headers["retry-after"] == "2"
    assert first.json()["error"]["code"] == "rate_limit_exceeded"
    assert second.status_code == 200


async def test_openai_script_orders_behaviours(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Behaviour(fail_status=503), Behaviour(malformed_json=True))
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        statuses = [(await client.post("/chat/completions", json=CHAT)) for _ in range(3)]
    assert [r.status_code for r in statuses] == [503, 200, 200]
    with pytest.raises(ValueError):
        statuses[1].json()
    assert statuses[2].json()["object"] == "chat.completion"


async def test_openai_delay_and_stall(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Behaviour(delay_s=0.3), Behaviour(stall_after_chunks=1))
    async with httpx.AsyncClient(base_url=fake_openai.url, timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/chat/completions", json=CHAT)
        with pytest.raises(httpx.ReadTimeout):
            async with client.stream(
                "POST", "/chat/completions", json={**CHAT, "stream": True}
            ) as r:
                async for _ in r.aiter_lines():
                    pass


async def test_openai_reset_mid_stream(fake_openai: FakeOpenAI) -> None:
    fake_openai.reset_after_chunks = 2
    received: list[str] = []
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream(
                "POST", "/chat/completions", json={**CHAT, "stream": True}
            ) as r:
                async for line in r.aiter_lines():
                    received.append(line)
    assert sum(line.startswith("data: ") for line in received) == 3  # role + 2 content


async def test_openai_api_key_knob(fake_openai: FakeOpenAI) -> None:
    fake_openai.api_key = "fake-right-key"
    async with httpx.AsyncClient(base_url=fake_openai.url) as client:
        wrong = await client.post("/chat/completions", json=CHAT)
        right = await client.post(
            "/chat/completions", json=CHAT, headers={"authorization": "Bearer fake-right-key"}
        )
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert right.status_code == 200


def test_stop_ends_stalled_stream_promptly() -> None:
    fake = FakeOpenAI().start()
    fake.stall_after_chunks = 0
    with (
        httpx.Client(base_url=fake.url, timeout=5) as client,
        client.stream("POST", "/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        started = time.monotonic()
        fake.stop()
        with pytest.raises(httpx.HTTPError):
            response.read()
    assert time.monotonic() - started < 3


MESSAGES = {
    "model": "claude-test",
    "max_tokens": 64,
    "system": "be brief",
    "messages": [{"role": "user", "content": "one two three"}],
}


async def test_anthropic_message(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.reply_text = "Bonjour tout le monde"
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as client:
        response = await client.post(
            "/v1/messages", json=MESSAGES, headers=fake_anthropic.auth_headers()
        )
    body = response.json()
    assert body["type"] == "message"
    assert body["id"].startswith("msg_")
    assert body["content"] == [{"type": "text", "text": "Bonjour tout le monde"}]
    assert body["stop_reason"] == "end_turn"
    assert body["usage"]["input_tokens"] == 5  # system 2 + user 3
    assert body["usage"]["output_tokens"] == 4


async def test_anthropic_stream_event_sequence(fake_anthropic: FakeAnthropic) -> None:
    fake_anthropic.tokens = 3
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as client:
        response = await client.post(
            "/v1/messages", json={**MESSAGES, "stream": True}, headers=fake_anthropic.auth_headers()
        )
    events = [
        line.removeprefix("event: ")
        for line in response.text.splitlines()
        if line.startswith("event: ")
    ]
    assert events == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    payloads = sse_payloads(response)
    assert payloads[0]["message"]["usage"]["input_tokens"] == 5
    assert payloads[-2]["usage"]["output_tokens"] == 3
    assert payloads[-2]["delta"]["stop_reason"] == "end_turn"
    text = "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta")
    assert text == "word0 word1 word2"


@pytest.mark.parametrize(
    ("status", "kind"), [(529, "overloaded_error"), (429, "rate_limit_error"), (500, "api_error")]
)
async def test_anthropic_errors(fake_anthropic: FakeAnthropic, status: int, kind: str) -> None:
    fake_anthropic.fail(status, retry_after="5")
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as client:
        response = await client.post(
            "/v1/messages", json=MESSAGES, headers=fake_anthropic.auth_headers()
        )
    assert response.status_code == status
    assert response.json() == {
        "type": "error",
        "error": {"type": kind, "message": response.json()["error"]["message"]},
    }
    assert response.headers["retry-after"] == "5"


async def test_anthropic_checks_headers(fake_anthropic: FakeAnthropic) -> None:
    async with httpx.AsyncClient(base_url=fake_anthropic.url) as client:
        bad_key = await client.post(
            "/v1/messages", json=MESSAGES, headers={"x-api-key": "nope", "anthropic-version": "1"}
        )
        no_version = await client.post(
            "/v1/messages", json=MESSAGES, headers={"x-api-key": fake_anthropic.api_key}
        )
    assert bad_key.status_code == 401
    assert bad_key.json()["error"]["type"] == "authentication_error"
    assert no_version.status_code == 400
    assert fake_anthropic.requests[0]["headers"]["x-api-key"] == "nope"


async def test_usage_details_knobs(fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic) -> None:
    """OpenAI counts cached and reasoning tokens inside its totals; Anthropic reports
    cache reads and writes beside `input_tokens`, in the reply and in message_start."""
    fake_openai.cached_tokens, fake_openai.reasoning_tokens, fake_openai.tokens = 2, 5, 4
    fake_anthropic.cached_tokens, fake_anthropic.cache_write_tokens = 40, 8
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{fake_openai.url}/chat/completions", json=CHAT)
        streamed = await client.post(
            f"{fake_openai.url}/chat/completions",
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        )
        messages = [
            await client.post(
                f"{fake_anthropic.url}/v1/messages",
                json={**MESSAGES, "stream": stream},
                headers=fake_anthropic.auth_headers(),
            )
            for stream in (False, True)
        ]
    for usage in (reply.json()["usage"], sse_payloads(streamed)[-2]["usage"]):
        assert usage["prompt_tokens"] == 3 and usage["completion_tokens"] == 4 + 5
        assert usage["prompt_tokens_details"]["cached_tokens"] == 2
        assert usage["completion_tokens_details"]["reasoning_tokens"] == 5
    started = sse_payloads(messages[1])[0]["message"]["usage"]
    for usage in (messages[0].json()["usage"], started):
        assert usage["input_tokens"] == 5
        assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (40, 8)

"""LiteLLMClient against the local Anthropic (and OpenAI) fakes."""

from __future__ import annotations

import importlib
import socket
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.upstreams.base import (
    UpstreamConnectFailed,
    UpstreamStatus,
    UpstreamTarget,
    UpstreamTimedOut,
    UpstreamUnsupported,
    retry_after,
)
from gateway.upstreams.litellm_impl import LiteLLMClient, translate_error, unsupported_params
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.fixtures import fake_anthropic, fake_openai
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

__all__ = ["fake_anthropic", "fake_openai"]

MODEL = "claude-sonnet-4-5"  # a name in litellm's model map
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "one two three"}]}


@pytest.fixture
async def client() -> AsyncIterator[LiteLLMClient]:
    upstream = LiteLLMClient()
    yield upstream
    await upstream.close()


def anthropic_target(fake: FakeAnthropic, **changes: object) -> UpstreamTarget:
    settings: dict[str, object] = {
        "deployment": "claude-haiku",
        "provider": "anthropic",
        "model": MODEL,
        "api_base": fake.url,
        "api_key": fake.api_key,
        "timeout_s": 5.0,
        **changes,
    }
    return UpstreamTarget(**settings)  # type: ignore[arg-type]


async def collect(client: LiteLLMClient, target: UpstreamTarget) -> list[dict[str, object]]:
    stream = client.stream(target, "chat", dict(CHAT))
    return [orjson.loads(p) async for events in stream for p in events]


async def test_complete_returns_openai_body(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.reply_text = "Three words here"
    body = {**CHAT, "temperature": 0.2, "max_tokens": 50, "api_base": "http://evil", "top_k": 3}
    reply = await client.complete(anthropic_target(fake_anthropic), "chat", body)
    assert reply.body["object"] == "chat.completion"
    assert reply.body["model"] == MODEL
    choice = reply.body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Three words here"}
    assert choice["finish_reason"] == "stop"
    usage = reply.body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (3, 3, 6)
    sent = fake_anthropic.requests[-1]
    assert sent["body"]["model"] == MODEL
    assert sent["body"]["temperature"] == 0.2
    assert sent["body"]["max_tokens"] == 50
    assert sent["body"]["top_k"] == 3
    assert "api_base" not in sent["body"]  # dropped, and the call still went to the fake


async def test_stream_yields_openai_chunks_with_usage(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.reply_text = "Streaming is fun to watch"
    chunks = await collect(client, anthropic_target(fake_anthropic))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(
        c["choices"][0]["delta"].get("content") or ""  # type: ignore[index]
        for c in chunks
        if c["choices"]
    )
    assert text == "Streaming is fun to watch"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]  # type: ignore[index]
    assert finishes[-1] == "stop"
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] == 3  # type: ignore[index]
    assert usage["completion_tokens"] == 5  # type: ignore[index]
    assert fake_anthropic.requests[-1]["body"]["stream"] is True


async def test_forced_tool_call_round_trips(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    body = {
        **CHAT,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    }
    reply = await client.complete(anthropic_target(fake_anthropic), "chat", body)
    choice = reply.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "test"}
    sent = fake_anthropic.requests[-1]["body"]
    assert sent["tool_choice"] == {"type": "tool", "name": "weather"}


async def test_stream_closed_early_releases_the_call(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.itl_s = 0.05
    target = anthropic_target(fake_anthropic)
    stream = client.stream(target, "chat", dict(CHAT))
    [first_payload] = await anext(stream)
    first = orjson.loads(first_payload)
    await stream.aclose()  # type: ignore[attr-defined]
    assert first["object"] == "chat.completion.chunk"
    reply = await client.complete(target, "chat", dict(CHAT))
    assert reply.body["choices"][0]["finish_reason"] == "stop"


async def test_rate_limit_carries_retry_after(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail(429, retry_after="7")
    with pytest.raises(UpstreamStatus) as caught:
        await client.complete(anthropic_target(fake_anthropic), "chat", dict(CHAT))
    assert caught.value.status == 429
    assert caught.value.retry_after_s == 7.0
    assert caught.value.retryable
    assert caught.value.body["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("status", [529, 503, 500])
async def test_overload_and_server_errors_are_retryable(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic, status: int
) -> None:
    fake_anthropic.fail(status)
    with pytest.raises(UpstreamStatus) as caught:
        await client.complete(anthropic_target(fake_anthropic), "chat", dict(CHAT))
    assert caught.value.status == status
    assert caught.value.retryable


async def test_stream_failure_before_first_chunk(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.fail(529, retry_after="1.5")
    with pytest.raises(UpstreamStatus) as caught:
        await collect(client, anthropic_target(fake_anthropic))
    assert (caught.value.status, caught.value.retry_after_s) == (529, 1.5)
    assert caught.value.retryable


async def test_bad_key_is_not_retryable(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    target = anthropic_target(fake_anthropic, api_key="fake-anthropic-wrong")
    with pytest.raises(UpstreamStatus) as caught:
        await client.complete(target, "chat", dict(CHAT))
    assert caught.value.status == 401
    assert not caught.value.retryable
    assert "fake-anthropic-wrong" not in str(caught.value)


async def test_closed_port_is_connect_failure(client: LiteLLMClient) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    target = UpstreamTarget("down", "anthropic", MODEL, f"http://127.0.0.1:{port}", "k")
    with pytest.raises(UpstreamConnectFailed):
        await client.complete(target, "chat", dict(CHAT))


async def test_slow_upstream_times_out(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    fake_anthropic.delay_s = 2.0
    with pytest.raises(UpstreamTimedOut):
        await client.complete(anthropic_target(fake_anthropic, timeout_s=0.3), "chat", dict(CHAT))


async def test_stream_stall_times_out_and_reset_fails(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    target = anthropic_target(fake_anthropic, timeout_s=0.3)
    fake_anthropic.script(Behaviour(stall_after_chunks=2), Behaviour(reset_after_chunks=2))
    with pytest.raises(UpstreamTimedOut):
        await collect(client, target)
    with pytest.raises(UpstreamConnectFailed):
        await collect(client, target)


async def test_completions_endpoint_is_refused(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    with pytest.raises(UpstreamStatus) as caught:
        await client.complete(anthropic_target(fake_anthropic), "completions", {"prompt": "x"})
    assert caught.value.status == 501  # not the client's fault: the gateway falls back
    assert not caught.value.retryable
    assert "completions" in caught.value.message
    assert fake_anthropic.requests == []


@pytest.mark.parametrize("stream", [False, True])
async def test_unsupported_parameters_are_named_not_retried(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic, stream: bool
) -> None:
    """litellm refuses what Anthropic lacks, before calling: this deployment cannot
    serve the request (the next may), in our words, without litellm's advice."""
    target = anthropic_target(fake_anthropic)
    body = {**CHAT, "n": 2, "seed": 7}
    with pytest.raises(UpstreamUnsupported) as caught:
        if stream:
            await anext(client.stream(target, "chat", body))
        else:
            await client.complete(target, "chat", body)
    failure = caught.value
    assert failure.params == ("n", "seed")
    assert (failure.deployment, failure.provider) == ("claude-haiku", "anthropic")
    assert not failure.retryable and failure.status is None
    assert failure.message == (
        "deployment 'claude-haiku' (provider 'anthropic') does not support parameters: n, seed"
    )
    assert fake_anthropic.requests == []


@pytest.mark.parametrize(
    ("text", "params"),
    [
        (
            "anthropic does not support parameters: ['n', 'seed'], for model=m. To drop",
            ("n", "seed"),
        ),
        ('x does not support parameters: ["logit_bias"], for model=m', ("logit_bias",)),
        ("Setting `user` is not supported by vertex_ai, m. To drop it", ("user",)),
        ("Function calling is not supported by ollama.", ()),
        (
            "bedrock does not support parameters: {'dimensions': 256, 'user': 'u'}, for model=m",
            ("dimensions", "user"),
        ),
        ("Setting {'user': 'u-1'} is not supported by cohere. To drop it", ("user",)),
        (
            "together_ai does not support parameters: tools, tool_choice, for model=m",
            ("tools", "tool_choice"),
        ),
        ("Setting dimensions is not supported for OpenAI `text-embedding-3`", ("dimensions",)),
        ("Setting user/encoding format is not supported by bedrock. To drop it", ()),
    ],
)
def test_unsupported_parameter_names(text: str, params: tuple[str, ...]) -> None:
    assert unsupported_params(text) == params


async def test_an_unsupported_form_without_names_loses_litellms_advice(
    client: LiteLLMClient, fake_anthropic: FakeAnthropic
) -> None:
    await client.preload()
    exceptions = importlib.import_module("litellm.exceptions")
    refusal = exceptions.UnsupportedParamsError(
        message="thinking.budget_tokens must be a number, got str. To drop it, set "
        "`litellm.drop_params=True`, or `drop_params: true` under `litellm_settings`"
    )
    failure = translate_error(anthropic_target(fake_anthropic), refusal)
    assert isinstance(failure, UpstreamUnsupported) and failure.params == ()
    assert failure.message.endswith("thinking.budget_tokens must be a number, got str.")
    assert "drop_params" not in failure.message


async def test_embeddings_through_litellm(client: LiteLLMClient, fake_openai: FakeOpenAI) -> None:
    target = UpstreamTarget(
        "emb", "openai", "text-embedding-3-small", fake_openai.url, "fake-x-key"
    )
    reply = await client.complete(target, "embeddings", {"model": "e", "input": ["a b", "c"]})
    assert reply.body["object"] == "list"
    assert len(reply.body["data"]) == 2
    assert reply.body["usage"]["prompt_tokens"] == 3


def test_retry_after_forms() -> None:
    assert retry_after({"retry-after": "3"}) == 3.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after(None) is None

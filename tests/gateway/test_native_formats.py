"""What the gateway reads of native replies and streams (`gateway.native`), and what it
sends a native deployment, without a server: usage into token classes, the chat view
the verifier reads, the body's caps, the Messages URL, one parse per streamed event,
and a buffered reply replayed as its API's stream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.billing.pricing import UNPRICED
from gateway.billing.usage import TokenClasses
from gateway.native import NativeCall
from gateway.native.formats import NativeEvent, NativeSurface, chat_usage, chat_view, native_event
from gateway.native.replay import replayed_stream
from gateway.native.upstream import NativeClient, native_request
from gateway.pipeline.accounting import reported_usage
from gateway.pipeline.native_streams import NativeTally
from gateway.pipeline.streaming import StreamTally
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import UpstreamFailure, UpstreamTarget, messages_url
from gateway.upstreams.openai_impl import OpenAICompatibleClient


def deployment(max_output_tokens: int | None = None) -> DeploymentRuntime:
    target = UpstreamTarget("d", "openai", "upstream-model", "http://127.0.0.1:1/v1", "fake-key")
    return DeploymentRuntime(
        "d",
        "cheap",
        "openai",
        target,
        UNPRICED,
        0,
        0.0,
        None,
        max_output_tokens=max_output_tokens,
        capabilities=frozenset({"chat", "responses"}),
    )


def test_responses_usage_keeps_its_classes_inside_the_totals() -> None:
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 60},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 20},
    }
    read = reported_usage({"usage": chat_usage("responses", usage)})
    assert read is not None
    assert (read.prompt_tokens, read.completion_tokens) == (100, 30)
    assert read.classes == TokenClasses(cache_read=60, reasoning=20)


def test_anthropic_cache_tokens_are_added_to_the_prompt_as_litellm_adds_them() -> None:
    usage = {
        "input_tokens": 10,
        "cache_read_input_tokens": 40,
        "cache_creation_input_tokens": 8,
        "output_tokens": 5,
    }
    read = reported_usage({"usage": chat_usage("messages", usage)})
    assert read is not None
    assert (read.prompt_tokens, read.completion_tokens) == (58, 5)
    assert read.classes == TokenClasses(cache_read=40, cache_write=8)


@pytest.mark.parametrize(
    "usage",
    [{"output_tokens": 5}, {"input_tokens": "10", "output_tokens": 5}, {"input_tokens": -1}],
)
def test_usage_that_is_no_count_reads_as_not_reported(usage: dict[str, Any]) -> None:
    for surface in ("responses", "messages"):
        assert reported_usage({"usage": chat_usage(surface, usage)}) is None  # type: ignore[arg-type]
    assert chat_usage("messages", None) is None


def test_the_chat_view_carries_text_tool_calls_and_how_it_ended() -> None:
    response = {
        "id": "resp_1",
        "status": "incomplete",
        "model": "m",
        "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "Hel"}, "odd"]},
            {"type": "message", "content": [{"type": "output_text", "text": "lo"}]},
        ],
    }
    view = chat_view("responses", response)
    assert view["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert view["choices"][0]["finish_reason"] == "length" and "usage" not in view
    message = {
        "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    view = chat_view("messages", message)
    choice = view["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a":1}'} and call["id"] == "toolu_1"
    assert view["usage"]["prompt_tokens"] == 3
    assert (
        chat_view("messages", {"content": "not a list"})["choices"][0]["message"]["content"] == ""
    )


def test_the_body_is_the_clients_with_the_deployments_model_and_the_caps() -> None:
    native = NativeCall("responses", {"model": "auto", "input": "hi", "stream": True})
    capped = native.body_for(deployment(40), {"stream": True, "max_completion_tokens": 100})
    assert capped == {
        "model": "upstream-model",
        "input": "hi",
        "stream": True,
        "max_output_tokens": 40,
    }
    held = native.body_for(deployment(), {"max_tokens": 25})  # a budget's hold; buffered
    assert held == {"model": "upstream-model", "input": "hi", "max_output_tokens": 25}
    assert "max_output_tokens" not in native.body_for(deployment(), {})
    asked = NativeCall("messages", {"model": "x", "max_tokens": 10, "messages": []})
    assert asked.body_for(deployment(40), {"max_tokens": 10})["max_tokens"] == 10
    assert native.needs({"chat": "model"}) == {"chat": "model"}
    stateful = NativeCall("responses", {}, required_by="store")
    assert stateful.needs({"chat": "model", "tools": "tools"}) == {"responses": "store"}


@pytest.mark.parametrize(
    ("api_base", "url"),
    [
        ("https://api.anthropic.com", "https://api.anthropic.com/v1/messages"),
        ("http://h:8000/v1/", "http://h:8000/v1/messages"),
        ("http://h/proxy/v1/messages", "http://h/proxy/v1/messages"),
    ],
)
def test_the_messages_url_under_any_api_base(api_base: str, url: str) -> None:
    assert messages_url(api_base) == url


def test_native_requests_carry_the_apis_credentials() -> None:
    target = deployment().target
    responses = native_request(target, "responses", {}, {})
    assert str(responses.url) == "http://127.0.0.1:1/v1/responses"
    assert responses.headers["authorization"] == "Bearer fake-key"
    messages = native_request(target, "messages", {}, {"anthropic-beta": "b"})
    assert messages.headers["x-api-key"] == "fake-key"
    assert messages.headers["anthropic-version"] == "2023-06-01"
    assert messages.headers["anthropic-beta"] == "b" and "authorization" not in messages.headers


def events(*payloads: dict[str, Any]) -> list[NativeEvent]:
    """The events as the SSE reader yields them: parsed."""
    return [e for p in payloads if (e := native_event(orjson.dumps(p))) is not None]


def test_a_messages_stream_tally_merges_start_and_delta_usage() -> None:
    tally = NativeTally("messages")
    start = {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 1}
    framed = tally.frame(
        events(
            {"type": "message_start", "message": {"usage": start}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
            {"type": "message_delta", "usage": {"output_tokens": 9}},
        )
    )
    assert framed.startswith(b"event: message_start\ndata: {")
    assert framed.count(b"\n\n") == 3 and tally.end == b""
    assert tally.usage is not None
    assert (tally.usage.prompt_tokens, tally.usage.completion_tokens) == (10, 9)
    assert tally.texts() == ["hi"]
    assert b"event: error" in tally.error(UpstreamFailure("reset"))


def test_a_responses_stream_tally_reads_the_completed_usage_and_numbers_its_error() -> None:
    tally = NativeTally("responses")
    tally.frame(events({"type": "response.output_text.delta", "delta": "x", "sequence_number": 4}))
    assert tally.usage is None
    error = orjson.loads(tally.error(UpstreamFailure("reset")).split(b"data: ")[1])
    assert error["sequence_number"] == 5 and error["type"] == "error"
    usage = {"input_tokens": 4, "output_tokens": 2}
    tally.frame(events({"type": "response.completed", "response": {"usage": usage}}))
    assert tally.usage is not None and tally.usage.completion_tokens == 2


def test_a_messages_stream_usage_is_final_only_with_message_delta() -> None:
    """`message_start` says 1 output token: what a stream cut short before
    `message_delta` reported is its prompt, not its answer's length."""
    tally = NativeTally("messages")
    start = {"input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 1}
    tally.frame(
        events(
            {"type": "message_start", "message": {"usage": start}},
            {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a b c"}},
        )
    )
    assert tally.usage is None and tally.early is not None
    assert (tally.early.prompt_tokens, tally.early.completion_tokens) == (10, 1)
    assert tally.early.classes == TokenClasses(cache_read=3)
    assert tally.texts() == ["a b c"]


def counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every `orjson.loads` from here on, by its argument."""
    parsed: list[bytes] = []
    loads = orjson.loads

    def counted(data: Any) -> Any:
        parsed.append(bytes(data))
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counted)
    return parsed


class Body(httpx.AsyncByteStream):
    """A response body read as a stream (httpx reads `content=` at once)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


async def upstream_stream(body: bytes, surface: NativeSurface | None) -> list[list[Any]]:
    """The batches a native stream (or, `surface` None, a chat stream) of `body` yields."""
    http = OpenAICompatibleClient(transport="httpcore")
    http._transport = httpx.MockTransport(lambda _: httpx.Response(200, stream=Body(body)))
    target = deployment().target
    if surface is None:
        return [batch async for batch in http.stream(target, "chat", {})]
    stream = NativeClient(http).stream(target, surface, {}, {})
    return [batch async for batch in stream]


async def test_a_native_stream_parses_each_event_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """One parse, in the SSE reader: the terminal check, the relay's event names, the
    usage and the text read it."""
    payloads = events(
        {"type": "message_start", "message": {"usage": {"input_tokens": 4, "output_tokens": 1}}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "ping"},
        {"type": "message_delta", "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    )
    body = b"".join(f"event: {e.kind}\ndata: ".encode() + e.payload + b"\n\n" for e in payloads)
    parsed = counting_loads(monkeypatch)
    tally = NativeTally("messages")
    framed = b"".join([tally.frame(batch) for batch in await upstream_stream(body, "messages")])
    assert framed == body  # relayed as it came, each event named by its type
    assert tally.usage is not None and tally.usage.completion_tokens == 2
    assert tally.texts() == ["hi"]
    assert parsed == [e.payload for e in payloads]


async def test_a_chat_stream_parses_usage_chunks_only_once_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
    ]
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    parsed = counting_loads(monkeypatch)
    tally = StreamTally(wants_usage=True)
    for batch in await upstream_stream(body, None):
        tally.frame(batch)
    assert tally.usage is not None and tally.usage.prompt_tokens == 3
    assert len(parsed) == len(chunks) + 1  # the reader's check, then the usage chunk


def replayed(surface: NativeSurface, reply: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) pairs of a replayed stream."""
    frames = replayed_stream(surface, reply).split(b"\n\n")[:-1]
    pairs = []
    for frame in frames:
        name, data = frame.split(b"\n")
        pairs.append((name.removeprefix(b"event: ").decode(), orjson.loads(data[6:])))
    assert all(name == data["type"] for name, data in pairs)
    return pairs


def test_a_buffered_response_replays_as_its_stream_with_its_ids() -> None:
    call = {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    text = {"type": "output_text", "text": "Hi.", "annotations": []}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": [text]}
    reply = {"id": "resp_9", "status": "incomplete", "output": [reasoning, message, call]}
    pairs = replayed("responses", reply)
    assert [data["sequence_number"] for _, data in pairs] == list(range(len(pairs)))
    assert pairs[0][1]["response"]["id"] == "resp_9" and pairs[0][1]["response"]["output"] == []
    assert pairs[-1] == ("response.incomplete", {**pairs[-1][1], "response": reply})
    by_name = {name: data for name, data in pairs}
    assert by_name["response.output_text.delta"]["delta"] == "Hi."
    assert by_name["response.output_text.delta"]["item_id"] == "msg_1"
    assert by_name["response.function_call_arguments.done"]["arguments"] == "{}"
    done = [data["item"] for name, data in pairs if name == "response.output_item.done"]
    assert done == [reasoning, message, call]


def test_a_buffered_message_replays_as_anthropics_stream() -> None:
    usage = {"input_tokens": 5, "output_tokens": 7}
    content = [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "text", "text": "Hi."},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
    ]
    reply = {"id": "msg_9", "type": "message", "content": content, "stop_reason": "tool_use"}
    pairs = replayed("messages", {**reply, "usage": usage})
    start = pairs[0][1]["message"]
    assert start["id"] == "msg_9" and start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 5, "output_tokens": 0}
    deltas = [data["delta"] for name, data in pairs if name == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "hmm"},
        {"type": "signature_delta", "signature": "sig"},
        {"type": "text_delta", "text": "Hi."},
        {"type": "input_json_delta", "partial_json": '{"a":1}'},
    ]
    assert pairs[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": usage,
    }
    assert pairs[-1][0] == "message_stop"

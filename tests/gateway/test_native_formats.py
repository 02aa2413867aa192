"""What the gateway reads of native replies and streams (`gateway.native`), and what it
sends a native deployment, without a server: usage into token classes, the chat view
the verifier reads, the body's caps, the Messages URL."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.billing.pricing import UNPRICED
from gateway.billing.usage import TokenClasses
from gateway.native import NativeCall
from gateway.native.formats import chat_usage, chat_view
from gateway.native.upstream import messages_url, native_request
from gateway.pipeline.accounting import reported_usage
from gateway.pipeline.native_streams import NativeTally
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import UpstreamFailure, UpstreamTarget


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


def events(*payloads: dict[str, Any]) -> list[bytes]:
    return [orjson.dumps(p) for p in payloads]


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

"""What the bridges carry and what they refuse, never dropping a part of the request: every
content block or part is translated or refused (400, naming it) on a bridged route and
passed on untouched on a native one; so are fields the APIs do not have. Also the
settings a bridged response object echoes, `x-request-id` on `/v1/models`, and empty
strings refused by `/v1/embeddings`. The gateway is native_fleet.py's: `bridged` routes
to a chat deployment, `claude` to a native Anthropic one, `auto` to a native Responses
one."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.http.validation import parse_body
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.conftest import AUTH
from tests.gateway.native_fleet import base, fake_responses, openai_sdk

__all__ = ["base", "fake_responses"]  # fixtures

NOT_BRIDGED = "not supported on this route (bridged to an OpenAI-style deployment)"
PNG = "iVBORw0KGgo="
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
TOOLS = [{"name": "get_weather", "input_schema": {"type": "object"}}]


def message(base: str, content: Any, **extra: Any) -> httpx.Response:
    body = {"model": "bridged", "max_tokens": 10, "messages": content, **extra}
    return httpx.post(f"{base}/v1/messages", json=body, headers=AUTH, timeout=30)


def user(*blocks: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def result(*blocks: dict[str, Any], **extra: Any) -> list[dict[str, Any]]:
    """A tool call and its result, whose content is `blocks`."""
    done = {"type": "tool_result", "tool_use_id": "toolu_1", "content": list(blocks), **extra}
    return [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [USE]},
        {"role": "user", "content": [done]},
    ]


def sent(fake: FakeOpenAI) -> dict[str, Any]:
    body: dict[str, Any] = fake.requests[-1]["body"]
    return body


def anthropic_refusal(reply: httpx.Response, param: str) -> str:
    assert reply.status_code == 400, reply.text
    body = reply.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message: str = body["error"]["message"]
    assert f"'{param}'" in message
    return message


def test_a_text_document_reaches_the_model_as_text(base: str, fake_openai: FakeOpenAI) -> None:
    source = {"type": "text", "media_type": "text/plain", "data": "hello doc"}
    document = {"type": "document", "source": source, "title": "Notes", "context": "mine"}
    reply = message(base, user(document, {"type": "text", "text": "summarise"}))
    assert reply.status_code == 200, reply.text
    [asked] = sent(fake_openai)["messages"]
    text = asked["content"][0]["text"]
    assert "hello doc" in text and "Notes" in text and "mine" in text
    assert asked["content"][1] == {"type": "text", "text": "summarise"}


def test_a_text_only_content_document_and_one_in_a_tool_result(
    base: str, fake_openai: FakeOpenAI
) -> None:
    source = {"type": "content", "content": [{"type": "text", "text": "inner text"}]}
    reply = message(base, result({"type": "document", "source": source}), tools=TOOLS)
    assert reply.status_code == 200, reply.text
    tool = sent(fake_openai)["messages"][-1]
    assert tool["role"] == "tool" and "inner text" in json.dumps(tool["content"])


def test_what_litellm_translates_still_passes(base: str, fake_openai: FakeOpenAI) -> None:
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    url_image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    reply = message(base, user({"type": "document", "source": pdf}, image, url_image))
    assert reply.status_code == 200, reply.text
    kinds = [part["type"] for part in sent(fake_openai)["messages"][0]["content"]]
    assert kinds == ["file", "image_url", "image_url"]
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig"}
    turns = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [thinking, {"type": "text", "text": "hello"}]},
        {"role": "user", "content": "again"},
    ]
    assert message(base, turns).status_code == 200  # earlier thinking: out of the context


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (user({"type": "nonsense"}), "messages[0].content[0].type"),
        (
            user({"type": "search_result", "source": "s", "title": "t", "content": []}),
            "messages[0].content[0].type",
        ),
        (
            user({"type": "image", "source": {"type": "file", "file_id": "file_1"}}),
            "messages[0].content[0].source.type",
        ),
        (
            user({"type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}),
            "messages[0].content[0].source.type",
        ),
        (
            user({"type": "text", "text": "hi"}, USE),  # a user's tool_use: dropped by litellm
            "messages[0].content[1].type",
        ),
        (
            result({"type": "search_result", "source": "s", "title": "t", "content": []}),
            "messages[2].content[0].content[0].type",
        ),
    ],
)
def test_a_block_the_bridge_would_drop_is_refused(
    base: str, fake_openai: FakeOpenAI, messages: list[dict[str, Any]], param: str
) -> None:
    text = anthropic_refusal(message(base, messages, tools=TOOLS), param)
    assert NOT_BRIDGED in text
    assert fake_openai.requests == []


def test_a_native_route_passes_blocks_and_fields_on(
    base: str, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> None:
    blocks = user({"type": "search_result", "source": "s", "title": "t", "content": []})
    body = {"model": "claude", "max_tokens": 10, "messages": blocks, "foo": 1}
    reply = httpx.post(f"{base}/v1/messages", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 200, reply.text
    passed = fake_anthropic.requests[-1]["body"]
    assert passed["messages"] == blocks and passed["foo"] == 1
    assert fake_openai.requests == []


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "auto", "disable_parallel_tool_use": True},
        {"type": "any", "disable_parallel_tool_use": True},
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    ],
)
def test_disable_parallel_tool_use_is_parallel_tool_calls_false(
    base: str, fake_openai: FakeOpenAI, choice: dict[str, Any]
) -> None:
    hello = user({"type": "text", "text": "weather?"})
    assert message(base, hello, tools=TOOLS, tool_choice=choice).status_code == 200
    assert sent(fake_openai)["parallel_tool_calls"] is False
    assert message(base, hello, tools=TOOLS, tool_choice={"type": "auto"}).status_code == 200
    assert "parallel_tool_calls" not in sent(fake_openai)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([{"type": "text", "text": "no such city"}], "Error: no such city"),
        ("no such city", "Error: no such city"),
    ],
)
def test_an_error_result_says_so_in_its_text(
    base: str, fake_openai: FakeOpenAI, content: Any, expected: str
) -> None:
    messages = result(is_error=True)
    messages[-1]["content"][0]["content"] = content
    assert message(base, messages, tools=TOOLS).status_code == 200
    tool = sent(fake_openai)["messages"][-1]
    assert tool["role"] == "tool" and tool["content"] == expected


def test_an_unknown_field_is_refused_and_known_ones_pass(
    base: str, fake_openai: FakeOpenAI
) -> None:
    hello = user({"type": "text", "text": "hi"})
    anthropic_refusal(message(base, hello, foo=1), "foo")
    assert fake_openai.requests == []
    known = {"service_tier": "auto", "metadata": {"user_id": "u"}, "stop_sequences": ["x"]}
    assert message(base, hello, **known).status_code == 200
    # Known, but shaping the answer in a way chat cannot: refused, not dropped.
    schema = {"type": "json_schema", "schema": {"type": "object"}}
    anthropic_refusal(message(base, hello, output_format=schema), "output_format")
    anthropic_refusal(message(base, hello, output_config={"format": schema}), "output_config")
    assert message(base, hello, output_config={"effort": "low"}).status_code == 200


# The Responses bridge.


def responses(base: str, **body: Any) -> httpx.Response:
    body = {"model": "bridged", **body}
    return httpx.post(f"{base}/v1/responses", json=body, headers=AUTH, timeout=30)


def parts(*content: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(content)}]


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "input_image", "file_id": "file-abc"}, "input[0].content[0].file_id"),
        ({"type": "input_file", "file_url": "https://x/a.pdf"}, "input[0].content[0].file_url"),
        ({"type": "nonsense"}, "input[0].content[0].type"),
        ({"text": "untyped"}, "input[0].content[0].type"),
    ],
)
def test_a_part_the_bridge_cannot_translate_is_refused(
    base: str, fake_openai: FakeOpenAI, part: dict[str, Any], param: str
) -> None:
    reply = responses(base, input=parts(part, {"type": "input_text", "text": "hi"}))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["code"] == "capability_unavailable"
    assert NOT_BRIDGED in error["message"]
    assert fake_openai.requests == []


def test_translated_parts_pass(base: str, fake_openai: FakeOpenAI) -> None:
    image = {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"}
    pdf = {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,J"}
    reply = responses(base, input=parts({"type": "input_text", "text": "hi"}, image, pdf))
    assert reply.status_code == 200, reply.text
    kinds = [p["type"] for p in sent(fake_openai)["messages"][0]["content"]]
    assert kinds == ["text", "image_url", "file"]


def test_an_unknown_responses_field_is_refused_on_the_bridge_only(
    base: str, fake_openai: FakeOpenAI, fake_responses: FakeResponses
) -> None:
    refused = responses(base, input="hi", foo=1)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "foo"
    assert fake_openai.requests == []
    known = {"truncation": "auto", "include": [], "prompt_cache_key": "k", "store": False}
    assert responses(base, input="hi", **known).status_code == 200
    for field, value, param in [
        ("top_logprobs", 3, "top_logprobs"),
        ("include", ["message.output_text.logprobs"], "include[0]"),
    ]:
        refused = responses(base, input="hi", **{field: value})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    native = responses(base, model="auto", input="hi", foo=1)
    assert native.status_code == 200, native.text
    assert fake_responses.requests[-1]["body"]["foo"] == 1


@pytest.mark.parametrize(("asked", "echoed"), [({}, True), ({"parallel_tool_calls": False}, False)])
def test_a_bridged_response_echoes_store_and_parallel_tool_calls(
    base: str, asked: dict[str, Any], echoed: bool
) -> None:
    with openai_sdk(base) as client:
        plain = client.responses.create(model="bridged", input="hi", store=False, **asked)
        assert plain.store is False and plain.parallel_tool_calls is echoed
        events = list(client.responses.create(model="bridged", input="hi", stream=True, **asked))
    carrying = [e.response for e in events if hasattr(e, "response")]
    assert {e.type for e in events} >= {"response.created", "response.completed"}
    assert len(carrying) >= 2
    assert {(r.store, r.parallel_tool_calls) for r in carrying} == {(False, echoed)}


# /v1/models and /v1/embeddings.


def test_models_answers_carry_a_request_id(base: str) -> None:
    listing = httpx.get(f"{base}/v1/models", headers=AUTH)
    entry = httpx.get(f"{base}/v1/models/bridged", headers=AUTH)
    ids = [r.headers.get("x-request-id", "") for r in (listing, entry)]
    assert [r.status_code for r in (listing, entry)] == [200, 200]
    assert all(i.startswith("req_") for i in ids) and ids[0] != ids[1]


@pytest.mark.parametrize(("given", "param"), [("", "input"), (["a", ""], "input[1]")])
def test_embeddings_refuse_empty_strings(
    base: str, fake_openai: FakeOpenAI, given: Any, param: str
) -> None:
    body = {"model": "bridged", "input": given}
    reply = httpx.post(f"{base}/v1/embeddings", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert fake_openai.requests == []


def test_a_completion_prompt_may_be_empty() -> None:
    body = parse_body(json.dumps({"model": "m", "prompt": ""}).encode(), "completions")
    assert body["prompt"] == ""

"""How the Responses bridge carries the fields chat completions read differently: the
output limit as `max_completion_tokens` (which OpenAI's reasoning models require), still
capped by a deployment's `max_output_tokens` and mapped by litellm for its providers;
`include` values dropped or sent to native deployments; earlier turns' `reasoning` items
dropped; `prompt_cache_key` and friends passed on. Real gateway, fake upstreams over
loopback."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway

POLICY = """
deployments:
  chat:
    api_base: ${CHAT_URL}
    model: chat-model
  capped:
    api_base: ${CHAT_URL}
    model: chat-model
    max_output_tokens: 20
  claude-capped:
    provider: anthropic
    api_base: ${ANTHROPIC_BASE_URL}
    api_key: ${ANTHROPIC_API_KEY}
    model: claude-sonnet-4-5
    capabilities: [chat, tools, vision, json_schema]
    max_output_tokens: 20
  native:
    api_base: ${RESPONSES_URL}
    model: native-model
    capabilities: [chat, responses]
routes:
  bridged: {deployments: [chat]}
  capped: {deployments: [capped]}
  claude: {deployments: [claude-capped]}
  mixed: {strategy: fallback, deployments: [chat, native]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
HELLO = [{"role": "user", "content": "hi"}]
THOUGHT = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "the user greets me"}],
    "encrypted_content": "opaque-blob",
}


@pytest.fixture
def base(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    fake_anthropic: FakeAnthropic,
    fake_responses: FakeResponses,
) -> str:
    return start_gateway(
        POLICY,
        CHAT_URL=fake_openai.url,
        ANTHROPIC_BASE_URL=fake_anthropic.url,
        ANTHROPIC_API_KEY=fake_anthropic.api_key,
        RESPONSES_URL=fake_responses.url,
    ).url


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY, max_retries=0)


def responses(base: str, **body: Any) -> httpx.Response:
    body = {"model": "bridged", "input": "hi", **body}
    return httpx.post(f"{base}/v1/responses", json=body, headers=AUTH, timeout=30)


def sent(fake: FakeOpenAI | FakeAnthropic) -> dict[str, Any]:
    body: dict[str, Any] = fake.requests[-1]["body"]
    return body


@pytest.mark.parametrize("stream", [False, True])
def test_the_output_limit_reaches_chat_as_max_completion_tokens(
    base: str, fake_openai: FakeOpenAI, stream: bool
) -> None:
    with sdk(base) as client:
        reply = client.responses.create(
            model="bridged",
            input="hi",
            reasoning={"effort": "low"},
            max_output_tokens=30,
            stream=stream,
        )
        if stream:
            assert list(reply)[-1].type == "response.completed"  # type: ignore[union-attr]
    asked = sent(fake_openai)
    assert asked["max_completion_tokens"] == 30 and "max_tokens" not in asked
    assert asked["reasoning_effort"] == "low"


def test_a_deployment_cap_still_lowers_it(base: str, fake_openai: FakeOpenAI) -> None:
    fake_openai.tokens = 100
    with sdk(base) as client:
        reply = client.responses.create(model="capped", input="hi", max_output_tokens=500)
    asked = sent(fake_openai)
    assert asked["max_completion_tokens"] == 20 and "max_tokens" not in asked
    assert reply.usage is not None and reply.usage.output_tokens == 20
    assert reply.status == "incomplete"
    assert reply.max_output_tokens == 500  # the client's, as docs/http.md says
    client_lower = responses(base, model="capped", max_output_tokens=5)
    assert client_lower.status_code == 200, client_lower.text
    assert sent(fake_openai)["max_completion_tokens"] == 5


@pytest.mark.parametrize(("asked", "limit"), [(500, 20), (7, 7)])
def test_litellm_providers_get_the_limit_in_their_own_field(
    base: str, fake_anthropic: FakeAnthropic, asked: int, limit: int
) -> None:
    reply = responses(base, model="claude", max_output_tokens=asked)
    assert reply.status_code == 200, reply.text
    assert sent(fake_anthropic)["max_tokens"] == limit


@pytest.mark.parametrize(
    "include",
    [
        ["reasoning.encrypted_content"],
        ["message.input_image.image_url", "web_search_call.action.sources"],
        ["file_search_call.results", "code_interpreter_call.outputs"],
        [],
    ],
)
def test_include_values_asking_only_for_extra_output_are_dropped(
    base: str, fake_openai: FakeOpenAI, include: list[Any]
) -> None:
    with sdk(base) as client:
        reply = client.responses.create(
            model="bridged",
            input="hi",
            store=False,
            reasoning={"effort": "low"},
            include=include,
        )
    assert reply.status == "completed" and reply.output_text == fake_openai.reply_text
    assert "include" not in sent(fake_openai)


@pytest.mark.parametrize(
    ("include", "refused_at"),
    [
        (["reasoning.encrypted_content", "message.output_text.logprobs"], 1),
        (["no.such.output"], 0),
    ],
)
def test_include_values_the_bridge_cannot_honour_need_a_native_deployment(
    base: str,
    fake_openai: FakeOpenAI,
    fake_responses: FakeResponses,
    include: list[str],
    refused_at: int,
) -> None:
    refused = responses(base, include=include)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == f"include[{refused_at}]"
    assert error["code"] == "capability_unavailable"
    assert include[refused_at] in error["message"]
    assert fake_openai.requests == []
    native = responses(base, model="mixed", include=include)
    assert native.status_code == 200, native.text
    assert fake_responses.requests[-1]["body"]["include"] == include
    assert fake_openai.requests == []


@pytest.mark.parametrize("include", ["reasoning.encrypted_content", [1], {"a": 1}])
def test_include_must_be_an_array_of_strings(base: str, include: Any) -> None:
    refused = responses(base, include=include)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "include"


@pytest.mark.parametrize(
    ("given", "messages"),
    [
        (  # the usual stateless round trip: the reasoning before the answer it led to
            [*HELLO, THOUGHT, {"role": "assistant", "content": "hello"}, *HELLO],
            [*HELLO, {"role": "assistant", "content": "hello"}, *HELLO],
        ),
        ([*HELLO, THOUGHT, *HELLO], [*HELLO, *HELLO]),  # no empty assistant turn left
        ([THOUGHT, *HELLO], HELLO),
    ],
)
def test_earlier_reasoning_items_are_dropped(
    base: str, fake_openai: FakeOpenAI, given: list[dict[str, Any]], messages: Any
) -> None:
    reply = responses(base, input=given, store=False, include=["reasoning.encrypted_content"])
    assert reply.status_code == 200, reply.text
    assert sent(fake_openai)["messages"] == messages


def test_a_reasoning_item_before_a_tool_call_is_dropped(base: str, fake_openai: FakeOpenAI) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    reply = responses(base, input=[*HELLO, THOUGHT, call, output], tools=[tool])
    assert reply.status_code == 200, reply.text
    [_, asked, answered] = sent(fake_openai)["messages"]
    assert asked["role"] == "assistant" and asked["tool_calls"][0]["id"] == "call_1"
    assert set(asked) == {"role", "tool_calls"}  # no reasoning text carried as content
    assert answered == {"role": "tool", "content": "ok", "tool_call_id": "call_1"}


CACHE_FIELDS = {
    "prompt_cache_key": "tenant-7",
    "prompt_cache_retention": "24h",
    "safety_identifier": "user-hash-1",
}


def test_cache_and_safety_fields_are_passed_to_chat(
    base: str, fake_openai: FakeOpenAI, fake_anthropic: FakeAnthropic
) -> None:
    reply = responses(base, **CACHE_FIELDS)
    assert reply.status_code == 200, reply.text
    assert {k: sent(fake_openai).get(k) for k in CACHE_FIELDS} == CACHE_FIELDS
    assert responses(base).status_code == 200
    assert not set(CACHE_FIELDS) & set(sent(fake_openai))  # none sent when none asked
    # litellm's providers drop them, as they drop a chat request's
    assert responses(base, model="claude", **CACHE_FIELDS).status_code == 200
    assert not set(CACHE_FIELDS) & set(sent(fake_anthropic))


@pytest.mark.parametrize("field", sorted(CACHE_FIELDS))
def test_cache_and_safety_fields_must_be_strings(base: str, field: str) -> None:
    refused = responses(base, **{field: 1})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == field

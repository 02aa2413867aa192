"""Where the native pass-through of /v1/responses and /v1/messages meets the pipeline's
edges: a Messages stream cut short is billed for what it relayed, a cascade's buffered
stream keeps the native upstream's ids, `background` is refused, and hosted tools go to
native deployments only. The policy and fixtures are in native_fleet.py."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from gateway.billing.tokens import count_text
from gateway.ledger import RedisStore
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.fakes.responses_upstream import FakeResponses
from tests.gateway.cascade_scenario import GOOD, QUESTION
from tests.gateway.conftest import AUTH
from tests.gateway.native_fleet import (
    HELLO,
    anthropic_sdk,
    base,
    fake_responses,
    only_record,
    openai_sdk,
)

__all__ = ["base", "fake_responses"]  # fixtures

CLAUDE = "claude-sonnet-4-5"  # the `claude` deployment's model


def sse_data(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]


def relayed_pieces(events: list[dict[str, object]]) -> list[str]:
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    return [d["text"] for d in deltas if isinstance(d, dict)]


async def test_a_native_message_stream_that_breaks_bills_the_text_it_relayed(
    base: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    """`message_start` reports 1 output token: billed as final, a stream broken before
    `message_delta` cost 1 token whatever it streamed."""
    fake_anthropic.tokens, fake_anthropic.reset_after_chunks = 40, 12
    fake_anthropic.cached_tokens = 10
    body = {"model": "claude", "max_tokens": 100, "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=AUTH, timeout=30) as r:
        lines = list(r.iter_lines())
    events = sse_data(lines)
    assert events[-1]["type"] == "error"
    pieces = relayed_pieces(events)
    assert len(pieces) == 12
    start = events[0]["message"]
    assert isinstance(start, dict) and start["usage"]["output_tokens"] == 1
    record = await only_record(ledger_store, r.headers["x-request-id"])
    assert record.status == "partial" and record.usage_source == "counted"
    assert record.completion_tokens == sum(count_text(CLAUDE, p) for p in pieces) > 12
    # The prompt message_start reported stands, cache reads included.
    assert record.prompt_tokens == start["usage"]["input_tokens"] + 10
    assert record.cache_read_tokens == 10


async def test_a_native_message_stream_its_client_leaves_bills_the_text_it_relayed(
    base: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    fake_anthropic.tokens, fake_anthropic.itl_s = 200, 0.01
    body = {"model": "claude", "max_tokens": 300, "messages": HELLO, "stream": True}
    with httpx.stream("POST", f"{base}/v1/messages", json=body, headers=AUTH, timeout=30) as r:
        read: list[str] = []
        for line in r.iter_lines():
            read.append(line)
            if len(relayed_pieces(sse_data(read))) == 10:
                break  # the client goes: the stream ends without message_delta
    record = await only_record(ledger_store, r.headers["x-request-id"])
    assert record.status == "partial" and record.usage_source == "counted"
    assert record.completion_tokens >= sum(
        count_text(CLAUDE, p) for p in relayed_pieces(sse_data(read))
    )
    assert record.prompt_tokens == sse_data(read)[0]["message"]["usage"]["input_tokens"]  # type: ignore[index]


def test_background_responses_are_refused_on_every_route(
    base: str, fake_responses: FakeResponses, fake_openai: FakeOpenAI
) -> None:
    with openai_sdk(base) as client:
        for model in ("auto", "mixed", "bridged"):
            with pytest.raises(openai.BadRequestError) as refused:
                client.responses.create(model=model, input="hi", background=True)
            assert refused.value.param == "background"
            assert "does not run background responses" in refused.value.message
        client.responses.create(model="auto", input="hi", background=False)
    assert [r["body"]["background"] for r in fake_responses.requests] == [False]
    assert fake_openai.requests == []


async def test_a_stored_response_streamed_by_a_cascade_keeps_the_upstreams_id(
    base: str, fake_responses: FakeResponses, fake_openai: FakeOpenAI
) -> None:
    """A cascade verifies the whole answer, then streams it: as the native deployment's
    own events, so its id is the one the upstream stored."""
    fake_responses.reply_text = GOOD
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="careful-up", input=QUESTION["content"], store=True, stream=True
        )
        events = list(raw.parse())
        completed = events[-1].response  # type: ignore[union-attr]
        follow_up = client.responses.create(
            model="careful-up", input="and then?", previous_response_id=completed.id
        )
    assert raw.headers["x-cascade-deployment"] == "native-premium"
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert completed.id in fake_responses.stored and completed.output_text == GOOD
    assert events[0].response.id == completed.id  # type: ignore[union-attr]
    assert follow_up.previous_response_id == completed.id
    assert fake_openai.requests == []  # the stored state went to the native tier only


async def test_a_message_streamed_by_a_cascade_keeps_anthropics_events_and_id(
    base: str, fake_anthropic: FakeAnthropic, ledger_store: RedisStore
) -> None:
    fake_anthropic.reply_text = GOOD
    with (
        anthropic_sdk(base) as client,
        client.messages.stream(
            model="claude-careful",
            max_tokens=200,
            messages=[QUESTION],  # type: ignore[list-item]
        ) as stream,
    ):
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
        headers = stream.response.headers
    assert headers["x-cascade-deployment"] == "claude"
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.content[0].text == GOOD  # type: ignore[union-attr]
    # The upstream's id, not the bridge's `msg_<request id>`.
    assert final.id.startswith("msg_") and headers["x-request-id"][4:] not in final.id
    record = await only_record(ledger_store, headers["x-request-id"])
    assert record.completion_tokens == final.usage.output_tokens > 0


def test_hosted_tools_and_items_go_to_native_deployments_only(
    base: str, fake_responses: FakeResponses, fake_openai: FakeOpenAI
) -> None:
    hosted: Any = [{"type": "web_search_preview"}]
    reference: Any = {"type": "item_reference", "id": "msg_1"}
    choice: Any = {"type": "web_search_preview"}
    with openai_sdk(base) as client:
        raw = client.responses.with_raw_response.create(
            model="mixed", input="news?", tools=hosted, tool_choice=choice
        )
        client.responses.create(model="auto", input=[reference])
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="bridged", input="news?", tools=hosted)
    # `mixed` tries its chat deployment first: not for a hosted tool.
    assert raw.headers["x-cascade-deployment"] == "native"
    assert fake_responses.requests[0]["body"]["tools"] == hosted
    assert fake_responses.requests[1]["body"]["input"] == [reference]
    assert fake_openai.requests == []
    assert refused.value.param == "tools[0].type"
    message = refused.value.message
    assert "only function tools are bridged to chat" in message and "'responses'" in message


def test_remote_mcp_servers_reach_only_deployments_the_policy_lets(
    base: str, fake_anthropic: FakeAnthropic, fake_responses: FakeResponses
) -> None:
    """A client naming remote MCP servers has the provider connect to them on the
    company's key: only a deployment granted `remote_mcp` takes such a request; the
    others' routes answer 400 naming the field, and no upstream is asked."""
    servers = [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]
    body = {"max_tokens": 20, "messages": HELLO, "mcp_servers": servers}
    headers = {**AUTH, "anthropic-version": "2023-06-01"}
    refused = httpx.post(f"{base}/v1/messages", json={**body, "model": "claude"}, headers=headers)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "remote_mcp" in error["message"] and error.get("param", "mcp_servers") == "mcp_servers"
    assert "natively" not in error["message"]  # `claude` serves Messages natively
    assert fake_anthropic.requests == []
    served = httpx.post(
        f"{base}/v1/messages", json={**body, "model": "claude-mcp"}, headers=headers
    )
    assert served.status_code == 200, served.text
    assert fake_anthropic.requests[-1]["body"]["mcp_servers"] == servers
    mcp_tool = {"type": "mcp", "server_label": "x", "server_url": "https://mcp.example/sse"}
    with openai_sdk(base) as client, pytest.raises(openai.BadRequestError) as hosted:
        client.responses.create(model="auto", input="hi", tools=[mcp_tool])  # type: ignore[list-item]
    assert hosted.value.param == "tools[0]" and fake_responses.requests == []


def test_a_chat_request_cannot_reach_remote_mcp_servers_either(
    base: str, fake_anthropic: FakeAnthropic
) -> None:
    """litellm turns a chat tool of type `mcp` (or `url`) into Anthropic's `mcp_servers`:
    on /v1/chat/completions too it needs a deployment granted `remote_mcp`."""
    tool = {"type": "mcp", "server_url": "https://mcp.example/sse", "server_label": "x"}
    body = {"messages": HELLO, "tools": [tool]}
    refused = httpx.post(
        f"{base}/v1/chat/completions", json={**body, "model": "claude"}, headers=AUTH
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "tools[0]" and "remote_mcp" in error["message"]
    assert fake_anthropic.requests == []
    served = httpx.post(
        f"{base}/v1/chat/completions", json={**body, "model": "claude-mcp"}, headers=AUTH
    )
    assert served.status_code == 200, served.text
    assert fake_anthropic.requests[-1]["body"]["mcp_servers"][0]["url"] == tool["server_url"]

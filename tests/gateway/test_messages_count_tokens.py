"""`POST /v1/messages/count_tokens` through the running gateway, in front of a fake
OpenAI-compatible upstream: the gateway's own count of a Messages request's chat form
(what budgets count), for the route's first deployment, with `/v1/messages`'s key,
checks and errors; no upstream is asked, nothing is recorded, no limit is spent."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from gateway.billing.tokens import count_prompt
from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway, wait_for_record

TIGHT_KEY = "fake-tight-key"  # one request a minute
FENCED_KEY = "fake-fenced-key"  # may use the route `elsewhere` only
POLICY = """
deployments:
  upstream:
    api_base: ${FAKE_URL}
    model: fake-model
    price: {input_per_mtok: 0.15, output_per_mtok: 0.6}
  gpt:
    api_base: ${FAKE_URL}
    model: gpt-4o
    price: {input_per_mtok: 2.5, output_per_mtok: 10}
routes:
  auto: {strategy: fallback, deployments: [upstream, gpt]}
  fast: {deployments: [gpt, upstream]}
  elsewhere: {deployments: [upstream]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
  tight: {secret: "${TIGHT_KEY}", rate_limit: {requests_per_minute: 1}}
  fenced: {secret: "${FENCED_KEY}", allowed_routes: [elsewhere]}
"""
PATH = "/v1/messages/count_tokens"
HELLO = [{"role": "user", "content": "say hello to me"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    server = start_gateway(
        POLICY, FAKE_URL=fake_openai.url, TIGHT_KEY=TIGHT_KEY, FENCED_KEY=FENCED_KEY
    )
    return server.url


def count(base: str, body: dict[str, Any], headers: dict[str, str] = AUTH) -> httpx.Response:
    return httpx.post(f"{base}{PATH}", json={"model": "auto", **body}, headers=headers, timeout=30)


def tokens(base: str, body: dict[str, Any]) -> int:
    reply = count(base, body)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-request-id"]
    result: int = reply.json()["input_tokens"]
    return result


def test_the_count_grows_with_the_prompt_and_asks_no_upstream(
    base: str, fake_openai: FakeOpenAI
) -> None:
    short = tokens(base, {"messages": HELLO})
    longer = tokens(base, {"messages": [{"role": "user", "content": "say hello to me " * 50}]})
    with_system = tokens(base, {"messages": HELLO, "system": "Be brief and kind."})
    with_tools = tokens(
        base, {"messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    )
    assert 0 < short < with_system
    assert short + 150 <= longer
    assert short < with_tools
    assert fake_openai.requests == []


def test_the_count_is_what_budgets_count_for_the_routes_first_model(
    base: str, fake_openai: FakeOpenAI
) -> None:
    """The chat form /v1/messages sends upstream, counted as admission counts it: for
    `fake-model` (cl100k) on `auto`, for `gpt-4o` (o200k) on `fast`."""
    body = {"messages": HELLO, "system": "Be brief.", "tools": [WEATHER]}
    sent = httpx.post(
        f"{base}/v1/messages", json={"model": "auto", "max_tokens": 10, **body}, headers=AUTH
    )
    assert sent.status_code == 200
    chat = fake_openai.requests[-1]["body"]
    assert tokens(base, body) == count_prompt("fake-model", "chat", chat)
    fast = count(base, {**body, "model": "fast"}).json()["input_tokens"]
    assert fast == count_prompt("gpt-4o", "chat", chat)
    # A deployment named directly is counted for its own model.
    assert count(base, {**body, "model": "gpt"}).json()["input_tokens"] == fast


def test_a_max_tokens_sent_is_ignored(base: str) -> None:
    assert tokens(base, {"messages": HELLO, "max_tokens": 10}) == tokens(base, {"messages": HELLO})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": None, "messages": HELLO}, "model"),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": HELLO, "system": 3}, "system"),
        ({"messages": HELLO, "temperature": 1.5}, "temperature"),
        (
            {"messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools[0].type",
        ),
        ({"messages": HELLO, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"messages": HELLO, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ],
)
def test_bad_input_is_a_400_in_anthropic_shape_naming_the_field(
    base: str, fake_openai: FakeOpenAI, body: dict[str, Any], field: str
) -> None:
    reply = count(base, body)
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert f"'{field}'" in reply.json()["error"]["message"]
    assert fake_openai.requests == []


def test_a_body_that_is_not_an_object_is_a_400(base: str) -> None:
    reply = httpx.post(f"{base}{PATH}", content=b"[1]", headers=AUTH, timeout=30)
    assert reply.status_code == 400 and reply.json()["type"] == "error"


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "fake-wrong-key"}, {"authorization": "Bearer fake-wrong-key"}],
)
def test_without_a_known_key_it_is_a_401(base: str, headers: dict[str, str]) -> None:
    reply = count(base, {"messages": HELLO}, headers)
    assert reply.status_code == 401
    assert reply.json()["error"]["type"] == "authentication_error"


def test_the_key_comes_as_x_api_key_or_bearer(base: str) -> None:
    by_header = count(base, {"messages": HELLO}, {"x-api-key": CLIENT_KEY})
    assert by_header.status_code == 200
    assert by_header.json() == count(base, {"messages": HELLO}).json()


def test_an_unknown_model_is_answered_as_on_v1_messages(base: str) -> None:
    body = {"model": "nope", "messages": HELLO}
    counted = count(base, body)
    created = httpx.post(
        f"{base}/v1/messages", json={**body, "max_tokens": 10}, headers=AUTH, timeout=30
    )
    assert counted.status_code == created.status_code == 404
    assert counted.json()["error"]["type"] == created.json()["error"]["type"] == "not_found_error"
    assert counted.json()["error"]["message"] == created.json()["error"]["message"]


def test_a_route_the_key_may_not_use_is_a_403(base: str) -> None:
    fenced = {"x-api-key": FENCED_KEY}
    assert count(base, {"messages": HELLO}, fenced).status_code == 403
    assert count(base, {"model": "elsewhere", "messages": HELLO}, fenced).status_code == 200
    # An unknown model's 404 names this key's routes only, as /v1/messages does.
    unknown = count(base, {"model": "nope", "messages": HELLO}, fenced).json()["error"]
    assert unknown["message"].endswith("routes: elsewhere")


def test_a_wrong_method_is_a_405_in_anthropic_shape(base: str) -> None:
    reply = httpx.get(f"{base}{PATH}", headers=AUTH, timeout=30)
    assert reply.status_code == 405
    assert reply.json()["type"] == "error"


async def test_counting_spends_no_rate_limit_and_writes_no_record(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Like /v1/models, counting is not a request to a route: the key's one request a
    minute is still there after counts, and the ledger has only the real request."""
    tight = {"x-api-key": TIGHT_KEY}
    counted = [count(base, {"messages": HELLO}, tight) for _ in range(3)]
    assert [r.status_code for r in counted] == [200, 200, 200]
    body = {"model": "auto", "max_tokens": 10, "messages": HELLO}
    created = httpx.post(f"{base}/v1/messages", json=body, headers=tight, timeout=30)
    assert created.status_code == 200
    assert httpx.post(f"{base}/v1/messages", json=body, headers=tight).status_code == 429
    await wait_for_record(ledger_store, created.headers["x-request-id"])
    for reply in counted:
        assert await ledger_store.get(reply.headers["x-request-id"]) is None
    assert len(fake_openai.requests) == 1


def test_the_anthropic_sdk_counts_through_the_gateway(base: str) -> None:
    with anthropic.Anthropic(base_url=base, api_key=CLIENT_KEY, max_retries=0) as client:
        counted = client.messages.count_tokens(
            model="auto",
            system="Be brief.",
            messages=HELLO,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "auto"},
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        with pytest.raises(anthropic.NotFoundError):
            client.messages.count_tokens(model="nope", messages=HELLO)  # type: ignore[arg-type]
    body = {"system": "Be brief.", "messages": HELLO, "tools": [WEATHER]}
    assert counted.input_tokens == tokens(base, {**body, "tool_choice": {"type": "auto"}}) > 0

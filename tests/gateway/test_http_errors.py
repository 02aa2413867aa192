"""Bad input gets OpenAI-shaped errors with the right status, naming the field, and
leaves the ledger exact. Raw HTTP over loopback, so malformed bodies reach the server."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN_KEY, AUTH, StartGateway, wait_for_record

RESTRICTED_POLICY = """
deployments:
  upstream:
    api_base: ${UPSTREAM_BASE_URL}
    model: fake-model
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {deployments: [upstream]}
  premium: {deployments: [upstream]}
teams:
  small: {allowed_routes: [auto]}
keys:
  limited: {secret: "${GATEWAY_TEST_KEY}", team: small}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  max_body_bytes: 2048
"""


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    return start_gateway(RESTRICTED_POLICY, UPSTREAM_BASE_URL=fake_openai.url).url


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **extra}


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    assert "Traceback" not in response.text
    assert response.headers["x-request-id"]
    return dict(error)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": 5, "messages": []}, "model"),
        ({"model": "auto"}, "messages"),
        ({"model": "auto", "messages": []}, "messages"),
        ({"model": "auto", "messages": ["hi"]}, "messages[0]"),
        ({"model": "auto", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "auto", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (chat(max_tokens="many"), "max_tokens"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(temperature=9), "temperature"),
        (chat(stream="yes"), "stream"),
        (chat(n=True), "n"),
    ],
)
def test_invalid_fields_are_named(base: str, body: dict[str, Any], param: str) -> None:
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
    error = assert_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat(stream=None)),
        ("/v1/chat/completions", chat(stream=None, stream_options=None)),
        ("/v1/chat/completions", chat(stream=False, stream_options=None)),
        ("/v1/completions", {"model": "auto", "prompt": "hi", "stream": None}),
        ("/v1/embeddings", {"model": "auto", "input": "hi", "stream": None}),
    ],
)
def test_null_stream_is_not_streaming(
    base: str, fake_openai: FakeOpenAI, path: str, body: dict[str, Any]
) -> None:
    """OpenAI's `stream` is boolean | null; null answers as false does, in one JSON."""
    response = httpx.post(f"{base}{path}", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["object"] != "chat.completion.chunk"
    assert not fake_openai.requests[-1]["body"].get("stream")


def test_null_stream_options_on_a_stream(base: str) -> None:
    body = chat(stream=True, stream_options=None)
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks and all(c["choices"] for c in chunks)
    assert all(c.get("usage") is None for c in chunks)  # null asks for none, as omitting it


def test_malformed_json_and_non_object(base: str) -> None:
    for content in (b"{not json", b"[1, 2]", b""):
        response = httpx.post(f"{base}/v1/chat/completions", content=content, headers=AUTH)
        assert_error(response, 400)


def test_missing_and_bad_keys(base: str) -> None:
    response = httpx.post(f"{base}/v1/chat/completions", json=chat())
    assert assert_error(response, 401)["code"] == "missing_api_key"
    response = httpx.post(
        f"{base}/v1/chat/completions",
        json=chat(),
        headers={"authorization": "Bearer fake-nope-key"},
    )
    assert assert_error(response, 401)["code"] == "invalid_api_key"
    response = httpx.post(
        f"{base}/v1/chat/completions", json=chat(), headers={"authorization": "Basic abc"}
    )
    assert_error(response, 401)
    response = httpx.get(f"{base}/v1/models")
    assert_error(response, 401)


def test_route_not_allowed_is_403_and_unknown_is_404(base: str) -> None:
    response = httpx.post(f"{base}/v1/chat/completions", json=chat(model="premium"), headers=AUTH)
    assert assert_error(response, 403, "model")["code"] == "route_not_allowed"
    response = httpx.post(f"{base}/v1/chat/completions", json=chat(model="gpt-9"), headers=AUTH)
    error = assert_error(response, 404, "model")
    assert error["code"] == "model_not_found"
    # It names the routes this key may use, not the others' (as /v1/models lists them).
    assert error["message"].endswith("routes: auto") and "premium" not in error["message"]
    models = httpx.get(f"{base}/v1/models", headers=AUTH).json()
    assert [m["id"] for m in models["data"]] == ["auto"]


def test_one_model_follows_the_lists_rules(base: str) -> None:
    listed = httpx.get(f"{base}/v1/models", headers=AUTH).json()["data"]
    response = httpx.get(f"{base}/v1/models/auto", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == listed[0]
    assert set(listed[0]) == {"id", "object", "created", "owned_by"}
    assert httpx.get(f"{base}/v1/models/", headers=AUTH).json()["data"] == listed
    assert_error(httpx.get(f"{base}/v1/models/auto"), 401)
    # Not this key's (premium), unknown, or a name with a slash: all not found, alike.
    for name in ("premium", "gpt-9", "org/gpt-9", "org%2Fgpt-9"):
        response = httpx.get(f"{base}/v1/models/{name}", headers=AUTH)
        assert assert_error(response, 404, "model")["code"] == "model_not_found"
        assert assert_error(response, 404)["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413(base: str) -> None:
    huge = chat(messages=[{"role": "user", "content": "x" * 10_000}])
    response = httpx.post(f"{base}/v1/chat/completions", json=huge, headers=AUTH)
    assert_error(response, 413)

    def chunks() -> Any:  # no content-length: the limit holds while streaming the body in
        yield b'{"model": "auto", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}]}'

    response = httpx.post(f"{base}/v1/chat/completions", content=chunks(), headers=AUTH)
    assert_error(response, 413)


def test_unknown_path_and_method(base: str) -> None:
    assert_error(httpx.get(f"{base}/v1/nothing-here", headers=AUTH), 404)
    assert_error(httpx.get(f"{base}/v1/chat/completions", headers=AUTH), 405)


def test_admin_needs_the_admin_key(base: str) -> None:
    assert_error(httpx.post(f"{base}/admin/reload"), 401)
    assert_error(httpx.post(f"{base}/admin/reload", headers=AUTH), 401)
    ok = httpx.post(f"{base}/admin/reload", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert ok.status_code == 200 and ok.json()["status"] == "reloaded"


async def test_rejected_requests_leave_the_ledger_empty(
    base: str, ledger_store: RedisStore
) -> None:
    httpx.post(f"{base}/v1/chat/completions", json={"model": "auto"}, headers=AUTH)
    httpx.post(f"{base}/v1/chat/completions", json=chat(model="premium"), headers=AUTH)
    httpx.post(f"{base}/v1/chat/completions", json=chat(), headers={"authorization": "Bearer x"})
    ok = httpx.post(f"{base}/v1/chat/completions", json=chat(), headers=AUTH)
    assert ok.status_code == 200
    await wait_for_record(ledger_store, ok.headers["x-request-id"])
    events = await ledger_store.events()
    assert [e.request_id for e in events] == [ok.headers["x-request-id"]]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/models", "/admin/policy"])
def test_get_routes_answer_head_like_get_without_a_body(base: str, path: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if path.startswith("/admin") else AUTH
    got = httpx.get(f"{base}{path}", headers=headers)
    head = httpx.head(f"{base}{path}", headers=headers)
    assert head.status_code == got.status_code == 200
    assert head.content == b"" and head.headers["content-type"] == got.headers["content-type"]


def test_a_wrong_method_is_405_with_allow(base: str) -> None:
    response = httpx.delete(f"{base}/v1/models", headers=AUTH)
    assert response.status_code == 405
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD"}

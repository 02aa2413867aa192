"""Error replies after the gateway's own retries: they name the route and the calls
made, tell the SDKs not to retry on top (theirs would repeat every one of the
gateway's calls), and are logged with the request id for whoever is paged.

Over real sockets: the gateway under uvicorn, the official OpenAI SDK with its default
retries, and a fake upstream that keeps failing."""

from __future__ import annotations

import logging
import socket

import httpx
import openai
import pytest

from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway

POLICY = """
deployments:
  a:
    api_base: ${UPSTREAM_URL}
    model: a-model
    max_retries: ${RETRIES}
    retry_backoff_s: 0.01
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  chat: {strategy: fixed, deployments: [a]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
HI = [{"role": "user", "content": "hi"}]


def gateway(start_gateway: StartGateway, upstream: FakeOpenAI, retries: int) -> str:
    return start_gateway(POLICY, UPSTREAM_URL=upstream.url, RETRIES=str(retries)).url


@pytest.mark.parametrize(("status", "code"), [(500, 502), (429, 429)])
def test_the_sdk_does_not_repeat_the_gateways_retries(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
    status: int,
    code: int,
) -> None:
    """The upstream fails every call: the gateway makes its 3 (1 + 2 retries), then the
    SDK, at its default 2 retries, gives up at once: 3 upstream calls, not 9."""
    base = gateway(start_gateway, fake_openai, retries=2)
    fake_openai.fail(status, times=None, retry_after="0")
    client = openai.OpenAI(base_url=base + "/v1", api_key=CLIENT_KEY)  # default retries
    with caplog.at_level(logging.WARNING), pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(model="chat", messages=HI)  # type: ignore[arg-type]
    client.close()
    response = raised.value.response
    assert response.status_code == code
    assert len(fake_openai.requests) == 3
    assert response.headers["x-should-retry"] == "false"
    assert response.headers["x-cascade-route"] == "chat"
    assert response.headers["x-cascade-attempts"] == "3"
    if code >= 500:  # the request id leads to the log line that says what failed
        request_id = response.headers["x-request-id"]
        assert any(request_id in r.getMessage() for r in caplog.records)


def test_a_single_failed_call_leaves_the_retry_to_the_client(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    """No retry of the gateway's own (max_retries 0): the SDK's is the only one, so it
    is not turned off."""
    base = gateway(start_gateway, fake_openai, retries=0)
    fake_openai.fail(500, times=None)
    body = {"model": "chat", "messages": HI}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 502
    assert "x-should-retry" not in response.headers
    assert (response.headers["x-cascade-route"], response.headers["x-cascade-attempts"]) == (
        "chat",
        "1",
    )


def test_errors_before_any_route_name_none(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    base = gateway(start_gateway, fake_openai, retries=0)
    body = {"model": "no-such-route", "messages": HI}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 404
    assert (
        "x-cascade-route" not in response.headers and "x-cascade-attempts" not in response.headers
    )


def test_an_unreachable_upstreams_address_is_logged_not_told(
    start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Where a deployment lives (host, port, the resolver's words) is the operator's
    business: in the logs, not in a tenant's error."""
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    base = start_gateway(POLICY, UPSTREAM_URL=f"http://{address}/v1", RETRIES="0").url
    body = {"model": "chat", "messages": HI}
    with caplog.at_level(logging.INFO):
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 503
    assert "cannot connect to deployment 'a'" in response.json()["error"]["message"]
    assert address not in response.text
    # In the 5xx line too, which a gateway logging at WARNING alone still writes.
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(address in m and response.headers["x-request-id"] in m for m in warned)

"""Fuzzing every endpoint against the gateway's own OpenAPI document (schemathesis over
hypothesis), through a real gateway on loopback, a fake upstream and real Redis: no
reply may be a 5xx but the documented upstream 502/503/504, every 4xx and 5xx is in
OpenAI's error shape, and replies match the document. Generated bodies (valid and
not), headers (keys, hostile Authorization values, X-Forwarded-For, huge values) and
query strings ride on a key with a budget and rate limits, so the limiter's Redis
scripts see them too.

    pytest tests/gateway/test_fuzz_api.py                        # ~2,300 cases, ~70 s
    CASCADE_FUZZ_LONG=1 pytest tests/gateway/test_fuzz_api.py    # ~30,000 cases
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from schemathesis import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import Route

from gateway.http.app import create_app
from gateway.http.openapi_schemas import MESSAGES
from gateway.http.validation import CHAT_ROLES
from gateway.settings import Settings
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway import fuzzing
from tests.gateway.conftest import StartGateway
from tests.gateway.server import GatewayServer

POLICY = """
deployments:
  cheap:
    api_base: ${FAKE_URL}
    model: small-model
    tier: local
    price: {input_per_mtok: 1, output_per_mtok: 2}
    max_retries: 1
    retry_backoff_s: 0.01
  premium:
    api_base: ${FAKE_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 30}
    max_retries: 1
    retry_backoff_s: 0.01
routes:
  auto: {strategy: fallback, deployments: [premium, cheap]}
  careful: {strategy: cascade, deployments: [cheap, premium]}
teams:
  research:
    rate_limit: {requests_per_minute: 1000000, tokens_per_minute: 1000000000000}
  tight: {allowed_routes: [auto]}
  anon: {allowed_routes: [auto]}
keys:
  k:
    secret: "${GATEWAY_TEST_KEY}"
    team: research
    rate_limit: {requests_per_minute: 1000000, tokens_per_minute: 1000000000000}
  tight:
    secret: "${TIGHT_KEY}"
    team: tight
    rate_limit: {requests_per_minute: 1, tokens_per_minute: 100}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
metrics_keys: ["${METRICS_KEY}"]
auth: {anonymous_team: anon}
budgets:
  - {scope: key, name: k, period: day, limit_usd: 1000}
  - {scope: team, name: research, period: month, limit_usd: 10000, soft_limit_usd: 5000,
     downgrade_tier: local}
  - {scope: team, name: tight, period: day, limit_usd: 0.0001}
gateway:
  request_timeout_s: 10
  # The fake upstream fails on some bodies it is passed (malformed tools): eject a
  # deployment only briefly, so the proxy behind it stays under test.
  circuit_breaker: {failure_threshold: 20, cooldown_s: 1}
  trusted_proxies: ["127.0.0.0/8"]  # X-Forwarded-For from the test is read, not obeyed
"""
pytestmark = pytest.mark.timeout(fuzzing.TIMEOUT_S)
CHECKS = [
    fuzzing.no_server_error,
    fuzzing.openai_error_shape,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture
def gateway(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> Iterator[GatewayServer]:
    yield start_gateway(
        POLICY,
        FAKE_URL=fake_openai.url,
        TIGHT_KEY=fuzzing.TIGHT_KEY,
        FINANCE_KEY=fuzzing.FINANCE_KEY,
        METRICS_KEY=fuzzing.METRICS_KEY,
    )


def test_the_document_covers_every_route() -> None:
    app = create_app(Settings.model_construct())
    document = app.openapi()
    routes = {
        (method.lower(), re.sub(r"{(\w+):\w+}", r"{\1}", route.path))
        for route in app.routes
        if isinstance(route, Route) and route.path != "/openapi.json"
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert documented == routes
    assert app.openapi() is document  # built once
    assert document["paths"]["/admin/reload"]["post"]["operationId"] == (
        "reload_policy_admin_reload_post"  # the id FastAPI gave it, kept for generated SDKs
    )


def test_the_document_is_valid_json_schema_with_every_reference_resolved() -> None:
    document = create_app(Settings.model_construct()).openapi()
    for schema in document["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    refs = re.findall(r'"\$ref": "#/components/(\w+)/(\w+)"', json.dumps(document))
    assert refs
    assert all(name in document["components"][kind] for kind, name in refs)


def test_the_documented_roles_are_the_ones_the_gateway_accepts() -> None:
    assert set(MESSAGES) == CHAT_ROLES


async def test_the_document_is_served_when_enabled() -> None:
    app = create_app(Settings.model_construct(openapi=True))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        response = await client.get("/openapi.json")
    assert response.json() == json.loads(json.dumps(app.openapi()))


async def test_a_wrong_method_is_told_the_allowed_ones() -> None:
    """RFC 9110: a 405 lists the allowed methods in `Allow`."""
    app = create_app(Settings.model_construct())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client:
        response = await client.delete("/v1/chat/completions")
    assert response.status_code == 405
    assert response.headers.get("allow") == "POST"


# The document, read in-process from an app that is never started (settings built without
# reading the environment). Reproducers show the (fake) keys: a failure with a hostile
# Authorization needs them. The coverage phase's valid edge cases mostly reach the fake
# upstream: only the long run sends them.
CONFIG = schemathesis.Config.from_dict(
    {
        "output": {"sanitization": {"enabled": False}},
        "phases": {"coverage": {"generation": {"mode": "all" if fuzzing.LONG else "negative"}}},
    }
)
schema = schemathesis.openapi.from_dict(
    create_app(Settings.model_construct()).openapi(), config=CONFIG
)


@schema.parametrize()
@schema.given(data=st.data())
@fuzzing.PROFILE
def test_every_endpoint_keeps_the_contract(
    case: Case[Any], data: st.DataObject, gateway: GatewayServer, fake_openai: FakeOpenAI
) -> None:
    """Generated cases, valid and not, with odd headers, keys and query strings."""
    fake_openai.requests.clear()  # the fake logs every request; thousands add up
    data.draw(fuzzing.extras(case.operation.path), label="extras").apply(case)
    case.call_and_validate(base_url=gateway.url, checks=CHECKS, timeout=30)


@schema.parametrize()
@settings(fuzzing.PROFILE, phases=[Phase.explicit])
def test_every_endpoint_keeps_the_contract_at_its_edges(
    case: Case[Any], gateway: GatewayServer, fake_openai: FakeOpenAI
) -> None:
    """Schemathesis' coverage phase: each bound, missing field, wrong type and method
    the document implies, once, with the right key."""
    fake_openai.requests.clear()
    fuzzing.Extras.proper(case).apply(case)
    case.call_and_validate(base_url=gateway.url, checks=CHECKS, timeout=30)


@pytest.fixture
def client(gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"],
)
@given(body=fuzzing.RAW_BODIES, data=st.data())
@fuzzing.PROFILE
def test_any_body_is_answered_within_the_contract(
    path: str, body: bytes, data: st.DataObject, client: httpx.Client, fake_openai: FakeOpenAI
) -> None:
    """Bodies beyond the document: any bytes, any JSON, edge values in every field the
    gateway reads, and arrays nested past any parser's depth limit."""
    fake_openai.requests.clear()
    extras = data.draw(fuzzing.extras(path), label="extras")
    response = client.post(path, content=body, headers=extras.raw_headers(), params=extras.query)
    assert response.status_code < 500 or response.status_code in fuzzing.UPSTREAM_STATUSES, (
        response.status_code,
        response.text[:300],
    )
    if response.status_code >= 400:
        problem = fuzzing.error_shape_problem(response.content, path)
        assert problem is None, (problem, response.content[:300])

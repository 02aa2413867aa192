"""What ops see and do: health, readiness, metrics, and policy hot reload."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import httpx
import pytest

from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN, AUTH, StartGateway, metric
from tests.support import eventually

POLICY = """
deployments:
  upstream:
    api_base: ${UPSTREAM_BASE_URL}
    model: MODEL_NAME
    price: {input_per_mtok: 1, output_per_mtok: 2}
  needs-key:
    api_base: https://api.openai.com/v1
    api_key: ${SOME_UNSET_KEY}
    requires_key: true
    model: gpt-4o
routes:
  auto: {deployments: [upstream], reference_model: gpt-4o}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  reload_interval_s: 0.1
"""


def chat(base: str) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)


def test_health_readiness_and_metrics(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> None:
    base = start_gateway(POLICY.replace("MODEL_NAME", "m1"), UPSTREAM_BASE_URL=fake_openai.url).url
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{base}/readyz").json()
    assert ready["status"] == "ready"
    assert ready["available_deployments"] == ["upstream"]
    assert chat(base).status_code == 200
    httpx.post(f"{base}/v1/chat/completions", json={"model": "auto"}, headers=AUTH)
    httpx.post(f"{base}/v1/chat/completions", json={"model": "x" * 50}, headers=AUTH)

    text = httpx.get(f"{base}/metrics").text
    for name in (
        'cascade_requests_total{deployment="upstream",route="auto",status="200",'
        'team="default"} 1.0',
        "cascade_request_duration_seconds_bucket",
        "cascade_tokens_total",
        "cascade_cost_usd_total",
        "cascade_reference_cost_usd_total",
        'cascade_errors_total{route="auto",type="invalid_request_error"} 1.0',
        'cascade_errors_total{route="-",type="invalid_request_error"} 1.0',  # unknown: no label
        'cascade_deployment_available{deployment="needs-key",tier="default"} 0.0',
        'cascade_upstream_attempts_total{deployment="upstream",outcome="ok"} 1.0',
    ):
        assert name in text, name


def test_admin_policy_reports_unavailable_deployments(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.http.services")
    base = start_gateway(POLICY.replace("MODEL_NAME", "m1"), UPSTREAM_BASE_URL=fake_openai.url).url
    # The log says so at load: a request that meets it only gets a 503.
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.http.services"]
    assert any("deployment 'needs-key'" in m and "SOME_UNSET_KEY" in m for m in logged), logged
    status = httpx.get(f"{base}/admin/policy", headers=ADMIN).json()
    assert status["deployments"]["upstream"]["available"] is True
    reason = status["deployments"]["needs-key"]["unavailable_reason"]
    assert "SOME_UNSET_KEY" in reason
    assert status["deployments"]["needs-key"]["price_source"] == "litellm:gpt-4o"


def test_file_edit_is_picked_up_and_bad_edit_keeps_last_good(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(POLICY.replace("MODEL_NAME", "m1"))
    base = start_gateway(path, UPSTREAM_BASE_URL=fake_openai.url).url
    assert chat(base).status_code == 200
    assert fake_openai.requests[-1]["body"]["model"] == "m1"

    path.write_text(POLICY.replace("MODEL_NAME", "m2"))  # picked up without restart

    def serves_m2() -> bool:
        chat(base)
        return bool(fake_openai.requests[-1]["body"]["model"] == "m2")

    eventually(serves_m2)

    path.write_text(POLICY.replace("MODEL_NAME", "m3").replace("timeout_s", "x") + "\nbogus: 1\n")
    rejections = 'cascade_policy_reloads_total{result="rejected"}'
    eventually(lambda: metric(base, rejections) >= 1, 5, "the poller to reject it")
    assert chat(base).status_code == 200
    assert fake_openai.requests[-1]["body"]["model"] == "m2"

    rejected = httpx.post(f"{base}/admin/reload", headers=ADMIN)
    assert rejected.status_code == 400
    message = rejected.json()["error"]["message"]
    assert "live.yaml:" in message and "bogus" in message
    assert chat(base).status_code == 200  # last good policy still serving
    assert fake_openai.requests[-1]["body"]["model"] == "m2"

    path.write_text(POLICY.replace("MODEL_NAME", "m4"))
    assert httpx.post(f"{base}/admin/reload", headers=ADMIN).status_code == 200
    assert chat(base).status_code == 200
    assert fake_openai.requests[-1]["body"]["model"] == "m4"


def test_reload_under_load_loses_no_request(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(POLICY.replace("MODEL_NAME", "m0"))
    base = start_gateway(path, UPSTREAM_BASE_URL=fake_openai.url).url
    fake_openai.delay_s = 0.02
    statuses = []
    for i in range(40):
        if i % 10 == 5:
            path.write_text(POLICY.replace("MODEL_NAME", f"m{i}"))
            httpx.post(f"{base}/admin/reload", headers=ADMIN)
        statuses.append(chat(base).status_code)
    assert statuses == [200] * 40


def test_a_bad_edit_found_by_the_poller_is_reported(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    path = tmp_path / "live.yaml"
    path.write_text(POLICY.replace("MODEL_NAME", "m1"))
    base = start_gateway(path, UPSTREAM_BASE_URL=fake_openai.url).url
    path.write_text(POLICY.replace("MODEL_NAME", "m1") + "\nbogus: 1\n")

    def reported() -> bool:
        status = httpx.get(f"{base}/admin/policy", headers=ADMIN).json()
        return bool(status["last_reload_error"])

    eventually(reported)
    text = httpx.get(f"{base}/metrics").text
    assert 'cascade_policy_reloads_total{result="rejected"} 1.0' in text
    assert "cascade_policy_edit_rejected 1.0" in text  # for as long as the file is bad
    assert chat(base).status_code == 200
    path.write_text(POLICY.replace("MODEL_NAME", "m1"))  # the edit undone
    eventually(lambda: not reported())
    assert "cascade_policy_edit_rejected 0.0" in httpx.get(f"{base}/metrics").text


RICH = """
deployments:
  upstream:
    api_base: ${UPSTREAM_BASE_URL}
    model: m
    tier: TIER
    price: {input_per_mtok: 1, output_per_mtok: 2}
EXTRA
routes:
  auto: {deployments: [upstream], reference_model: gpt-4o}
ROUTE
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  reload_interval_s: 0.1
BUDGETS
"""
OLD = """  old:
    api_base: ${UPSTREAM_BASE_URL}
    model: m-old
    price: {input_per_mtok: 1, output_per_mtok: 2}"""
TIMED = "  timed: {deployments: [old], reference_model: gpt-4o, sla: {timeout_ms: 5000}}"
BUDGET = "budgets:\n  - {scope: key, name: k, period: day, limit_usd: 5}"


def test_a_reload_prunes_the_gauges_of_what_it_removed(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """A gauge left behind by a reload reads as live: a deleted deployment, a tier it
    left, an SLA or a budget dropped must leave /metrics (and their alerts) with it."""
    path = tmp_path / "live.yaml"
    before = RICH.replace("TIER", "cheap").replace("EXTRA", OLD).replace("ROUTE", TIMED)
    path.write_text(before.replace("BUDGETS", BUDGET))
    base = start_gateway(path, UPSTREAM_BASE_URL=fake_openai.url).url
    assert chat(base).status_code == 200
    gone = [
        'cascade_deployment_available{deployment="old",tier="default"}',
        'cascade_deployment_available{deployment="upstream",tier="cheap"}',
        'cascade_breaker_state{deployment="old"}',
        'cascade_sla_target_seconds{kind="timeout",route="timed"}',
        'cascade_budget_remaining_usd{name="k",period="day",scope="key"}',
    ]
    eventually(lambda: all(series in httpx.get(f"{base}/metrics").text for series in gone))

    after = RICH.replace("TIER", "premium").replace("EXTRA", "").replace("ROUTE", "")
    path.write_text(after.replace("BUDGETS", ""))
    eventually(lambda: "timed" not in httpx.get(f"{base}/admin/policy", headers=ADMIN).text)
    text = httpx.get(f"{base}/metrics").text
    assert [series for series in gone if series in text] == []
    assert 'cascade_deployment_available{deployment="upstream",tier="premium"} 1.0' in text
    assert 'cascade_breaker_state{deployment="upstream"} 0.0' in text


def test_an_unreachable_redis_shows_before_any_request(start_gateway: StartGateway) -> None:
    """Readiness and the degraded gauges tell ops at once, not when traffic meets it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"  # bound, not listening
        limited = POLICY + BUDGET  # the limits store is watched while there are limits
        base = start_gateway(limited, redis=closed, UPSTREAM_BASE_URL="http://127.0.0.1:9/v1").url

        def degraded() -> bool:
            text = httpx.get(f"{base}/metrics").text
            return "cascade_ledger_degraded 1.0" in text and "cascade_limits_degraded 1.0" in text

        eventually(degraded)
        assert httpx.get(f"{base}/readyz").json()["ledger"] == "degraded"

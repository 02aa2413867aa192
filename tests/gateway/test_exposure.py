"""What the gateway shows beyond its API: /metrics, open unless the policy lists
`metrics_keys`, and /openapi.json, served only with CASCADE_OPENAPI."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.cli import main
from gateway.http.app import create_app
from gateway.settings import Settings
from tests.gateway.conftest import ADMIN_KEY, CLIENT_KEY, StartGateway

METRICS_KEY = "fake-metrics-key"
POLICY = """
deployments:
  upstream:
    api_base: http://127.0.0.1:9/v1
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {deployments: [upstream]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
"""
GUARDED = POLICY + 'metrics_keys: ["${GATEWAY_METRICS_KEY}"]\n'


def scrape(base: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/metrics", headers=headers)


def test_metrics_are_open_without_metrics_keys(start_gateway: StartGateway) -> None:
    """As before: a Prometheus that scrapes without credentials keeps working."""
    reply = scrape(start_gateway(POLICY).url)
    assert reply.status_code == 200
    assert "cascade_requests_total" in reply.text


def test_metrics_keys_guard_metrics(start_gateway: StartGateway) -> None:
    base = start_gateway(GUARDED, GATEWAY_METRICS_KEY=METRICS_KEY).url
    missing = scrape(base)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert missing.json()["error"]["type"] == "authentication_error"
    for wrong in ("fake-wrong-key", CLIENT_KEY):  # a client key is no metrics key
        refused = scrape(base, wrong)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
    for key in (METRICS_KEY, ADMIN_KEY):
        reply = scrape(base, key)
        assert reply.status_code == 200
        assert "cascade_requests_total" in reply.text


def test_metrics_keys_all_unset_leave_metrics_to_admin_keys(start_gateway: StartGateway) -> None:
    """Listing `${GATEWAY_METRICS_KEY}` asked for a guard: its variable unset does not
    open /metrics to everyone."""
    base = start_gateway(GUARDED).url
    assert scrape(base).status_code == 401
    assert scrape(base, ADMIN_KEY).status_code == 200


def test_policy_check_notes_metrics_keys_all_unset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GUARDED)
    assert main(["policy", "check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note: no metrics key is set: /metrics answers admin keys only, others 401" in out


def test_openapi_is_not_served_by_default(start_gateway: StartGateway) -> None:
    reply = httpx.get(f"{start_gateway(POLICY).url}/openapi.json")
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "not_found"
    assert httpx.get(f"{start_gateway(POLICY).url}/docs").status_code == 404


def test_openapi_is_served_when_enabled(start_gateway: StartGateway) -> None:
    reply = httpx.get(f"{start_gateway(POLICY, CASCADE_OPENAPI='true').url}/openapi.json")
    assert reply.status_code == 200
    assert "/metrics" in reply.json()["paths"]


def test_the_schema_is_built_in_process_either_way() -> None:
    """`app.openapi()` does not depend on the URL being served (tools that build the app
    in-process, such as a schema fuzzer, read it there)."""
    for enabled in (False, True):
        app = create_app(Settings(openapi=enabled))
        assert "/metrics" in app.openapi()["paths"]

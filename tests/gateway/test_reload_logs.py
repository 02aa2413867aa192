"""A hot reload logs what changed, once: never the standing warnings again."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN, StartGateway

POLICY = """
deployments:
  upstream:
    api_base: ${UPSTREAM_BASE_URL}
    model: m1
    price: {input_per_mtok: 1, output_per_mtok: 2}
  needs-key:
    api_base: https://api.openai.com/v1
    api_key: ${RELOAD_TEST_UNSET_KEY}
    requires_key: true
    model: gpt-4o
  unpriced:
    api_base: ${UPSTREAM_BASE_URL}
    model: reload-test-model-with-no-price
routes:
  auto: {deployments: [upstream]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
  k2: {secret: "${GATEWAY_TEST_KEY}-2"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  reload_interval_s: 60
"""


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "live.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI, policy: Path) -> str:
    return start_gateway(policy, UPSTREAM_BASE_URL=fake_openai.url).url


def reload_logs(base: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The gateway's log lines of one /admin/reload, at INFO and above."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert httpx.post(f"{base}/admin/reload", headers=ADMIN).status_code == 200
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(("gateway.", "policies.")) and r.levelno >= logging.INFO
    ]


def changes(logged: list[str]) -> list[str]:
    return [m for m in logged if m.startswith("policy change: ")]


def test_the_first_load_logs_the_standing_warning(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    policy: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.http.services")
    start_gateway(policy, UPSTREAM_BASE_URL=fake_openai.url)
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.http.services"]
    assert [m for m in logged if "'needs-key' is unavailable" in m], logged


def test_reloading_the_same_policy_logs_nothing(
    base: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert reload_logs(base, caplog) == []
    assert "unavailable" not in caplog.text


def test_an_env_var_now_set_logs_one_line(
    base: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELOAD_TEST_UNSET_KEY", "fake-now-set-secret")
    logged = reload_logs(base, caplog)
    assert changes(logged) == [
        "policy change: deployment 'needs-key' became available (api_key changed)"
    ]
    assert "fake-now-set-secret" not in caplog.text
    status = httpx.get(f"{base}/admin/policy", headers=ADMIN).json()
    assert status["deployments"]["needs-key"]["available"] is True


def test_an_added_route_and_a_removed_key_log_a_line_each(
    base: str, policy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy.write_text(
        POLICY.replace('  k2: {secret: "${GATEWAY_TEST_KEY}-2"}\n', "").replace(
            "  auto: {deployments: [upstream]}\n",
            "  auto: {deployments: [upstream]}\n  fast: {deployments: [upstream]}\n",
        )
    )
    logged = reload_logs(base, caplog)
    assert changes(logged) == [
        "policy change: route 'fast' added",
        "policy change: key 'k2' removed",
    ]
    summary = [m for m in logged if m.startswith("policy reloaded from ")]
    assert len(summary) == 1 and summary[0].endswith(": 2 changes, 0 new warnings"), logged
    assert "unavailable" not in caplog.text


def test_a_new_warning_is_logged_once(
    base: str, policy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    extra = """\
  extra:
    provider: anthropic
    model: claude
    price: {input_per_mtok: 1, output_per_mtok: 1}
    api_key: ${RELOAD_TEST_EXTRA}
"""
    policy.write_text(POLICY.replace("routes:\n", extra + "routes:\n"))
    logged = reload_logs(base, caplog)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "policy change: deployment 'extra' is unavailable until configured: "
        "api_key is not set (RELOAD_TEST_EXTRA unset)"
    ], logged
    assert changes(logged)[0] == "policy change: deployment 'extra' added"
    assert reload_logs(base, caplog) == []  # it stands now: not said again


def test_a_warning_of_the_new_runtime_is_counted_in_the_summary_and_follows_it(
    base: str, policy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deployment added without a price: its warning comes from building the runtime,
    not from comparing the policies, and the summary counts it all the same."""
    policy.write_text(
        POLICY.replace(
            "routes:\n",
            "  unpriced2:\n    api_base: ${UPSTREAM_BASE_URL}\n"
            "    model: reload-test-another-model-with-no-price\nroutes:\n",
        )
    )
    logged = reload_logs(base, caplog)
    summary = [i for i, m in enumerate(logged) if m.startswith("policy reloaded from ")]
    assert len(summary) == 1 and logged[summary[0]].endswith(": 1 changes, 1 new warnings")
    unpriced = [i for i, m in enumerate(logged) if "'unpriced2'" in m and "unpriced" in m]
    assert len(unpriced) == 2 and summary[0] < min(unpriced), logged  # added, unpriced

"""An engine `cascade-gateway serve` started, still loading, is warming, not failing:
requests sent from the first second wait for it (or go to another deployment of the
route) and its breaker never opens; a crash after it was ready still trips the breaker.

Over real sockets: the autostart supervisor (`local_engine.autostart.start_engines`)
runs the vLLM stand-in, which keeps its port closed while it "loads", and the gateway
serves on loopback with the run directory `serve` would give it."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from local_engine.autostart import start_engines, stop_engines
from local_engine.errors import EngineStateError
from local_engine.state import read_record
from policies import load_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN_KEY, StartGateway
from tests.local_engine.stand_in import fake_vllm_executable, free_port
from tests.support import eventually

LOAD_S = 3.0  # the stand-in's "model load"
CHAT = {"messages": [{"role": "user", "content": "hello"}]}

POLICY = """
engines:
  local:
    model: fake-model
    executable: {executable}
    port: {port}
    autostart: true
    extra_args: ["--load-seconds", "{load_s}"]
    stop_timeout_s: 2
    restart_backoff_s: 0.2
    max_restarts: {max_restarts}
deployments:
  local:
    provider: openai
    engine: local
    model: fake-model
    tier: local
    max_retries: 0
  spare:
    provider: openai
    api_base: {spare_url}
    model: gpt-4o-mini
    tier: paid
    max_retries: 0
routes:
  auto:
    strategy: fallback
    deployments: [local]
  spill:
    strategy: fallback
    deployments: [local, spare]
  quick:
    strategy: fallback
    deployments: [local]
    sla:
      timeout_ms: 500
gateway:
  request_timeout_s: 30
  circuit_breaker:
    failure_threshold: 2
    cooldown_s: 30
teams:
  default:
    allowed_routes: ["*"]
auth:
  anonymous_team: default
admin_keys:
  - ${{GATEWAY_ADMIN_KEY}}
"""


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    return fake_vllm_executable(tmp_path)


@pytest.fixture
def supervisors() -> Iterator[list[subprocess.Popen[bytes] | None]]:
    started: list[subprocess.Popen[bytes] | None] = []
    yield started
    for supervisor in started:
        stop_engines(supervisor)


def write_policy(
    tmp_path: Path, executable: Path, spare: FakeOpenAI, max_restarts: str = "null"
) -> tuple[Path, int]:
    port = free_port()
    path = tmp_path / "policy.yaml"
    text = POLICY.format(
        executable=executable,
        port=port,
        load_s=LOAD_S,
        max_restarts=max_restarts,
        spare_url=spare.url,
    )
    path.write_text(text)
    return path, port


def serve(
    tmp_path: Path,
    policy: Path,
    start_gateway: StartGateway,
    supervisors: list[subprocess.Popen[bytes] | None],
) -> str:
    """What `cascade-gateway serve` does: start the autostart engines' supervisor, then
    the gateway (whose spool is in `tmp_path`, so its engines' run dir is too)."""
    engines = load_policy(policy).policy.engines
    supervisors.append(start_engines(policy, engines, tmp_path / "engines"))
    return start_gateway(policy, CASCADE_LOG_DECISIONS="true").url


def engine_state(tmp_path: Path) -> str | None:
    try:
        return read_record(tmp_path / "engines" / "local.json").state
    except EngineStateError:
        return None


async def send(
    client: httpx.AsyncClient, route: str, delay_s: float
) -> tuple[float, float, httpx.Response]:
    await asyncio.sleep(delay_s)
    sent = time.monotonic()
    response = await client.post("/v1/chat/completions", json={"model": route, **CHAT})
    return sent, time.monotonic(), response


async def test_requests_from_the_first_second_wait_for_the_engine_or_go_elsewhere(
    tmp_path: Path,
    fake_vllm: Path,
    fake_openai: FakeOpenAI,
    start_gateway: StartGateway,
    supervisors: list[subprocess.Popen[bytes] | None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    policy, _ = write_policy(tmp_path, fake_vllm, fake_openai)
    started = time.monotonic()
    url = serve(tmp_path, policy, start_gateway, supervisors)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        health = (await client.get("/admin/policy", headers=admin)).json()
        assert health["deployments"]["local"]["health"]["warming"] is True
        assert (
            'cascade_deployment_warming{deployment="local"} 1.0'
            in (await client.get("/metrics")).text
        )
        # Every 0.2 s over the load and a second past it; one with a short SLA timeout.
        sends = [send(client, "auto", 0.2 * i) for i in range(int(LOAD_S / 0.2) + 5)]
        spilled = [send(client, "spill", 0.5 * i) for i in range(4)]
        quick = send(client, "quick", 0.1)
        results = await asyncio.gather(*sends, *spilled, quick)
        after = await client.post("/v1/chat/completions", json={"model": "auto", **CHAT})
        health = (await client.get("/admin/policy", headers=admin)).json()
        metrics = (await client.get("/metrics")).text

    auto, spill, (_, quick_done, quick_reply) = (
        results[: len(sends)],
        results[len(sends) : -1],
        results[-1],
    )
    for _, _, response in auto:
        assert response.status_code == 200, response.text  # no breaker 503, no 502
        assert response.headers["x-cascade-deployment"] == "local"
    ready_at = max(done for _, done, _ in auto[:3])  # the first ones waited for the load
    assert ready_at - started >= LOAD_S - 0.5
    for sent, done, response in spill:  # the other deployment answers without waiting
        assert response.status_code == 200, response.text
        if done < ready_at - 0.5:
            assert response.headers["x-cascade-deployment"] == "spare"
            assert done - sent < 1.0
    assert quick_reply.status_code == 504 and quick_done < ready_at
    error = quick_reply.json()["error"]
    assert error["code"] == "engine_loading" and "still loading" in error["message"]
    assert after.status_code == 200
    assert engine_state(tmp_path) in ("starting", "ready")
    assert health["deployments"]["local"]["health"]["warming"] is False
    assert health["deployments"]["local"]["health"]["breaker"] == "closed"
    assert 'cascade_deployment_warming{deployment="local"} 0.0' in metrics
    assert 'cascade_breaker_state{deployment="local"} 0.0' in metrics
    assert any(
        "for deployment 'local' (engine 'local') to load its model" in r.getMessage()
        for r in caplog.records
    )
    assert not any("circuit breaker" in r.getMessage() for r in caplog.records)


async def test_a_crash_after_readiness_still_trips_the_breaker(
    tmp_path: Path,
    fake_vllm: Path,
    fake_openai: FakeOpenAI,
    start_gateway: StartGateway,
    supervisors: list[subprocess.Popen[bytes] | None],
) -> None:
    policy, port = write_policy(tmp_path, fake_vllm, fake_openai, max_restarts="0")
    url = serve(tmp_path, policy, start_gateway, supervisors)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        first = await client.post("/v1/chat/completions", json={"model": "auto", **CHAT})
        assert first.status_code == 200, first.text
        eventually(lambda: engine_state(tmp_path) == "ready", 10, "the engine to be ready")
        with pytest.raises(httpx.TransportError):  # it exits without answering
            await client.post(f"http://127.0.0.1:{port}/crash")
        eventually(lambda: engine_state(tmp_path) == "failed", 10, "the supervisor to give up")
        replies = [
            await client.post("/v1/chat/completions", json={"model": "auto", **CHAT})
            for _ in range(3)
        ]
    assert [r.status_code for r in replies[:2]] == [503, 503]  # refused: no deployment took it
    assert replies[2].status_code == 503
    assert "ejected by its circuit breaker" in replies[2].json()["error"]["message"]

"""Latency SLAs through the real gateway over loopback: hedging, load-aware selection
from vLLM's `/metrics`, shedding, circuit breakers shared through Redis, priority.
Two fake OpenAI-compatible engines serve one tier; real Redis holds the ledger."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.billing.pricing import TokenPrice
from gateway.ledger import RedisStore, SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime, RouteSla
from gateway.upstreams.base import UpstreamTarget
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import ADMIN, AUTH, StartGateway, metric, wait_for_record
from tests.gateway.server import GatewayServer
from tests.support import eventually

POLICY = """
deployments:
  a:
    api_base: ${A_URL}
    model: a-model
    tier: gpu
    max_retries: 0
    timeout_s: 10
    scrape_metrics: true
    price: {input_per_mtok: 1, output_per_mtok: 2}
  b:
    api_base: ${B_URL}
    model: b-model
    tier: gpu
    max_retries: 0
    timeout_s: 10
    scrape_metrics: true
    priority_scheduling: true
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  chat:
    strategy: fallback
    deployments: [a, b]
    sla:
      ttft_ms: ${TTFT_MS:-400}
      p99_ms: 2000
      hedge_after_ms: ${HEDGE_MS:-150}
      load_aware: ${LOAD_AWARE:-true}
      on_miss: ${ON_MISS:-degrade}
      timeout_ms: ${TIMEOUT_MS:-5000}
  batch:
    strategy: fallback
    deployments: [b]
    sla: {priority: batch}
  plain: {strategy: fallback, deployments: [a, b]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway:
  load_scrape_interval_s: ${SCRAPE_S:-0.1}
  circuit_breaker:
    failure_threshold: 2
    cooldown_s: ${COOLDOWN_S:-30}
"""


@pytest.fixture
def engine_a() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def engine_b() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def start_server(start_gateway: StartGateway, engine_a: FakeOpenAI, engine_b: FakeOpenAI) -> Any:
    def run(**env: str) -> GatewayServer:
        urls = {"A_URL": engine_a.url, "B_URL": engine_b.url}
        return start_gateway(POLICY, **{**urls, **env})

    return run


@pytest.fixture
def start(start_server: Any) -> Any:
    return lambda **env: start_server(**env).url


def chat(base: str, model: str = "chat", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def chat_requests(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for r in fake.requests if r["path"].endswith("/chat/completions")]


def breaker_state(base: str) -> float:
    """a's breaker on /metrics: 0 closed, 1 half-open, 2 open."""
    return metric(base, 'cascade_breaker_state{deployment="a"}')


def scraped(base: str, **waiting: float) -> None:
    """Wait until the load scrapes have read each deployment's `waiting` queue."""

    def seen() -> bool:
        text = httpx.get(f"{base}/metrics").text
        samples = (
            f'cascade_engine_requests{{deployment="{d}",state="waiting"}} {float(n)}'
            for d, n in waiting.items()
        )
        return all(sample in text.splitlines() for sample in samples)

    eventually(seen, 5, f"scrapes of {waiting}")


async def test_a_late_first_token_is_hedged_and_both_attempts_are_priced(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start(LOAD_AWARE="false")
    engine_a.delay_s = 2.0
    began = time.monotonic()
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        headers=AUTH,
        timeout=30,
    ) as response:
        body = b"".join(response.iter_bytes())
        headers = response.headers
    assert time.monotonic() - began < 1.5  # did not wait for engine a
    assert headers["x-cascade-deployment"] == "b"
    assert body.endswith(b"data: [DONE]\n\n")
    request_id = headers["x-request-id"]
    winner = await wait_for_record(ledger_store, request_id)
    loser = await wait_for_record(ledger_store, f"{request_id}:h1")
    assert (winner.deployment, winner.status) == ("b", "ok")
    assert (loser.deployment, loser.status) == ("a", "partial")
    assert loser.prompt_tokens > 0 and loser.cost_nanos > 0  # its prompt was sent: priced
    assert metric(base, 'cascade_hedges_total{outcome="fired",route="chat"}') == 1
    assert metric(base, 'cascade_hedges_total{outcome="won",route="chat"}') == 1


async def test_non_streaming_requests_are_hedged_too(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI, ledger_store: RedisStore
) -> None:
    base = start(LOAD_AWARE="false")
    engine_a.delay_s = 2.0
    response = chat(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "b"
    request_id = response.headers["x-request-id"]
    winner = await wait_for_record(ledger_store, request_id)
    loser = await wait_for_record(ledger_store, f"{request_id}:h1")
    assert loser.deployment == "a" and loser.cost_nanos > 0
    # The reply's cost is what the request paid: the losing hedge's prompt too.
    paid = winner.cost_nanos + loser.cost_nanos
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(paid / 1e9)
    assert loser.reference_cost_nanos == 0  # one request, one counterfactual


def test_no_hedge_when_the_first_token_is_on_time(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    base = start(LOAD_AWARE="false")
    for _ in range(3):
        assert chat(base).headers["x-cascade-deployment"] == "a"
    assert chat_requests(engine_b) == []
    assert metric(base, 'cascade_sla_requests_total{outcome="met",route="chat"}') == 3
    # The targets, for alert rules to compare the latency histograms with.
    assert metric(base, 'cascade_sla_target_seconds{kind="ttft",route="chat"}') == 0.4
    assert metric(base, 'cascade_sla_target_seconds{kind="p99",route="chat"}') == 2.0


def test_an_engine_with_a_long_queue_is_skipped(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    engine_a.engine_load = (8, 200, 0.99)  # vLLM's /metrics: 8 running, 200 waiting, KV full
    base = start(HEDGE_MS="5000")
    scraped(base, a=200)
    for _ in range(3):
        assert chat(base).headers["x-cascade-deployment"] == "b"
    assert chat_requests(engine_a) == []
    assert metric(base, 'cascade_engine_requests{deployment="a",state="waiting"}') == 200
    health = httpx.get(f"{base}/admin/policy", headers=ADMIN).json()["deployments"]["a"]["health"]
    assert health["breaker"] == "closed" and health["engine"]["waiting"] == 200
    assert health["predicted_ttft_ms"] > 400 and "200 waiting" in health["prediction"]


def test_the_per_response_load_report_is_read(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    """vLLM's `endpoint-load-metrics` header, asked for on every request to an engine,
    updates its load before the next scrape."""
    base = start(HEDGE_MS="5000", SCRAPE_S="60")
    scraped(base, a=0)  # the first scrape saw idle engines; the next one is a minute away
    engine_a.engine_load = (8, 200, 0.99)
    assert chat(base).headers["x-cascade-deployment"] == "a"  # its reply reports the queue
    assert chat_requests(engine_a)[0]["headers"]["endpoint-load-metrics-format"] == "text"
    assert chat(base).headers["x-cascade-deployment"] == "b"


def test_when_no_engine_can_meet_the_sla_shed_answers_429(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    engine_a.engine_load = engine_b.engine_load = (8, 200, 0.99)
    base = start(ON_MISS="shed")
    scraped(base, a=200, b=200)
    response = chat(base)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "sla_unmeetable"
    assert "predicted TTFT" in response.json()["error"]["message"]
    assert chat_requests(engine_a) == chat_requests(engine_b) == []


def test_degrade_tries_the_fastest_predicted_anyway(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    engine_a.engine_load = (8, 400, 0.99)
    engine_b.engine_load = (8, 100, 0.5)
    base = start(HEDGE_MS="5000")
    scraped(base, a=400, b=100)
    response = chat(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "b"


def test_breaker_ejects_a_failing_engine_then_probes_it(
    start_server: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    server = start_server()
    base = server.url
    engine_a.fail(500, times=None)
    for _ in range(2):  # two consecutive failures open a's breaker (each falls back to b)
        assert chat(base, "plain").headers["x-cascade-deployment"] == "b"
    assert len(chat_requests(engine_a)) == 2
    assert breaker_state(base) == 2
    assert chat(base, "plain").headers["x-cascade-attempts"] == "1"  # a skipped
    assert len(chat_requests(engine_a)) == 2
    engine_a.fail_status = None  # a recovers; after the cooldown one probe goes to it
    breakers = server.services.guard.breakers
    assert breakers.state("a", now=time.time() + 30) == "half_open"  # the cooldown is over
    assert chat(base, "plain").headers["x-cascade-deployment"] == "a"
    assert breaker_state(base) == 0


def test_an_ejected_deployment_no_traffic_reaches_reads_half_open_after_its_cooldown(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    """Its cooldown is over, so it is due for a probe, not ejected: /metrics (and the
    ejection alert) must not read "open" until some request happens to reach it."""
    base = start(COOLDOWN_S="0.5")
    engine_a.fail(500, times=None)
    for _ in range(2):
        chat(base, "plain")
    assert breaker_state(base) == 2
    eventually(lambda: breaker_state(base) == 1, 5, "a half-open")  # no request meanwhile
    assert len(chat_requests(engine_a)) == 2  # nothing probed it


def test_an_ejection_is_shared_with_other_gateways_through_redis(
    start_gateway: StartGateway, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    urls = {"A_URL": engine_a.url, "B_URL": engine_b.url}
    first = start_gateway(POLICY, **urls).url
    second = start_gateway(POLICY, **urls).url
    engine_a.fail(500, times=None)
    for _ in range(2):
        chat(first, "plain")
    eventually(lambda: breaker_state(second) == 2, 3, "the second gateway to adopt the ejection")
    before = len(chat_requests(engine_a))
    assert chat(second, "plain").headers["x-cascade-deployment"] == "b"
    assert len(chat_requests(engine_a)) == before  # the second gateway never tried a


def test_every_ejected_deployment_means_503(start: Any, engine_a: FakeOpenAI) -> None:
    base = start()
    engine_a.fail(500, times=None)
    chat(base, "plain")
    chat(base, "plain")
    response = chat(base, "a")  # the deployment by name: nothing else to fall back to
    assert response.status_code == 503
    assert "circuit breaker" in response.json()["error"]["message"]
    assert 1 <= int(response.headers["retry-after"]) <= 30  # the cooldown left


def test_priority_is_forwarded_to_priority_scheduled_engines(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    base = start(LOAD_AWARE="false")
    chat(base, "batch")
    assert chat_requests(engine_b)[-1]["body"]["priority"] == 10
    chat(base)  # interactive, answered by a, which does not schedule by priority
    assert "priority" not in chat_requests(engine_a)[-1]["body"]


def test_timeout_ms_bounds_the_request(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    base = start(TTFT_MS="300", TIMEOUT_MS="300", HEDGE_MS="5000", LOAD_AWARE="false")
    engine_a.delay_s = engine_b.delay_s = 2.0
    began = time.monotonic()
    response = chat(base)
    assert response.status_code == 504
    assert time.monotonic() - began < 1.5
    # A request the route failed is a miss for its SLA attainment, not left uncounted.
    assert metric(base, 'cascade_sla_requests_total{outcome="missed",route="chat"}') == 1
    # Counted under its caller's team, and in the latency its client saw (no deployment).
    [failed] = [
        line
        for line in httpx.get(f"{base}/metrics").text.splitlines()
        if line.startswith("cascade_requests_total{") and 'status="504"' in line
    ]
    assert 'team="-"' not in failed and failed.endswith(" 1.0")
    waited = 'cascade_request_duration_seconds_count{deployment="-",route="chat"}'
    assert metric(base, waited) == 1
    assert metric(base, 'cascade_request_duration_seconds_sum{deployment="-",route="chat"}') >= 0.3


def test_a_hedge_sent_for_a_request_that_failed_counts_as_fired(
    start: Any, engine_a: FakeOpenAI, engine_b: FakeOpenAI
) -> None:
    """Both attempts too slow for timeout_ms: the hedge was sent (b got it) and the
    request ended in 504; `fired` counts every hedge sent, not only those of answers."""
    base = start(TIMEOUT_MS="600", HEDGE_MS="150", LOAD_AWARE="false", TTFT_MS="500")
    engine_a.delay_s = engine_b.delay_s = 2.0
    assert chat(base).status_code == 504
    assert len(chat_requests(engine_b)) == 1
    assert metric(base, 'cascade_hedges_total{outcome="fired",route="chat"}') == 1
    assert metric(base, 'cascade_hedges_total{outcome="won",route="chat"}') == 0


MEASURED = """
deployments:
  gpu:
    api_base: ${A_URL}
    model: a-model
    tier: local
    self_hosted: {gpu_hour_usd: 3.6, tokens_per_second: 100}
routes:
  local: {strategy: fixed, deployments: [gpu]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
gateway: {load_scrape_interval_s: 0.1}
"""


async def test_self_hosted_tokens_are_priced_from_measured_throughput(
    start_gateway: StartGateway, engine_a: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Static: $3.6/h at 100 tok/s = $10 per million tokens. The engine's /metrics shows
    it generating far faster, so once enough tokens were seen they cost less."""
    engine_a.tokens = 600
    base = start_gateway(MEASURED, A_URL=engine_a.url).url
    first = chat(base, "local")
    static = await wait_for_record(ledger_store, first.headers["x-request-id"])
    per_token_static = 3.6 / (3600 * 100)
    tokens = static.prompt_tokens + static.completion_tokens
    assert static.cost_nanos == round(tokens * per_token_static * 1e9)
    for _ in range(3):
        chat(base, "local")

    def measured_price() -> float | None:
        health = httpx.get(f"{base}/admin/policy", headers=ADMIN).json()["deployments"]["gpu"]
        price: float | None = health["health"]["measured_price_per_mtok"]
        return price

    # Scrapes see 2400 tokens generated in well under a minute.
    price = eventually(measured_price, 5, "a price from measured throughput")
    assert price is not None and 0 < price < 10
    later = chat(base, "local")
    measured = await wait_for_record(ledger_store, later.headers["x-request-id"])
    assert measured.cost_nanos < static.cost_nanos


def _failed_request_verdict(sla: RouteSla | None, missed: bool) -> bool | None:
    """`sla_met` of the error record of a request that got no answer."""
    ledger: list[SpendRecord] = []

    class Sink:
        def submit(self, record: SpendRecord) -> None:
            ledger.append(record)

    target = UpstreamTarget("a", "openai", "m", "http://unused", None)
    price = TokenPrice(1e-6, 1e-6, "policy")
    first = DeploymentRuntime("a", "t", "openai", target, price, 0, 0.0, None)
    route = RouteRuntime("chat", "fallback", ("a",), "m", first.price, sla=sla)
    started = time.perf_counter()
    call = Call("req_1", "team", "key", route, False, started, endpoint="chat", body={})
    Accountant(Sink(), Metrics()).settle_failure(call, first, missed)  # type: ignore[arg-type]
    [record] = ledger
    assert (record.status, record.cost_nanos, record.reference_cost_nanos) == ("error", 0, 0)
    return record.sla_met


def test_a_failed_request_misses_the_sla_only_when_the_route_failed_a_time_it_promised() -> None:
    timed = RouteSla(0.5, 10.0, False, "degrade", None, 1, None)
    priority_only = RouteSla(None, None, False, "degrade", None, 1, 0)
    assert _failed_request_verdict(timed, missed=True) is False
    assert _failed_request_verdict(timed, missed=False) is None  # the client's fault
    assert _failed_request_verdict(priority_only, missed=True) is None  # no time promised
    assert _failed_request_verdict(None, missed=True) is None

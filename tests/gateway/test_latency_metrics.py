"""The gateway's latency histograms, read from /metrics after requests over loopback:
`cascade_ttft_seconds` holds streamed requests only (a non-streamed answer's time is its
request duration), and `cascade_upstream_duration_seconds` times each successful attempt
once, streamed or not."""

from __future__ import annotations

import httpx
import pytest

from gateway.health.breaker import CircuitBreakers
from gateway.health.latency import LatencyModel
from gateway.health.load import LoadView
from gateway.health.sla import SlaGuard
from gateway.metrics import Metrics
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, metric
from tests.support import eventually

POLICY = """
deployments:
  a:
    api_base: ${UPSTREAM_BASE_URL}
    model: a-model
    max_retries: 0
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  chat: {strategy: fixed, deployments: [a]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
DELAY_S = 0.3  # the fake's wait before its first byte


def ask(base: str, stream: bool) -> None:
    body: dict[str, object] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert reply.status_code == 200, reply.text


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> str:
    fake_openai.delay_s = DELAY_S
    return start_gateway(POLICY, UPSTREAM_BASE_URL=fake_openai.url).url


def upstream_durations(base: str) -> tuple[float, float]:
    """(count, sum) of deployment a's successful attempts' durations."""
    name = 'cascade_upstream_duration_seconds_{}{{deployment="a"}}'
    return metric(base, name.format("count")), metric(base, name.format("sum"))


def test_a_stream_counts_in_ttft_and_once_in_upstream_durations(base: str) -> None:
    ask(base, stream=True)
    # Observed when the stream's relay ends, just after the client read its last event.
    eventually(lambda: upstream_durations(base)[0] == 1, 5, "the stream's upstream duration")
    assert metric(base, 'cascade_ttft_seconds_count{deployment="a",route="chat"}') == 1
    assert metric(base, 'cascade_upstream_ttft_seconds_count{deployment="a"}') == 1


def test_a_non_streamed_answer_is_timed_end_to_end_and_not_as_a_ttft(base: str) -> None:
    ask(base, stream=False)
    assert metric(base, 'cascade_request_duration_seconds_count{deployment="a"') == 1
    assert metric(base, "cascade_ttft_seconds_count") == 0  # streams only
    count, total = upstream_durations(base)
    assert count == 1 and DELAY_S <= total < DELAY_S + 5


def test_the_guard_times_a_non_streamed_success_and_leaves_a_stream_to_its_end() -> None:
    metrics = Metrics()
    latency = LatencyModel(60.0)
    guard = SlaGuard(metrics, latency, CircuitBreakers(), LoadView(latency))
    guard.succeeded("a", 0.5, streamed=False)  # the whole answer
    guard.succeeded("a", 0.1)  # a stream's first events: its end is still to come
    guard.stream_ended("a", 0.01, 2.0)
    sample = metrics.registry.get_sample_value
    labels = {"deployment": "a"}
    assert sample("cascade_upstream_duration_seconds_count", labels) == 2
    assert sample("cascade_upstream_duration_seconds_sum", labels) == 2.5
    assert sample("cascade_upstream_ttft_seconds_count", labels) == 2


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's `histogram_quantile` over (upper bound, cumulative count) pairs:
    the bucket holding the rank, interpolated linearly inside it."""
    total = buckets[-1][1]
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


@pytest.mark.parametrize(("seconds", "target"), [(1.1, 2.0), (1.6, 2.0), (2.6, 3.0), (4.2, 5.0)])
def test_a_p99_under_an_sla_target_reads_under_it(seconds: float, target: float) -> None:
    """Answers all taking `seconds`, under a p99 target of `target` (the shipped SLA
    examples' kind of figure): the p99 Prometheus computes from the buckets stays under
    it, so the p99 alert does not fire on a route that meets its target."""
    metrics = Metrics()
    for _ in range(20):
        metrics.child(metrics.latency, "chat", "a").observe(seconds)
    lines = metrics.render().decode().splitlines()
    prefix = 'cascade_request_duration_seconds_bucket{deployment="a",le="'
    buckets = [
        (float(line[len(prefix) :].split('"')[0]), float(line.split()[-1]))
        for line in lines
        if line.startswith(prefix) and "+Inf" not in line
    ]
    assert buckets[-1][0] >= 300.0  # the default request_timeout_s: nothing beyond it
    assert histogram_quantile(0.99, buckets) <= target


def test_the_process_metrics_are_exported() -> None:
    """Memory, CPU and open files, for the alerts an SRE sets on any service."""
    names = {line.split("{")[0].split()[0] for line in Metrics().render().decode().splitlines()}
    assert {"process_resident_memory_bytes", "process_open_fds", "python_info"} <= names

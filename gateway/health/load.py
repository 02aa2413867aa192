"""The engines' own view of their load: vLLM's `/metrics`, scraped on an interval, and
the `endpoint-load-metrics` header vLLM adds to a response when asked for it.

Feeds the latency model (queue depth and KV-cache usage raise a deployment's predicted
TTFT) and self-hosted pricing: once an engine has generated enough tokens in the window,
its tokens cost `gpu_hour_usd / (3600 x measured tokens per second)` instead of the
policy's static throughput figure.

Which deployments are scraped: those with `metrics_url`, or with `scrape_metrics: true`,
or self-hosted ones (`self_hosted` prices) unless `scrape_metrics: false`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from gateway.billing.pricing import TokenPrice
from gateway.health.latency import EngineLoad, LatencyModel
from gateway.runtime import wants_load_view
from local_engine.errors import MetricsError
from local_engine.metrics import (
    EngineMetrics,
    metrics_url,
    parse_load_header,
    scrape,
)
from local_engine.throughput import DEFAULT_MIN_TOKENS, ThroughputMeter
from policies.schema import Policy

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 1.0
# KV-cache usage in a load report, by the names vLLM versions have used.
KV_FIELDS = ("kv_cache_usage_perc", "kv_cache_utilization", "gpu_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class ScrapeTarget:
    deployment: str
    url: str
    gpu_hour_usd: float | None = None
    static_tokens_per_second: float | None = None


def scrape_targets(policy: Policy) -> list[ScrapeTarget]:
    targets = []
    for name, spec in policy.deployments.items():
        wanted = wants_load_view(spec)
        url = spec.metrics_url or (metrics_url(spec.api_base) if spec.api_base else None)
        if not wanted or url is None:
            continue
        hosted = spec.self_hosted
        targets.append(
            ScrapeTarget(
                name,
                url,
                hosted.gpu_hour_usd if hosted else None,
                hosted.tokens_per_second if hosted else None,
            )
        )
    return targets


class LoadView:
    """Scrapes engines and keeps the latest reading and throughput of each."""

    def __init__(self, latency: LatencyModel, client: httpx.AsyncClient | None = None) -> None:
        self._latency = latency
        # Made on the first scrape: an httpx client loads the CA bundle (~0.1 s of a
        # replica's start), which a policy with no engine to scrape never needs.
        self._client = client
        self._meters: dict[str, ThroughputMeter] = {}
        self.readings: dict[str, EngineMetrics] = {}
        self.errors: dict[str, str] = {}
        # Self-hosted prices from measured throughput, once there is enough of it.
        self.prices: dict[str, TokenPrice] = {}

    async def scrape_once(self, targets: list[ScrapeTarget]) -> None:
        await asyncio.gather(*(self._scrape(target) for target in targets))

    async def _scrape(self, target: ScrapeTarget) -> None:
        try:
            if self._client is None:
                self._client = httpx.AsyncClient()
            reading = await scrape(target.url, self._client, SCRAPE_TIMEOUT_S)
        except MetricsError as exc:
            if self.errors.get(target.deployment) is None:
                log.warning("load of deployment '%s' unknown: %s", target.deployment, exc)
            self.errors[target.deployment] = str(exc)
            return
        self.errors.pop(target.deployment, None)
        now = time.monotonic()
        meter = self._meters.setdefault(target.deployment, ThroughputMeter())
        meter.observe(reading, now)
        self.readings[target.deployment] = reading
        load = EngineLoad(
            running=reading.running,
            waiting=reading.waiting,
            kv_cache_usage=reading.kv_cache_usage,
            mean_ttft_s=meter.stats().ttft_mean_s,
            at=now,
        )
        self._latency.observe_load(target.deployment, load)
        price = self.measured_price(target)
        if price is not None:
            self.prices[target.deployment] = price

    def observe_header(self, deployment: str, value: str) -> None:
        """A response's `endpoint-load-metrics` header: fresher than the last scrape."""
        fields = parse_load_header(value)
        running = fields.get("num_requests_running")
        waiting = fields.get("num_requests_waiting")
        if running is None and waiting is None:
            return
        kv = next((fields[name] for name in KV_FIELDS if name in fields), None)
        meter = self._meters.get(deployment)
        mean_ttft = meter.stats().ttft_mean_s if meter else None
        load = EngineLoad(running or 0.0, waiting or 0.0, kv, mean_ttft, time.monotonic())
        self._latency.observe_load(deployment, load)

    def measured_price(self, target: ScrapeTarget) -> TokenPrice | None:
        """The self-hosted price from measured throughput, once there is enough of it."""
        meter = self._meters.get(target.deployment)
        if meter is None or target.gpu_hour_usd is None or target.static_tokens_per_second is None:
            return None
        stats = meter.stats()
        if not stats.tokens_per_second or stats.generation_tokens < DEFAULT_MIN_TOKENS:
            return None
        per_token = meter.price_per_token(target.gpu_hour_usd, target.static_tokens_per_second)
        return TokenPrice(per_token, per_token, "self_hosted:measured")

    def throughput(self, deployment: str) -> Mapping[str, float | None]:
        meter = self._meters.get(deployment)
        if meter is None:
            return {}
        stats = meter.stats()
        return {
            "tokens_per_second": stats.tokens_per_second,
            "acceptance_rate": stats.acceptance_rate,
            "mean_acceptance_length": stats.mean_acceptance_length,
        }

    async def run(self, targets: Callable[[], list[ScrapeTarget]], interval_s: float) -> None:
        """Scrape every `interval_s` until cancelled."""
        while True:
            await self.scrape_once(targets())
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

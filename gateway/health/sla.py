"""Keeping routes' latency promises: the live health of every deployment (latency
model, engine load, circuit breakers) and what the request path asks of it.

    guard.select(route, candidates)        # skip ejected / predicted-late deployments
    guard.allows(deployment)               # per deployment: breaker (takes half-open probes)
    guard.warmup.warming                   # deployments whose engine is loading
    guard.succeeded(deployment, ttft_s, streamed=...)  # per attempt, from the executor
    guard.failed(deployment, failure)      # not counted while its engine is loading
    guard.release(admission)               # done with the deployment: its probe slot back
    guard.stream_ended(deployment, ...)    # a relayed stream's end: its attempt's verdict
    guard.stream_failed(deployment, failure)  # ... or the upstream broke it after it began
    guard.count_outcome(route, ttft_s, total_s)

Selection itself is the router's pure rule (`router.selection.select`); this module
only supplies what it needs and turns its verdict into deployments or an error.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from pathlib import Path

from gateway.errors import RateLimited, UpstreamUnavailable
from gateway.health.breaker import (
    STATE_VALUES,
    Admission,
    BreakerSettings,
    BreakerStateType,
    CircuitBreakers,
)
from gateway.health.latency import LatencyModel
from gateway.health.load import LoadView, ScrapeTarget, scrape_targets
from gateway.health.warmup import Warmup
from gateway.metrics import Metrics
from gateway.redis_client import RedisClient, redis_client
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime, sla_met
from gateway.tasks import stop_tasks
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamFailure
from local_engine.config import state_path
from local_engine.errors import EngineStateError
from local_engine.state import observed_state, read_record
from policies.schema import Policy
from router.selection import Health, SlaMissType, select

log = logging.getLogger(__name__)

BUSY_DEFAULT_S = 1.0  # how long a 503/429 without Retry-After marks a deployment busy
BUSY_MAX_S = 10.0
BREAKER_SYNC_S = 0.5


class SlaGuard:
    def __init__(
        self,
        metrics: Metrics,
        latency: LatencyModel,
        breakers: CircuitBreakers,
        load: LoadView,
        redis: RedisClient | None = None,
        warmup: Warmup | None = None,
        engines_dir: Path | None = None,
    ) -> None:
        self._metrics = metrics
        self._engines_dir = engines_dir  # the engines' state files, as `warmup` reads them
        self._redis = redis
        self.latency = latency
        self.breakers = breakers
        self.load = load
        self.warmup = warmup or Warmup()
        self._tasks: list[asyncio.Task[None]] = []

    # Selection.

    def select(
        self, route: RouteRuntime, candidates: list[DeploymentRuntime], use_sla: bool = True
    ) -> list[DeploymentRuntime]:
        """The candidates to try, in order; raises when none may be tried. Without
        `use_sla` only ejected deployments are dropped."""
        sla = route.sla if use_sla else None
        if sla is None and not self.breakers.tripped:
            return candidates  # the common case: nothing to judge
        ttft_s = sla.ttft_s if sla is not None and sla.load_aware else None
        health = {d.name: self._health(d.name, predict=ttft_s is not None) for d in candidates}
        on_miss: SlaMissType = "shed" if sla is not None and sla.on_miss == "shed" else "degrade"
        chosen = select([d.name for d in candidates], health, ttft_s, on_miss)
        if chosen.shed:
            self._metrics.child(self._metrics.sla_shed, route.name).inc()
            reasons = "; ".join(f"{name}: {why}" for name, why in chosen.skipped)
            raise RateLimited(
                f"route '{route.name}' cannot meet its TTFT SLA now ({reasons})",
                retry_after_s=chosen.retry_after_s,
                code="sla_unmeetable",
            )
        if not chosen.order:
            names = [d.name for d in candidates]
            wait = self.breakers.reopens_in(names)
            raise UpstreamUnavailable(
                f"every deployment of route '{route.name}' is ejected by its circuit "
                f"breaker ({', '.join(names)}); the first is probed again in {wait:.1f}s",
                retry_after_s=wait,
            )
        if chosen.skipped:
            log.debug("route '%s' skipped %s", route.name, chosen.skipped)
        by_name = {d.name: d for d in candidates}
        return [by_name[name] for name in chosen.order]

    def _health(self, deployment: str, predict: bool) -> Health:
        ejected = self.breakers.is_ejected(deployment)
        if not predict:  # no TTFT target to hold a prediction against
            return Health(ejected=ejected)
        prediction = self.latency.predict(deployment)
        return Health(ejected, prediction.ttft_s, prediction.reason)

    def health_report(self, deployment: str) -> dict[str, object]:
        """What the guard knows of a deployment, for `/admin/policy`."""
        prediction = self.latency.predict(deployment)
        reading = self.load.readings.get(deployment)
        return {
            "breaker": self.breakers.state(deployment),
            "warming": deployment in self.warmup.warming,
            "engine_state": self._engine_state(deployment),
            "predicted_ttft_ms": _ms(prediction.ttft_s),
            "prediction": prediction.reason,
            "ttft_samples": prediction.samples,
            "error_rate": round(prediction.error_rate, 4),
            "engine": None
            if reading is None
            else {
                "running": reading.running,
                "waiting": reading.waiting,
                "kv_cache_usage": reading.kv_cache_usage,
                **self.load.throughput(deployment),
            },
            "scrape_error": self.load.errors.get(deployment),
            "measured_price_per_mtok": None
            if (price := self.load.prices.get(deployment)) is None
            else round(price.output_usd * 1e6, 6),
        }

    def _engine_state(self, deployment: str) -> str | None:
        """Its engine's state from its state file, `unhealthy` once the supervisor that
        wrote it is gone (a killed one leaves `ready` behind)."""
        start, engine = self.warmup.state_of(deployment), self.warmup.engine_of(deployment)
        if start is None or engine is None or self._engines_dir is None:
            return None if start is None else start.state
        try:
            return observed_state(read_record(state_path(self._engines_dir, engine)))
        except EngineStateError:
            return None

    # Per attempt, from the executor.

    def allows(self, deployment: str) -> Admission | None:
        return self.breakers.allows(deployment)

    def succeeded(self, deployment: str, ttft_s: float, *, streamed: bool = True) -> None:
        """An attempt answered after `ttft_s`: its first events (a stream, whose end
        `stream_ended` reports) or, not `streamed`, its whole answer, which is then its
        end-to-end time too. Only a whole answer is a success for the breaker: a stream
        may stall or break after its first events (`stream_failed`)."""
        if not streamed:
            self.breakers.record_success(deployment)
        self.latency.observe(deployment, ok=True, ttft_s=ttft_s)
        self._metrics.child(self._metrics.upstream_ttft, deployment).observe(ttft_s)
        if not streamed:
            self._metrics.child(self._metrics.upstream_duration, deployment).observe(ttft_s)

    def failed(self, deployment: str, failure: UpstreamFailure) -> None:
        if isinstance(failure, UpstreamConnectFailed) and self.warmup.recheck(deployment):
            return  # its engine is loading, port still closed: no verdict on it
        self.breakers.record_failure(deployment, failure)
        self.latency.observe(deployment, ok=False)
        if failure.status in (429, 503):  # busy: go elsewhere for a while, don't eject
            wait = failure.retry_after_s if failure.retry_after_s is not None else BUSY_DEFAULT_S
            self.latency.mark_busy(deployment, min(wait, BUSY_MAX_S))

    def release(self, admission: Admission) -> None:
        """The attempts on a deployment are over (answered, failed, moved on, cancelled):
        the half-open probe slot `admission` took, if it still holds one, is free again."""
        self.breakers.release(admission)

    def lost_race(self, deployment: str) -> None:
        """A hedged attempt another deployment beat: its TTFT is unknown but late, so it
        counts as a miss (a censored sample at the top of the range). Otherwise a
        deployment whose slow answers are always hedged away would look fast forever."""
        self.latency.observe(deployment, ok=True, ttft_s=math.inf)

    def stream_ended(
        self, deployment: str, itl_s: float | None, duration_s: float, *, finished: bool = True
    ) -> None:
        """A stream relayed to its end, `duration_s` after its first events; `finished`:
        the upstream ended it (its attempt's success), else its client left first (no
        verdict on the deployment)."""
        if finished:
            self.breakers.record_success(deployment)
        if itl_s is not None:
            self.latency.observe(deployment, ok=True, itl_s=itl_s)
            self._metrics.child(self._metrics.upstream_itl, deployment).observe(itl_s)
        self._metrics.child(self._metrics.upstream_duration, deployment).observe(duration_s)

    def stream_failed(self, deployment: str, failure: UpstreamFailure) -> None:
        """A stream the upstream broke after its first events (silent past `timeout_s`,
        its connection cut, its own failure event): the attempt failed, as one that
        failed before answering does, though the executor counted it `ok` when it
        opened (the metric's `stream_error` says which of those broke)."""
        self.failed(deployment, failure)
        self._metrics.child(self._metrics.upstream_attempts, deployment, "stream_error").inc()

    # SLA attainment.

    def count_missed(self, route: RouteRuntime) -> None:
        """A request on an SLA route that failed: a miss, whatever the clock said."""
        if route.sla is not None:
            self._count(route, met=False)

    def count_outcome(self, route: RouteRuntime, ttft_s: float | None, total_s: float) -> None:
        """An answered request (`ttft_s` None: non-streamed, see `runtime.sla_met`)."""
        met = sla_met(route, ttft_s, total_s)
        if met is not None:
            self._count(route, met)

    def _count(self, route: RouteRuntime, met: bool) -> None:
        outcome = "met" if met else "missed"
        self._metrics.child(self._metrics.sla_requests, route.name, outcome).inc()

    # Background work: engine scraping, engines' warm-up and shared breaker state.

    def start(self, runtime: Callable[[], Runtime]) -> None:
        def targets() -> list[ScrapeTarget]:
            # An engine still loading has no /metrics to read yet: nothing to warn about.
            targets = scrape_targets(runtime().policy)
            return [t for t in targets if t.deployment not in self.warmup.warming]

        def deployments() -> list[str]:
            return list(runtime().deployments)

        self.warmup.watch(runtime().policy)
        self.warmup.read()  # before the first request: an engine just started warms already
        interval = runtime().policy.gateway.load_scrape_interval_s
        self._tasks = [
            asyncio.create_task(self._scrape_loop(targets, interval)),
            asyncio.create_task(self.breakers.run_sync(deployments, BREAKER_SYNC_S)),
            asyncio.create_task(self.warmup.run()),
        ]

    async def _scrape_loop(
        self, targets: Callable[[], list[ScrapeTarget]], interval: float
    ) -> None:
        while True:
            current = targets()
            if current:
                await self.load.scrape_once(current)
                self._export_load(current)
            await asyncio.sleep(interval)

    def _export_load(self, targets: list[ScrapeTarget]) -> None:
        m = self._metrics
        for target in targets:
            reading = self.load.readings.get(target.deployment)
            if reading is None:
                continue
            m.child(m.engine_requests, target.deployment, "running").set(reading.running)
            m.child(m.engine_requests, target.deployment, "waiting").set(reading.waiting)
            if reading.kv_cache_usage is not None:
                m.child(m.engine_kv_cache, target.deployment).set(reading.kv_cache_usage)
            predicted = self.latency.predict(target.deployment).ttft_s
            if predicted is not None:
                m.child(m.predicted_ttft, target.deployment).set(min(predicted, 1e6))

    async def stop(self) -> None:
        await stop_tasks(*self._tasks)
        await self.load.close()
        await self.warmup.close()
        if self._redis is not None:
            await self._redis.aclose()

    def configure(self, policy: Policy) -> None:
        """A reloaded policy's breaker knobs, latency window and engines apply from now on."""
        self.breakers.settings = breaker_settings(policy)
        self.latency.window_s = policy.gateway.latency_window_s
        self.warmup.watch(policy)
        watched = self.warmup.watched
        self._metrics.prune(self._metrics.deployment_warming, lambda labels: labels[0] in watched)


def breaker_metric(metrics: Metrics) -> Callable[[str, BreakerStateType], None]:
    def on_change(deployment: str, state: BreakerStateType) -> None:
        metrics.child(metrics.breaker_state, deployment).set(STATE_VALUES[state])

    return on_change


def warming_metric(metrics: Metrics) -> Callable[[str, bool], None]:
    def on_change(deployment: str, warming: bool) -> None:
        metrics.child(metrics.deployment_warming, deployment).set(1 if warming else 0)

    return on_change


def build_guard(
    metrics: Metrics,
    policy: Policy,
    redis_url: str | None,
    prefix: str,
    engines_dir: Path | None = None,
    *,
    cluster: bool = False,
) -> SlaGuard:
    """The guard for a gateway process; breakers share ejections through Redis if set
    (a Redis Cluster with `cluster`), and the engines whose state files are in
    `engines_dir` warm up rather than fail."""
    # Short timeouts: a Redis that stops answering must not stall the breaker sync loop
    # (gateway.redis_client has each caller's options side by side).
    client = (
        redis_client(
            redis_url,
            socket_timeout=1.0,
            connect_timeout=1.0,
            max_connections=100,
            cluster=cluster,
        )
        if redis_url
        else None
    )
    breakers = CircuitBreakers(
        breaker_settings(policy), client, prefix, on_change=breaker_metric(metrics)
    )
    latency = LatencyModel(policy.gateway.latency_window_s)
    warmup = Warmup(engines_dir, on_change=warming_metric(metrics))
    load = LoadView(latency)
    return SlaGuard(metrics, latency, breakers, load, client, warmup, engines_dir)


def breaker_settings(policy: Policy) -> BreakerSettings:
    spec = policy.gateway.circuit_breaker
    return BreakerSettings(spec.failure_threshold, spec.cooldown_s, spec.half_open_probes)


def _ms(seconds: float | None) -> float | str | None:
    if seconds is None:
        return None
    return "inf" if math.isinf(seconds) else round(seconds * 1000, 1)

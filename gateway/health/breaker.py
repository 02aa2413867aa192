"""Circuit breakers: eject a deployment that keeps failing, probe it after a cooldown.

    closed ──(failure_threshold consecutive failures or timeouts)──▶ open
    open ──(cooldown_s passed)──▶ half-open: `half_open_probes` requests let through
    half-open ──(a probe succeeds)──▶ closed;  ──(a probe fails)──▶ open again

A probe slot belongs to the attempt `allows` gave it to (an `Admission`): the attempt
keeps it across its retries and hands it back with `release` when it ends without a
verdict. A request let through without a slot (a route's last resort) frees none.

Each worker counts consecutive failures itself (successes are the common case and must
not cost a Redis call); an ejection is shared: the worker that opens a breaker writes
`<prefix>{breaker}:<deployment>` (string, the reopen time, expiring with the cooldown)
and every worker polls those keys, so one worker's evidence ejects the deployment
everywhere. A closed breaker deletes the key. Without Redis the breakers are local. On a
Redis Cluster the `{breaker}` tag keeps every key in one slot, so the poll stays one MGET.

What counts as a failure: refused or reset connections, timeouts, 5xx other than 503,
before a stream's first events or after them. A stream is judged at its end: its first
events are no success (it may stall or break after them), and one its client left is
no verdict.
A 429 or a 503 says "busy", not "broken": the latency model marks the deployment busy
instead, so the next request goes elsewhere without ejecting it for a cooldown. Nor is
a deployment whose engine is still loading judged: its refused connections are the
model loading, and the guard does not report them (`gateway.health.warmup`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.exceptions import RedisError

from gateway.redis_client import RedisClient
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamFailure, UpstreamTimedOut

log = logging.getLogger(__name__)

BreakerStateType = Literal["closed", "open", "half_open"]
STATE_VALUES: dict[BreakerStateType, int] = {"closed": 0, "half_open": 1, "open": 2}


def trips_breaker(failure: UpstreamFailure) -> bool:
    if isinstance(failure, UpstreamConnectFailed | UpstreamTimedOut):
        return True
    return failure.status is not None and failure.status >= 500 and failure.status != 503


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failure_threshold: int = 5
    cooldown_s: float = 30.0
    half_open_probes: int = 1


@dataclass(frozen=True, slots=True, eq=False)
class Admission:
    """`allows`' yes: `probe` says it took a half-open probe slot, which the attempt
    holds until a verdict or `release`. Compared by identity: each is one attempt's."""

    deployment: str
    probe: bool = False


@dataclass(slots=True)
class _Breaker:
    state: BreakerStateType = "closed"
    failures: int = 0
    open_until: float = 0.0  # wall-clock seconds (shared across hosts through Redis)
    probes: set[Admission] = field(default_factory=set)  # half-open probes in flight
    probed_at: float = 0.0  # when the last probe went out


class CircuitBreakers:
    """All deployments' breakers in this worker.

    `on_change(deployment, state)` is called on every transition (metrics, logs).
    """

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        redis: RedisClient | None = None,
        prefix: str = "cg:",
        on_change: Callable[[str, BreakerStateType], None] | None = None,
    ) -> None:
        self.settings = settings or BreakerSettings()
        self._breakers: dict[str, _Breaker] = {}
        self.tripped: set[str] = set()  # deployments whose breaker is not closed
        self._redis = redis
        self._base = f"{prefix}{{breaker}}:"
        self._on_change = on_change
        self._pending: set[asyncio.Task[None]] = set()

    def _get(self, deployment: str) -> _Breaker:
        breaker = self._breakers.get(deployment)
        if breaker is None:
            breaker = self._breakers[deployment] = _Breaker()
        return breaker

    def state(self, deployment: str, now: float | None = None) -> BreakerStateType:
        """Its state now: an open breaker whose cooldown is over is half-open (due for a
        probe) whether or not a request has come to probe it yet, so that a deployment
        no traffic reaches does not read as ejected long after its cooldown. Not a pure
        read, unlike `is_ejected`: that move is made here (logged, `on_change` told)."""
        breaker = self._breakers.get(deployment)
        if breaker is None:
            return "closed"
        if breaker.state == "open" and (time.time() if now is None else now) >= breaker.open_until:
            self._move(deployment, breaker, "half_open")
        return breaker.state

    def is_ejected(self, deployment: str, now: float | None = None) -> bool:
        """Would `allows` refuse now? (A pure read: takes and frees no probe slot.)"""
        breaker = self._breakers.get(deployment)
        if breaker is None or breaker.state == "closed":
            return False
        now = time.time() if now is None else now
        if breaker.state == "open" and now >= breaker.open_until:
            return False  # due for a half-open probe
        return breaker.state == "open" or not self._probe_free(breaker, now)

    def allows(self, deployment: str, now: float | None = None) -> Admission | None:
        """May a request go to `deployment` now? None if not; when half-open the
        admission holds a probe slot, which the caller hands back with `release`."""
        now = time.time() if now is None else now
        if self.is_ejected(deployment, now):
            return None
        breaker = self._breakers.get(deployment)
        if breaker is None or breaker.state == "closed":
            return Admission(deployment)
        if breaker.state == "open":  # its cooldown is over: probe it
            self._move(deployment, breaker, "half_open")
        if self._stale(breaker, now):
            breaker.probes.clear()
        admission = Admission(deployment, probe=True)
        breaker.probes.add(admission)
        breaker.probed_at = now
        return admission

    def _stale(self, breaker: _Breaker, now: float) -> bool:
        # A probe that never reported back (its request vanished) frees its slot after a
        # cooldown, so a half-open breaker can never wedge shut.
        return bool(breaker.probes) and now - breaker.probed_at > self.settings.cooldown_s

    def _probe_free(self, breaker: _Breaker, now: float) -> bool:
        held = 0 if self._stale(breaker, now) else len(breaker.probes)
        return held < self.settings.half_open_probes

    def release(self, admission: Admission) -> None:
        """The attempts `admission` let through are over. Frees its probe slot if it
        still holds one: a verdict, a reopening or a stale reset already freed it."""
        breaker = self._breakers.get(admission.deployment)
        if breaker is not None:
            breaker.probes.discard(admission)

    def reopens_in(self, deployments: Iterable[str], now: float | None = None) -> float:
        """Seconds until the first of `deployments` accepts a probe (for Retry-After)."""
        now = time.time() if now is None else now
        waits = [max(0.0, self._get(d).open_until - now) for d in deployments]
        return min(waits) if waits else 0.0

    def record_success(self, deployment: str) -> None:
        breaker = self._breakers.get(deployment)
        if breaker is None or (breaker.state == "closed" and breaker.failures == 0):
            return
        breaker.failures = 0
        if breaker.state != "closed":
            breaker.probes.clear()
            self._move(deployment, breaker, "closed")
            self._share(self._clear, deployment)

    def record_failure(self, deployment: str, failure: UpstreamFailure) -> None:
        if not trips_breaker(failure):
            return  # busy or refused: no verdict; the attempt still holds its probe slot
        breaker = self._get(deployment)
        breaker.failures += 1
        # Open again from half-open, or from open (a request that went ahead anyway, as a
        # route's last resort, failed too): still broken, the cooldown starts over.
        if breaker.state != "closed" or breaker.failures >= self.settings.failure_threshold:
            self._open(deployment, breaker, time.time() + self.settings.cooldown_s)
            self._share(self._publish, deployment, breaker.open_until)

    def _open(self, deployment: str, breaker: _Breaker, until: float) -> None:
        breaker.open_until = until
        breaker.probes.clear()
        self._move(deployment, breaker, "open")

    def _move(self, deployment: str, breaker: _Breaker, state: BreakerStateType) -> None:
        if breaker.state == state:
            return
        breaker.state = state
        if state == "closed":
            self.tripped.discard(deployment)
        else:
            self.tripped.add(deployment)
        log.warning("circuit breaker for deployment '%s' is now %s", deployment, state)
        if self._on_change is not None:
            self._on_change(deployment, state)

    # Sharing through Redis: fire-and-forget writes, a poll loop for reads.

    def _share(self, write: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        if self._redis is None:
            return
        task = asyncio.ensure_future(write(*args))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(self, deployment: str, until: float) -> None:
        assert self._redis is not None
        try:
            cooldown_ms = max(1, int((until - time.time()) * 1000))
            await self._redis.set(self._base + deployment, f"{until:.3f}", px=cooldown_ms)
        except RedisError as exc:
            log.warning("could not share the breaker of '%s': %s", deployment, exc)

    async def _clear(self, deployment: str) -> None:
        assert self._redis is not None
        try:
            await self._redis.delete(self._base + deployment)
        except RedisError as exc:
            log.warning("could not clear the shared breaker of '%s': %s", deployment, exc)

    async def sync(self, deployments: list[str]) -> None:
        """Adopt ejections other workers published (one MGET)."""
        if self._redis is None or not deployments:
            return
        values = await self._redis.mget([self._base + d for d in deployments])
        now = time.time()
        for deployment, value in zip(deployments, values, strict=True):
            if value is None:
                continue
            until = float(value)
            breaker = self._get(deployment)
            if until > now and breaker.state == "closed":
                self._open(deployment, breaker, until)

    async def run_sync(self, deployments: Callable[[], list[str]], interval_s: float) -> None:
        """Poll the shared state until cancelled; Redis errors are logged, not fatal."""
        while True:
            try:
                await self.sync(deployments())
            except (RedisError, OSError, ValueError) as exc:
                log.debug("breaker sync failed: %s", exc)
            await asyncio.sleep(interval_s)

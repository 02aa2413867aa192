"""Engines still loading: a deployment served by a self-hosted engine that is starting
is *warming*, not failing.

    warmup = Warmup(Path("var/engines"))
    warmup.watch(policy)                # which deployments talk to which engines
    warmup.read()                       # their state files, now
    await warmup.refresh()              # the same, and /health of those warming
    "local-cpu" in warmup.warming       # a set, like the breakers' `tripped`
    await warmup.wait("local-cpu")      # until it is not warming (the caller bounds it)

A supervisor (`cascade-gateway engine up`, or `serve` for its autostart engines) writes
each engine's state to `<run dir>/<engine>.json`. A deployment is warming while its
engine's record says `starting`, the supervisor that wrote it is alive, and the
deployment talks to that engine (its `api_base` is the engine's, not one set elsewhere).
The supervisor probes `/health` every `health_interval_s`; to not keep requests waiting
that long after the model loaded, the engines warming are probed here too, and a 200
ends the warm-up of that start (a restart, with a new `started_at`, warms again).

While warming, a refused connection is the model loading: the guard does not count it
against the deployment, and the executor tries other deployments first, or waits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from local_engine.config import state_path
from local_engine.errors import EngineStateError
from local_engine.state import EngineRecord, pid_alive, read_record
from policies.schema import Policy

log = logging.getLogger(__name__)

WARMING_STATES = frozenset({"starting"})
IDLE_REFRESH_S = 0.5  # reading the state files when nothing warms (a restart warms again)
WARM_REFRESH_S = 0.1  # reading them, and probing /health, while something warms
WAIT_POLL_S = 0.05
PROBE_TIMEOUT_S = 0.5


@dataclass(frozen=True, slots=True)
class EngineWatch:
    """A deployment that talks to a self-hosted engine from the policy."""

    engine: str
    state_path: Path
    health_url: str


@dataclass(slots=True)
class EngineStart:
    """One engine's current start, as its state file and our probes tell it."""

    state: str | None = None  # its record's state; None: no readable record
    started_at: float | None = None  # the start the record is about (Unix seconds)
    warming: bool = False
    answered_at: float | None = None  # `started_at` of the start whose /health said 200


class Warmup:
    """Which deployments are warming, in this worker. `run_dir` None: none ever is.

    `on_change(deployment, warming)` is told of every watched deployment once, then of
    every change (metrics).
    """

    def __init__(
        self,
        run_dir: Path | None = None,
        client: httpx.AsyncClient | None = None,
        on_change: Callable[[str, bool], None] | None = None,
    ) -> None:
        self._run_dir = run_dir
        self._client = client
        self._on_change = on_change
        self._watches: dict[str, EngineWatch] = {}  # deployment -> its engine
        self._engines: dict[str, EngineStart] = {}  # engine -> its start
        self._told: dict[str, bool] = {}  # what `on_change` last heard, per deployment
        self.warming: set[str] = set()  # deployments

    def watch(self, policy: Policy) -> None:
        """Watch the deployments of `policy` that talk to one of its engines."""
        watches = {}
        for name, spec in policy.deployments.items():
            engine = policy.engines.get(spec.engine or "")
            if engine is None or self._run_dir is None:
                continue
            if (spec.api_base or "").rstrip("/") != engine.api_base:
                continue  # pointed elsewhere (LOCAL_ENGINE_URL): not that engine's warm-up
            root = engine.api_base.removesuffix("/v1")
            path = state_path(self._run_dir, spec.engine or "")
            watches[name] = EngineWatch(spec.engine or "", path, f"{root}/health")
        self._watches = watches
        self._told = {name: told for name, told in self._told.items() if name in watches}
        engines = {w.engine for w in watches.values()}
        self._engines = {e: self._engines.get(e, EngineStart()) for e in engines}
        self._publish()

    @property
    def watched(self) -> list[str]:
        return list(self._watches)

    def engine_of(self, deployment: str) -> str | None:
        watch = self._watches.get(deployment)
        return None if watch is None else watch.engine

    def state_of(self, deployment: str) -> EngineStart | None:
        watch = self._watches.get(deployment)
        return None if watch is None else self._engines.get(watch.engine)

    def read(self) -> None:
        """Read the watched engines' state files."""
        for watch in {w.engine: w for w in self._watches.values()}.values():
            start = self._engines[watch.engine]
            record = _record(watch.state_path)
            start.state = None if record is None else record.state
            start.started_at = None if record is None else record.started_at
            was_warming, start.warming = start.warming, _warming(record, start.answered_at)
            if start.warming != was_warming:
                self._log_change(watch, start)
        self._publish()

    def recheck(self, deployment: str) -> bool:
        """Is it warming? Its engine's state file read again first when it is watched
        and not known to warm: a refused connection may be an engine that has just
        been started, before the next refresh saw it."""
        if deployment in self._watches and deployment not in self.warming:
            self.read()
        return deployment in self.warming

    async def refresh(self) -> None:
        """Read the state files, then probe `/health` of the engines warming."""
        self.read()
        warming = {w.engine: w for w in self._watches.values() if self._engines[w.engine].warming}
        if warming:
            await asyncio.gather(*(self._probe(watch) for watch in warming.values()))
            self._publish()

    async def run(self) -> None:
        """Refresh until cancelled: often while an engine warms, rarely otherwise."""
        while True:
            try:
                await self.refresh()
            except (OSError, httpx.HTTPError) as exc:
                log.debug("engine warm-up refresh failed: %s", exc)
            await asyncio.sleep(WARM_REFRESH_S if self.warming else IDLE_REFRESH_S)

    async def wait(self, deployment: str) -> None:
        """Return once `deployment` is not warming; the caller bounds the wait."""
        while deployment in self.warming:
            await asyncio.sleep(WAIT_POLL_S)

    def warming_for_s(self, deployment: str) -> float | None:
        """How long its engine has been starting, or None when it is not warming."""
        start = self.state_of(deployment)
        if deployment not in self.warming or start is None or start.started_at is None:
            return None
        return max(0.0, time.time() - start.started_at)

    def describe(self, deployment: str) -> str:
        """`'local-cpu' (engine 'local', starting for 2.1s)`, for messages."""
        engine, since = self.engine_of(deployment), self.warming_for_s(deployment)
        details = [f"engine '{engine}'"] if engine is not None else []
        details += [f"starting for {since:.1f}s"] if since is not None else []
        return f"'{deployment}'" + (f" ({', '.join(details)})" if details else "")

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def _probe(self, watch: EngineWatch) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient()
        try:
            response = await self._client.get(watch.health_url, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError:
            return  # still loading (a closed port), or not answering yet
        start = self._engines[watch.engine]
        if response.status_code == 200 and start.warming:
            start.answered_at, start.warming = start.started_at, False
            self._log_change(watch, start)

    def _publish(self) -> None:
        self.warming = {
            name for name, w in self._watches.items() if self._engines[w.engine].warming
        }
        for name in self._watches:
            warming = name in self.warming
            if self._told.get(name) != warming and self._on_change is not None:
                self._on_change(name, warming)
            self._told[name] = warming

    def _log_change(self, watch: EngineWatch, start: EngineStart) -> None:
        users = ", ".join(sorted(n for n, w in self._watches.items() if w.engine == watch.engine))
        if start.warming:
            log.info(
                "engine '%s' is loading: requests for %s wait for it or go elsewhere",
                watch.engine,
                users,
            )
        else:
            log.info("engine '%s' is no longer loading (%s): %s", watch.engine, start.state, users)


def _record(path: Path) -> EngineRecord | None:
    try:
        return read_record(path)
    except EngineStateError:
        return None


def _warming(record: EngineRecord | None, answered_at: float | None) -> bool:
    """Is this record's engine loading? Not if its supervisor is gone (a stale file), nor
    once its /health answered for this very start."""
    if record is None or record.state not in WARMING_STATES:
        return False
    if answered_at is not None and answered_at == record.started_at:
        return False
    return pid_alive(record.supervisor_pid)

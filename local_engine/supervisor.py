"""Run engines and keep them running: start, wait for readiness, restart with backoff,
stop gracefully. The shape is uvicorn's supervisor: a main loop that ticks, signal
handlers that only set flags, shutdown with a time limit.

    supervisor = Supervisor([EngineConfig("small", spec)])
    exit_code = supervisor.run()          # until SIGINT/SIGTERM, or every engine is done

Per engine, each tick: a process that exited is restarted after a backoff that doubles
from `restart_backoff_s` up to `restart_backoff_max_s` (reset once it is ready again),
`max_restarts` times at most; while starting, `/health` is probed until it answers 200
(refused connections are the model loading) or `startup_timeout_s` passes; once ready,
`unhealthy_after` failed probes in a row (a 503 is vLLM's dead engine core) restart it.
A `<name>.stop` file in the run directory (written by `engine down`) stops that engine.
The state of each engine is written to `<name>.json` for other invocations to read (the
gateway among them: an engine `starting` is warming, see `gateway.health.warmup`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType

import httpx

from local_engine.config import EngineConfig
from local_engine.errors import EngineError, EngineStateError
from local_engine.health import HealthType, probe_health
from local_engine.metrics import parse_vllm_metrics
from local_engine.process import EngineProcess, stop_group
from local_engine.state import (
    RUNNING_STATES,
    EngineRecord,
    EngineStateType,
    pid_alive,
    read_record,
    write_record,
)
from local_engine.throughput import ThroughputMeter

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
DEFAULT_TICK_S = 0.1
POLL_S = 0.05
FINAL_STATES = frozenset({"stopped", "failed"})
MIN_PROBE_TIMEOUT_S = 0.5
MAX_PROBE_TIMEOUT_S = 5.0


@dataclass
class EngineRun:
    """The supervisor's bookkeeping for one engine (mutable; the main loop owns it)."""

    config: EngineConfig
    process: EngineProcess | None = None
    state: EngineStateType = "stopped"
    restarts: int = 0
    failures_in_a_row: int = 0  # restarts since the engine was last ready; sets the backoff
    bad_probes: int = 0
    started_at: float = 0.0  # monotonic
    next_start_at: float = 0.0
    next_probe_at: float = 0.0
    meter: ThroughputMeter = field(default_factory=ThroughputMeter)
    record: EngineRecord | None = None


class Supervisor:
    """Supervise `configs` (engine names must be distinct) from the calling thread."""

    def __init__(
        self,
        configs: Sequence[EngineConfig],
        client: httpx.Client | None = None,
        tick_s: float = DEFAULT_TICK_S,
    ) -> None:
        self.runs = [EngineRun(config) for config in configs]
        self.client = client or httpx.Client()
        self.tick_s = tick_s
        self.should_exit = False
        self.force_exit = False

    def run(self) -> int:
        """Start every engine, supervise until asked to exit, stop them. Returns 0, or 1
        when an engine failed for good (`max_restarts` spent)."""
        restore = self._install_signal_handlers()
        try:
            self.startup()
            while not self.should_exit and not self.finished():
                self.tick()
                time.sleep(self.tick_s)
        finally:
            self.shutdown()
            restore()
        return 1 if any(run.state == "failed" for run in self.runs) else 0

    def startup(self) -> None:
        for run in self.runs:
            run.config.load()
            self._claim(run.config)
        for run in self.runs:
            self._start(run)

    def tick(self) -> None:
        now = time.monotonic()
        for run in self.runs:
            if run.config.stop_path.exists():
                run.config.stop_path.unlink(missing_ok=True)
                self._stop(run, "stopped by engine down")
            elif run.state == "backoff" and now >= run.next_start_at:
                self._start(run)
            elif run.state not in FINAL_STATES and run.state != "backoff":
                self._watch(run, now)

    def finished(self) -> bool:
        return all(run.state in FINAL_STATES for run in self.runs)

    def shutdown(self) -> None:
        """Stop every engine: SIGTERM to all at once, SIGKILL to those still running after
        the longest stop_timeout_s (at once after a second Ctrl-C)."""
        live = [run.process for run in self.runs if run.process and run.process.is_alive()]
        for run in self.runs:
            if run.process in live:
                self._publish(run, "stopping")
        for process in live:
            process.terminate()
        limit = max((process.config.spec.stop_timeout_s for process in live), default=0.0)
        deadline = time.monotonic() + limit
        while any(p.is_alive() for p in live) and time.monotonic() < deadline:
            if self.force_exit:
                break
            time.sleep(POLL_S)
        for run in self.runs:
            if run.process is not None:
                run.process.stop(timeout_s=0.0)
            if run.state not in FINAL_STATES:
                self._publish(run, "stopped", "supervisor exited", exit_code=_exit_code(run))
        self.client.close()

    def handle_exit(self, signum: int, frame: FrameType | None) -> None:
        if self.should_exit and signum == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return _nothing  # signals reach the main thread only; tests set should_exit
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _claim(self, config: EngineConfig) -> None:
        """Refuse an engine another live supervisor runs; stop one a dead supervisor left
        running (it holds the port and the GPUs); clear a stale stop request."""
        owner = live_owner(config)
        if owner is not None:
            raise EngineStateError(
                f"engine '{config.name}' is supervised by pid {owner} "
                f"(see {config.state_path}); run `engine down` first"
            )
        stop_orphan(config)
        config.stop_path.unlink(missing_ok=True)

    def _start(self, run: EngineRun) -> None:
        run.process = EngineProcess(run.config)
        try:
            run.process.start()
        except EngineError as exc:
            log.error("%s", exc)
            self._schedule_restart(run, str(exc))
            return
        now = time.monotonic()
        run.started_at, run.next_probe_at, run.bad_probes = now, now, 0
        run.meter.reset()
        self._publish(run, "starting", started=True)

    def _watch(self, run: EngineRun, now: float) -> None:
        assert run.process is not None
        if not run.process.is_alive():
            code = run.process.returncode
            self._schedule_restart(run, f"exited with code {code}", exit_code=code)
            return
        if now < run.next_probe_at:
            return
        spec = run.config.spec
        run.next_probe_at = now + spec.health_interval_s
        timeout = min(max(spec.health_interval_s, MIN_PROBE_TIMEOUT_S), MAX_PROBE_TIMEOUT_S)
        health = probe_health(run.config.health_url, self.client, timeout)
        if run.state == "starting":
            self._watch_start(run, health, now)
        else:
            self._watch_ready(run, health)

    def _watch_start(self, run: EngineRun, health: HealthType, now: float) -> None:
        spec = run.config.spec
        if health == "ok":
            run.failures_in_a_row = 0
            log.info("engine %s ready after %.1fs", run.config.name, now - run.started_at)
            self._publish(run, "ready", ready=True)
        elif health == "unhealthy":
            self._bad_probe(run, "answered /health with an error while starting")
        elif now - run.started_at > spec.startup_timeout_s:
            self._restart(run, f"not ready after startup_timeout_s={spec.startup_timeout_s}")

    def _watch_ready(self, run: EngineRun, health: HealthType) -> None:
        if health == "ok":
            run.bad_probes = 0
            self._scrape(run)
            self._publish(run, "ready")
        else:
            self._bad_probe(run, f"/health probe: {health}")

    def _bad_probe(self, run: EngineRun, reason: str) -> None:
        run.bad_probes += 1
        if run.bad_probes >= run.config.spec.unhealthy_after:
            self._restart(run, f"{reason} ({run.bad_probes} probes in a row)")
        else:
            self._publish(run, "unhealthy" if run.state != "starting" else "starting", reason)

    def _scrape(self, run: EngineRun) -> None:
        try:
            response = self.client.get(run.config.metrics_url, timeout=MAX_PROBE_TIMEOUT_S)
            run.meter.observe(parse_vllm_metrics(response.text))
        except (httpx.HTTPError, EngineError) as exc:
            log.debug("engine %s: /metrics unreadable: %s", run.config.name, exc)

    def _restart(self, run: EngineRun, reason: str) -> None:
        assert run.process is not None
        run.process.stop(run.config.spec.stop_timeout_s)
        self._schedule_restart(run, reason, exit_code=run.process.returncode)

    def _schedule_restart(self, run: EngineRun, reason: str, exit_code: int | None = None) -> None:
        """The engine is gone (or was stopped): back off and restart, or give up."""
        spec = run.config.spec
        if run.process is not None:
            run.process.stop(spec.stop_timeout_s)  # reap, and clear the group's leftovers
        if spec.max_restarts is not None and run.restarts >= spec.max_restarts:
            log.error("engine %s %s; max_restarts=%d spent", run.config.name, reason, run.restarts)
            self._publish(run, "failed", f"{reason}; max_restarts spent", exit_code=exit_code)
            return
        delay = min(spec.restart_backoff_s * 2**run.failures_in_a_row, spec.restart_backoff_max_s)
        run.failures_in_a_row += 1
        run.restarts += 1
        run.next_start_at = time.monotonic() + delay
        log.warning("engine %s %s; restarting in %.1fs", run.config.name, reason, delay)
        self._publish(run, "backoff", f"{reason}; restart in {delay:.1f}s", exit_code=exit_code)

    def _stop(self, run: EngineRun, reason: str) -> None:
        if run.process is not None:
            run.process.stop(run.config.spec.stop_timeout_s)
        self._publish(run, "stopped", reason, exit_code=_exit_code(run))

    def _publish(
        self,
        run: EngineRun,
        state: EngineStateType,
        message: str = "",
        exit_code: int | None = None,
        started: bool = False,
        ready: bool = False,
    ) -> None:
        run.state = state
        stats = run.meter.stats()
        previous = run.record or EngineRecord(run.config.name, state, os.getpid())
        wall = time.time()
        run.record = replace(
            previous,
            state=state,
            pid=run.process.pid if run.process else None,
            base_url=run.config.spec.api_base,
            log_path=str(run.config.log_path),
            restarts=run.restarts,
            last_exit=exit_code if exit_code is not None else previous.last_exit,
            started_at=wall if started else previous.started_at,
            ready_at=wall if ready else (None if started else previous.ready_at),
            updated_at=wall,
            tokens_per_second=stats.tokens_per_second,
            acceptance_rate=stats.acceptance_rate,
            message=message,
        )
        write_record(run.config.state_path, run.record)


def live_owner(config: EngineConfig) -> int | None:
    """The pid of another live supervisor running this engine, if any. A record in this
    process's name is its own (`serve` writes the first one in its supervisor's name)."""
    if not config.state_path.exists():
        return None
    try:
        record = read_record(config.state_path)
    except EngineStateError:
        return None
    mine = record.supervisor_pid == os.getpid()
    if mine or record.state in FINAL_STATES or not pid_alive(record.supervisor_pid):
        return None
    return record.supervisor_pid


def stop_orphan(config: EngineConfig) -> None:
    """Stop the engine a dead supervisor left running, if any (its process group)."""
    orphan = _orphan_pid(config)
    if orphan is not None:
        log.warning("engine %s: stopping pid %d, left by a dead supervisor", config.name, orphan)
        stop_group(orphan, config.spec.stop_timeout_s)


def _orphan_pid(config: EngineConfig) -> int | None:
    """The engine pid a dead supervisor's record says is running, if it still is."""
    try:
        record = read_record(config.state_path)
    except EngineStateError:
        return None
    running = record.state in RUNNING_STATES and not pid_alive(record.supervisor_pid)
    return record.pid if running and pid_alive(record.pid) else None


def _exit_code(run: EngineRun) -> int | None:
    return None if run.process is None else run.process.returncode


def _nothing() -> None:
    return None

"""Engines started with the gateway: `cascade-gateway serve` runs the supervisor of the
policy's `autostart: true` engines as a child process, watches it, and stops it on the
way out.

    autostart = start_engines(policy_path, policy.engines, run_dir)
    ...                                   # serve
    stop_engines(autostart)               # SIGTERM: the supervisor stops its engines

The supervisor is `cascade-gateway engine up` in its own session (a Ctrl-C meant for the
gateway reaches it through `stop_engines`, once, in order). It inherits the gateway's
environment, which fills the policy's `${VAR}`s (an engine's `api_key`); the engines it
starts get only what `local_engine.environment` lets through. A `cpu` engine needs torch
(the `[engine]` extra); without it the engine is skipped with a warning and the local
tier stays unavailable, so routes fall back to the deployments that are.

Each engine's state file says `starting` from the moment its supervisor is launched: the
gateway, up before the supervisor has imported itself, reads that as the engine warming
(requests wait for it) rather than as a closed port counted against its breaker.

A thread of the process that started the supervisor (`serve`'s main process, whatever
the number of workers: they cannot reap its child) polls it every `WATCH_INTERVAL_S`.
A supervisor that died while its records say it runs engines (killed, or crashed) is
reaped, logged as an error and started again after the engines' `restart_backoff_s`
(doubling), at most `RESTARTS_PER_WINDOW` times in `RESTART_WINDOW_S`; the engines it
left running are stopped first (they hold the port). One that exited having stopped or
given up on its engines (`engine down`, `max_restarts` spent) is left so.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from local_engine.config import EngineConfig, state_path
from local_engine.cpu_command import cpu_engine_installed
from local_engine.errors import EngineStateError
from local_engine.state import EngineRecord, read_record, write_record
from local_engine.supervisor import FINAL_STATES, live_owner, stop_orphan
from policies.engines import EngineSpec

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0
WATCH_INTERVAL_S = 1.0
RESTARTS_PER_WINDOW = 5
RESTART_WINDOW_S = 600.0
WATCH_JOIN_S = 5.0  # a watcher busy stopping a dead supervisor's engines is not awaited


def autostart_names(engines: Mapping[str, EngineSpec]) -> list[str]:
    names = []
    for name, spec in engines.items():
        if not spec.autostart:
            continue
        if spec.kind == "cpu" and not cpu_engine_installed():
            log.warning(
                "engine '%s' is not started: the CPU engine needs torch "
                "(pip install 'cascade-gateway[engine]'); its deployments stay unavailable",
                name,
            )
            continue
        names.append(name)
    return names


class Autostart:
    """The supervisor of some engines, run as a child process and restarted when it dies.

    autostart = Autostart(policy_path, {"local": spec}, run_dir)
    autostart.start()                 # the supervisor, and the thread watching it
    autostart.stop()                  # both, and whatever a dead supervisor left
    """

    def __init__(
        self,
        policy_path: Path,
        engines: Mapping[str, EngineSpec],
        run_dir: Path,
        *,
        interval_s: float = WATCH_INTERVAL_S,
        restarts: int = RESTARTS_PER_WINDOW,
        window_s: float = RESTART_WINDOW_S,
    ) -> None:
        self.engines = dict(engines)
        self.run_dir = run_dir
        self.argv = [sys.executable, "-m", "local_engine.cli", "up", "--policy", str(policy_path)]
        self.argv += ["--run-dir", str(run_dir)]
        for name in self.engines:
            self.argv += ["--engine", name]
        self.interval_s, self.restarts, self.window_s = interval_s, restarts, window_s
        self.process: subprocess.Popen[bytes] | None = None
        self._restarted_at: list[float] = []  # monotonic, within the window
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a new supervisor is started, or stop() begins
        self._thread = threading.Thread(
            target=self._watch, name="engine-supervisor-watch", daemon=True
        )

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def watching(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching, then the supervisor (it stops its engines; killed past
        `STOP_GRACE_S`), then any engine a dead supervisor left running."""
        with self._lock:  # no supervisor is started after this
            self._stopping.set()
            process = self.process
        if self._thread.is_alive():
            self._thread.join(WATCH_JOIN_S)
        _stop_process(process)
        self._stop_orphans()

    def _spawn(self) -> None:
        process = subprocess.Popen(self.argv, start_new_session=True)
        try:
            mark_starting(self.engines, self.run_dir, process.pid)
        except OSError:  # no records, so no watching: it must not run unseen
            _stop_process(process)
            raise
        self.process = process  # its records are written: the watcher may judge it

    def _watch(self) -> None:
        try:
            self._watch_until_stopped()
        except Exception:  # a thread that dies says so in the log, not only on stderr
            log.exception("the engine supervisor watch failed; its engines are not restarted")

    def _watch_until_stopped(self) -> None:
        while not self._stopping.wait(self.interval_s):
            process = self.process
            assert process is not None
            code = process.poll()  # reaps it: no zombie left
            if code is None or self._stopping.is_set():
                continue
            running = self._running(process.pid)
            if not running:
                log.info(
                    "the engine supervisor (pid %d) exited (%s) with its engines stopped "
                    "or failed; not restarted (see `cascade-gateway engine status`)",
                    process.pid,
                    _exit_reason(code),
                )
                return
            if not self._restart(process.pid, code, running):
                return

    def _running(self, pid: int) -> list[str]:
        """The engines whose records say the supervisor `pid` still runs them."""
        names = []
        for name in self.engines:
            try:
                record = read_record(state_path(self.run_dir, name))
            except EngineStateError:
                continue
            if record.supervisor_pid == pid and record.state not in FINAL_STATES:
                names.append(name)
        return names

    def _restart(self, pid: int, code: int, names: list[str]) -> bool:
        """Start a new supervisor after a backoff; False when giving up (or stopping)."""
        now = time.monotonic()
        self._restarted_at = [t for t in self._restarted_at if now - t < self.window_s]
        died = (
            f"the supervisor (pid {pid}) of engine(s) {', '.join(map(repr, names))} "
            f"died ({_exit_reason(code)})"
        )
        if len(self._restarted_at) >= self.restarts:
            log.error(
                "%s; giving up, it was restarted %d time(s) in %.0f s already: its engines "
                "are not restarted until the gateway is (or by `cascade-gateway engine up`)",
                died,
                len(self._restarted_at),
                self.window_s,
            )
            return False
        delay = self._backoff(len(self._restarted_at))
        log.error("%s; restarting it in %.1f s", died, delay)
        if self._stopping.wait(delay):
            return False
        self._stop_orphans()  # they hold the ports (and GPUs) the new one needs
        with self._lock:
            if self._stopping.is_set():
                return False
            try:
                self._spawn()
            except OSError as exc:
                log.error("cannot restart the engine supervisor, giving up: %s", exc)
                return False
        self._restarted_at.append(time.monotonic())
        log.info("engine supervisor restarted, pid %s", self.pid)
        return True

    def _backoff(self, restarts: int) -> float:
        first = max(spec.restart_backoff_s for spec in self.engines.values())
        most = max(spec.restart_backoff_max_s for spec in self.engines.values())
        return float(min(first * 2**restarts, most))

    def _stop_orphans(self) -> None:
        for name, spec in self.engines.items():
            stop_orphan(EngineConfig(name, spec, self.run_dir))


def start_engines(
    policy_path: Path, engines: Mapping[str, EngineSpec], run_dir: Path
) -> Autostart | None:
    """Start the supervisor of the autostart engines, watched, or None when there are
    none."""
    names = autostart_names(engines)
    if not names:
        return None
    log.info("starting engines %s (logs in %s)", ", ".join(names), run_dir)
    autostart = Autostart(policy_path, {name: engines[name] for name in names}, run_dir)
    autostart.start()
    return autostart


def mark_starting(engines: Mapping[str, EngineSpec], run_dir: Path, supervisor_pid: int) -> None:
    """Write each engine's state file as `starting`, in the name of the supervisor just
    launched (which takes the record as its own and replaces it as it goes). An engine
    whose record has a live supervisor is left alone: another one runs it (ours will
    refuse it), or ours already wrote it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for name, spec in engines.items():
        config = EngineConfig(name, spec, run_dir)
        if live_owner(config) is not None:
            continue
        record = EngineRecord(
            name,
            "starting",
            supervisor_pid,
            base_url=spec.api_base,
            log_path=str(config.log_path),
            started_at=now,
            updated_at=now,
            message="launched by cascade-gateway serve",
        )
        write_record(config.state_path, record)


def stop_engines(autostart: Autostart | None) -> None:
    """Stop the watch, and the supervisor (it stops its engines)."""
    if autostart is not None:
        autostart.stop()


def _stop_process(supervisor: subprocess.Popen[bytes] | None) -> None:
    """Ask the supervisor to stop its engines and wait for it (kill it past the grace)."""
    if supervisor is None or supervisor.poll() is not None:
        return
    supervisor.send_signal(signal.SIGTERM)
    try:
        supervisor.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning("the engine supervisor did not stop in %.0f s; killing it", STOP_GRACE_S)
        supervisor.kill()
        supervisor.wait()


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"

"""Engines started with the gateway: `cascade-gateway serve` runs the supervisor of the
policy's `autostart: true` engines as a child process and stops it on the way out.

    supervisor = start_engines(policy_path, policy.engines, run_dir)
    ...                                   # serve
    stop_engines(supervisor)              # SIGTERM: the supervisor stops its engines

The supervisor is `cascade-gateway engine up` in its own session (a Ctrl-C meant for the
gateway reaches it through `stop_engines`, once, in order). It inherits the gateway's
environment, which fills the policy's `${VAR}`s (an engine's `api_key`); the engines it
starts get only what `local_engine.environment` lets through. A `cpu` engine needs torch
(the `[engine]` extra); without it the engine is skipped with a warning and the local
tier stays unavailable, so routes fall back to the deployments that are.

Each engine's state file says `starting` from the moment its supervisor is launched: the
gateway, up before the supervisor has imported itself, reads that as the engine warming
(requests wait for it) rather than as a closed port counted against its breaker.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from local_engine.config import EngineConfig
from local_engine.cpu_command import cpu_engine_installed
from local_engine.state import EngineRecord, write_record
from local_engine.supervisor import live_owner
from policies.engines import EngineSpec

log = logging.getLogger(__name__)

STOP_GRACE_S = 60.0


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


def start_engines(
    policy_path: Path, engines: Mapping[str, EngineSpec], run_dir: Path
) -> subprocess.Popen[bytes] | None:
    """Start the supervisor of the autostart engines, or None when there are none."""
    names = autostart_names(engines)
    if not names:
        return None
    argv = [sys.executable, "-m", "local_engine.cli", "up", "--policy", str(policy_path)]
    argv += ["--run-dir", str(run_dir)]
    for name in names:
        argv += ["--engine", name]
    log.info("starting engines %s (logs in %s)", ", ".join(names), run_dir)
    supervisor = subprocess.Popen(argv, start_new_session=True)
    mark_starting({name: engines[name] for name in names}, run_dir, supervisor.pid)
    return supervisor


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


def stop_engines(supervisor: subprocess.Popen[bytes] | None) -> None:
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

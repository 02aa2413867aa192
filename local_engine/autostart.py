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
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from local_engine.cpu_command import cpu_engine_installed
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
    return subprocess.Popen(argv, start_new_session=True)


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

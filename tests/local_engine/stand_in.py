"""Helpers for supervisor tests: engines that run the stand-in `tests.fakes.vllm_process`
on free loopback ports, with quick supervision knobs; a supervisor run in a thread
(`Running`), and waiting for an engine's state file to say a state (`reaches`). Used by
test_supervisor and test_cpu_server; `free_port` and `ROOT` by more."""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
from pathlib import Path
from typing import Any

from local_engine.config import EngineConfig
from local_engine.errors import EngineStateError
from local_engine.state import EngineRecord, read_record
from local_engine.supervisor import Supervisor
from policies.engines import EngineSpec
from tests.support import eventually

ROOT = Path(__file__).parents[2]
FAKE = [sys.executable, "-m", "tests.fakes.vllm_process"]
# Quick supervision for tests: probe often, restart soon, stop fast.
FAST = {
    "health_interval_s": 0.05,
    "restart_backoff_s": 0.1,
    "restart_backoff_max_s": 0.4,
    "stop_timeout_s": 2.0,
    "startup_timeout_s": 10.0,
}


def fake_vllm_executable(directory: Path) -> Path:
    """A `vllm` executable in `directory` that runs the stand-in (`vllm serve MODEL
    --port ...`), for engines started as serve starts them."""
    script = directory / "vllm"
    script.write_text(
        f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m tests.fakes.vllm_process "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def fake_spec(**fields: Any) -> EngineSpec:
    return EngineSpec.model_validate({"model": "fake-model", "port": free_port(), **FAST, **fields})


def fake_config(name: str, run_dir: Path, *knobs: str, **fields: Any) -> EngineConfig:
    """An engine config whose command runs the stand-in with `knobs`."""

    def argv(spec: EngineSpec) -> list[str]:
        return [*FAKE, "--port", str(spec.port), "--served-model-name", spec.served_name, *knobs]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return EngineConfig(name, fake_spec(**fields), run_dir, argv_builder=argv, base_env=env)


class Running:
    """A supervisor run in a thread (no signal handlers there); `stop()` ends it."""

    def __init__(self, configs: list[EngineConfig]) -> None:
        self.supervisor = Supervisor(configs, tick_s=0.02)
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.exit_code = self.supervisor.run()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        self.supervisor.should_exit = True
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "supervisor did not stop"
        return self.exit_code


def state_of(config: EngineConfig) -> EngineRecord | None:
    """The engine's record from its state file; None while there is none to read."""
    try:
        return read_record(config.state_path)
    except EngineStateError:
        return None


def reaches(config: EngineConfig, state: str, timeout_s: float = 10.0) -> EngineRecord:
    """The engine's record once its state file says `state`."""

    def check() -> EngineRecord | None:
        record = state_of(config)
        return record if record is not None and record.state == state else None

    record: EngineRecord = eventually(check, timeout_s, f"{config.name} to be {state}")
    return record

"""Helpers for supervisor tests: engines that run the stand-in `tests.fakes.vllm_process`
on free loopback ports, with quick supervision knobs."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from local_engine.config import EngineConfig
from policies.engines import EngineSpec

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

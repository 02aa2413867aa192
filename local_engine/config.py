"""What the supervisor needs to run one engine: its spec, its files, its command.

    config = EngineConfig("small", spec, run_dir=Path("var/engines"))
    config.load()            # creates the directories, builds argv and environment
    config.argv, config.log_path, config.health_url

As in uvicorn's `Config`, construction has no side effects; `load()` has them all. The
command builder is injectable so tests run a stand-in instead of vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from local_engine.cpu_command import cpu_argv
from local_engine.environment import engine_env
from local_engine.vllm_command import vllm_argv
from policies.engines import EngineSpec

DEFAULT_RUN_DIR = Path("var/engines")

ArgvBuilder = Callable[[EngineSpec], list[str]]
# The command line of each kind of engine spec.
ARGV_BUILDERS: dict[str, ArgvBuilder] = {"vllm": vllm_argv, "cpu": cpu_argv}


class EngineConfig:
    """One engine's launch settings; `argv` and `env` exist once `load()` ran."""

    def __init__(
        self,
        name: str,
        spec: EngineSpec,
        run_dir: Path = DEFAULT_RUN_DIR,
        argv_builder: ArgvBuilder | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.spec = spec
        self.run_dir = run_dir
        self.argv_builder = argv_builder or ARGV_BUILDERS[spec.kind]
        self.base_env = base_env
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.loaded = False

    def load(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.argv = self.argv_builder(self.spec)
        # The supervisor's environment, less what an engine has no business seeing.
        self.env = engine_env(self.spec, os.environ if self.base_env is None else self.base_env)
        self.loaded = True

    @property
    def log_path(self) -> Path:
        log_dir = Path(self.spec.log_dir) if self.spec.log_dir else self.run_dir
        return log_dir / f"{self.name}.log"

    @property
    def state_path(self) -> Path:
        return state_path(self.run_dir, self.name)

    @property
    def stop_path(self) -> Path:
        """A file whose presence asks the supervisor to stop this engine (`engine down`)."""
        return stop_path(self.run_dir, self.name)

    @property
    def root_url(self) -> str:
        return self.spec.api_base.removesuffix("/v1")

    @property
    def health_url(self) -> str:
        return f"{self.root_url}/health"

    @property
    def metrics_url(self) -> str:
        return f"{self.root_url}/metrics"


def state_path(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.json"


def stop_path(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.stop"

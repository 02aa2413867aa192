"""The run directory's per-engine state files, so `engine status` and `engine down` work
from another invocation than the `engine up` that supervises.

    write_record(path, record)      # atomically, by the supervisor
    read_record(path)               # by anyone; EngineStateError when unreadable
    observed_state(record)          # its state, `unhealthy` once its supervisor is gone

A record names the supervisor's pid; `pid_alive` tells a live record from a stale one
(a supervisor killed with SIGKILL leaves its last record behind).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from local_engine.errors import EngineStateError

EngineStateType = Literal[
    "starting", "ready", "unhealthy", "backoff", "stopping", "stopped", "failed"
]
# States in which the engine's process group may be running.
RUNNING_STATES = frozenset({"starting", "ready", "unhealthy", "stopping"})


@dataclass(frozen=True)
class EngineRecord:
    """One engine as its supervisor last saw it; times are Unix seconds."""

    name: str
    state: EngineStateType
    supervisor_pid: int
    pid: int | None = None
    base_url: str = ""
    log_path: str = ""
    restarts: int = 0
    last_exit: int | None = None
    started_at: float | None = None
    ready_at: float | None = None
    updated_at: float = 0.0
    tokens_per_second: float | None = None
    acceptance_rate: float | None = None
    message: str = ""


def write_record(path: Path, record: EngineRecord) -> None:
    """Replace `path` with `record` atomically (readers never see half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(dataclasses.asdict(record), indent=2) + "\n")
    os.replace(partial, path)


def read_record(path: Path) -> EngineRecord:
    try:
        data = json.loads(path.read_text())
        return EngineRecord(**data)
    except FileNotFoundError as exc:
        raise EngineStateError(f"{path} does not exist; the engine was never started here") from exc
    except (OSError, ValueError, TypeError) as exc:
        raise EngineStateError(f"{path} is not a readable engine state file: {exc}") from exc


def observed_state(record: EngineRecord) -> EngineStateType:
    """The record's state as a reader should take it: a supervisor killed mid-run leaves
    its last record behind, and an engine nobody supervises any more (no probes, no
    restarts; it may still answer) is `unhealthy`, whatever that record says."""
    if record.state in ("stopped", "failed") or pid_alive(record.supervisor_pid):
        return record.state
    return "unhealthy"


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid runs. A zombie (exited, not yet reaped by its
    parent, which in a container may be a PID 1 that never reaps) counts as gone."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no procfs (macOS): trust kill(0)
    return stat[stat.rfind(")") + 2 :].startswith("Z")

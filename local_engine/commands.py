"""`cascade-gateway engine up|status|down`: the policy's vLLM engines from the command line.

    cascade-gateway engine up --policy policy.yaml              # foreground; Ctrl-C stops
    cascade-gateway engine up --policy policy.yaml --detach     # returns once ready
    cascade-gateway engine status --policy policy.yaml [--json]
    cascade-gateway engine down --policy policy.yaml [--engine small]

`up` supervises in the foreground until SIGINT/SIGTERM, then stops its engines. With
`--detach` it starts that same supervisor as a background process (its log in
`<run-dir>/supervisor.log`), waits until every engine is ready or has failed, prints
the status and exits. `status` and `down` work from any invocation: they read the state
files in the run directory; `down` asks the supervisor to stop an engine (a `<name>.stop`
file) and stops the process group itself when the supervisor is gone. Only `up` hands the
engine's `api_key` to vLLM, so only `up` refuses an `api_key: ${VAR}` whose VAR is unset
(`${VAR:-}` is a key that may be unset: the engine then runs without one); `status` and
`down` never read the key, so an on-call shell without the secret can inspect and stop.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx

from local_engine.config import DEFAULT_RUN_DIR, EngineConfig, state_path, stop_path
from local_engine.errors import EngineError, EngineStartError, EngineStateError
from local_engine.health import probe_health
from local_engine.metrics import EngineMetrics, parse_vllm_metrics
from local_engine.process import stop_group
from local_engine.state import RUNNING_STATES, EngineRecord, pid_alive, read_record, write_record
from local_engine.supervisor import FINAL_STATES, Supervisor
from policies import DEFAULT_POLICY_PATH, PolicyError, load_policy
from policies.engines import EngineSpec
from policies.errors import Problem

STATUS_TIMEOUT_S = 1.0
DOWN_GRACE_S = 10.0  # beyond the engine's stop_timeout_s, for the supervisor to notice
DETACH_GRACE_S = 10.0
POLL_S = 0.1
SPAWN_SCRIPT = """
import subprocess, sys
with open(sys.argv[1], "ab") as log:
    child = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
print(child.pid)
"""
SETTLED_STATES = frozenset({"ready", *FINAL_STATES})
COLUMNS = ("ENGINE", "PID", "STATE", "HEALTH", "RUN", "WAIT", "KV%", "TOK/S", "ACCEPT", "RESTARTS")


@dataclass(frozen=True)
class EngineStatus:
    """One line of `engine status`."""

    name: str
    pid: int | None
    state: str
    health: str
    running: float | None
    waiting: float | None
    kv_cache_percent: float | None
    tokens_per_second: float | None
    acceptance_rate: float | None
    restarts: int
    base_url: str
    log_path: str
    message: str


def add_vllm_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `up`, `status` and `down` under the `engine` group."""
    up = _add_command(commands, "up", "start the policy's vLLM engines and supervise them")
    up.add_argument("--detach", action="store_true", help="supervise in the background")
    up.set_defaults(func=run_up)
    status = _add_command(commands, "status", "show the engines' state, health and load")
    status.add_argument("--json", action="store_true", help="one JSON object per engine")
    status.set_defaults(func=run_status)
    down = _add_command(commands, "down", "stop engines started by `engine up`")
    down.set_defaults(func=run_down)


def _add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help)
    parser.add_argument(
        "--policy",
        type=Path,
        default=_serving_policy(),
        help="policy file or directory (default: $CASCADE_POLICY, as `serve` reads it, "
        "else the shipped policy)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        dest="engines",
        metavar="NAME",
        help="(repeatable) default: all",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=_serving_run_dir(),
        help=f"state and logs (default: where `serve` keeps its engines', `engines/` beside "
        f"$CASCADE_SPOOL_PATH, else {DEFAULT_RUN_DIR})",
    )
    return parser


# `serve` reads these settings from the environment; the engine commands default to the
# same, so that they find the engines a `serve` started (read here as plain variables:
# this package does not import the gateway's settings).
def _serving_policy() -> Path:
    return Path(os.environ.get("CASCADE_POLICY") or DEFAULT_POLICY_PATH)


def _serving_run_dir() -> Path:
    spool = os.environ.get("CASCADE_SPOOL_PATH")
    return Path(spool).parent / "engines" if spool else DEFAULT_RUN_DIR


def run_up(args: argparse.Namespace) -> int:
    try:
        specs = _selected_engines(args, launching=True)
        if args.detach:
            return _up_detached(args, specs)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        configs = [EngineConfig(name, spec, args.run_dir) for name, spec in specs.items()]
        return Supervisor(configs).run()
    except (PolicyError, EngineError) as exc:
        print(exc, file=sys.stderr)
        return 2 if isinstance(exc, PolicyError) else 1


def run_status(args: argparse.Namespace) -> int:
    try:
        specs = _selected_engines(args)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    with httpx.Client() as client:
        rows = [engine_status(name, spec, args.run_dir, client) for name, spec in specs.items()]
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
    else:
        print(format_table(rows))
    return 0


def run_down(args: argparse.Namespace) -> int:
    try:
        specs = _selected_engines(args)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 2
    records = dict(_records(specs, args.run_dir))
    for name in records:
        stop_path(args.run_dir, name).touch()
    for name, record in records.items():
        print(f"{name}: {stop_engine(specs[name], record, args.run_dir)}")
    return 0


def engine_status(name: str, spec: EngineSpec, run_dir: Path, client: httpx.Client) -> EngineStatus:
    """An engine's recorded state plus a live look at its /health and /metrics."""
    root = spec.api_base.removesuffix("/v1")
    health = probe_health(f"{root}/health", client, STATUS_TIMEOUT_S)
    metrics = _scrape(f"{root}/metrics", client) if health == "ok" else None
    try:
        record: EngineRecord | None = read_record(state_path(run_dir, name))
    except EngineStateError:
        record = None
    state: str = "not started" if record is None else record.state
    if (
        record is not None
        and record.state in RUNNING_STATES
        and not pid_alive(record.supervisor_pid)
    ):
        state = f"{record.state} (supervisor gone)"
    kv = None if metrics is None or metrics.kv_cache_usage is None else metrics.kv_cache_usage * 100
    return EngineStatus(
        name=name,
        pid=record.pid if record else None,
        state=state,
        health=health,
        running=metrics.running if metrics else None,
        waiting=metrics.waiting if metrics else None,
        kv_cache_percent=kv,
        tokens_per_second=record.tokens_per_second if record else None,
        acceptance_rate=record.acceptance_rate if record else None,
        restarts=record.restarts if record else 0,
        base_url=spec.api_base,
        log_path=record.log_path if record else "",
        message=record.message if record else "",
    )


def format_table(rows: list[EngineStatus]) -> str:
    lines = [COLUMNS]
    for row in rows:
        lines.append(
            (
                row.name,
                _cell(row.pid),
                row.state,
                row.health,
                _cell(row.running, "{:.0f}"),
                _cell(row.waiting, "{:.0f}"),
                _cell(row.kv_cache_percent, "{:.1f}"),
                _cell(row.tokens_per_second, "{:.1f}"),
                _cell(row.acceptance_rate, "{:.2f}"),
                str(row.restarts),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def stop_engine(spec: EngineSpec, record: EngineRecord, run_dir: Path) -> str:
    """Wait for the supervisor to stop the engine (its stop file is written); stop the
    process group directly when no live supervisor does. Returns what happened."""
    path = state_path(run_dir, record.name)
    deadline = time.monotonic() + spec.stop_timeout_s + DOWN_GRACE_S
    while pid_alive(record.supervisor_pid) and time.monotonic() < deadline:
        record = read_record(path)
        if record.state in FINAL_STATES:
            stop_path(run_dir, record.name).unlink(missing_ok=True)
            return record.state
        time.sleep(POLL_S)
    stop_path(run_dir, record.name).unlink(missing_ok=True)
    if record.state not in RUNNING_STATES or record.pid is None:
        return f"not running ({record.state})"
    stopped = stop_group(record.pid, spec.stop_timeout_s)
    write_record(
        path,
        replace(record, state="stopped", updated_at=time.time(), message="stopped by engine down"),
    )
    return "stopped (no live supervisor)" if stopped else "stopped (process was gone)"


def _selected_engines(
    args: argparse.Namespace, *, launching: bool = False
) -> dict[str, EngineSpec]:
    """The engines `--engine` names (default: all the policy declares).

    `launching` (`up` alone: it hands `api_key` to vLLM) also refuses an engine whose
    `api_key: ${VAR}` has VAR unset, rather than start it open to anyone; `${VAR:-}` says
    the key may be unset, and the engine then runs without one, as the gateway calls it.
    `status` and `down` never read the key."""
    loaded = load_policy(args.policy)
    engines = loaded.policy.engines
    if not engines:
        raise PolicyError([_problem(args.policy, "engines", "the policy declares no engines")])
    names: list[str] = args.engines or list(engines)
    unknown = [name for name in names if name not in engines]
    if unknown:
        message = f"no engine named {', '.join(unknown)}; declared: {', '.join(engines)}"
        raise PolicyError([_problem(args.policy, "engines", message)])
    if launching:
        problems = [
            _problem(args.policy, f"engines.{name}.api_key", _unset_key_message(unset[0]))
            for name in names
            if (unset := loaded.unset_env.get(f"engines.{name}.api_key"))
        ]
        if problems:
            raise PolicyError(problems)
    return {name: engines[name] for name in names}


def _unset_key_message(variable: str) -> str:
    return (
        f"api_key references ${{{variable}}}, which is unset; engine up hands the key to "
        f"vLLM: set {variable}, or write ${{{variable}:-}} to run the engine without a key "
        "while it is unset"
    )


def _problem(path: Path, field: str, message: str) -> Problem:
    return Problem(path, None, None, field, message)


def _records(specs: dict[str, EngineSpec], run_dir: Path) -> Iterator[tuple[str, EngineRecord]]:
    for name in specs:
        try:
            yield name, read_record(state_path(run_dir, name))
        except EngineStateError:
            print(f"{name}: not running (no state in {run_dir})")


def _scrape(url: str, client: httpx.Client) -> EngineMetrics | None:
    try:
        response = client.get(url, timeout=STATUS_TIMEOUT_S)
        return parse_vllm_metrics(response.text) if response.status_code == 200 else None
    except (httpx.HTTPError, EngineError):
        return None


def _up_detached(args: argparse.Namespace, specs: dict[str, EngineSpec]) -> int:
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.run_dir / "supervisor.log"
    argv = [sys.executable, "-m", "local_engine.cli", "up", "--policy", str(args.policy.resolve())]
    argv += ["--run-dir", str(args.run_dir.resolve())]
    for name in args.engines or []:
        argv += ["--engine", name]
    pid = _spawn_detached(argv, log_path)
    limit = max(spec.startup_timeout_s for spec in specs.values()) + DETACH_GRACE_S
    settled = _wait_settled(pid, specs, args.run_dir, time.monotonic() + limit)
    print(f"supervisor pid {pid} (log {log_path})")
    run_status(argparse.Namespace(**{**vars(args), "json": False}))
    return 0 if settled else 1


def _spawn_detached(argv: list[str], log_path: Path) -> int:
    """Start `argv` through a short-lived intermediate process, so it is nobody's child
    here (no zombie to reap, no Popen left running); returns its pid."""
    spawn = [sys.executable, "-c", SPAWN_SCRIPT, str(log_path), *argv]
    done = subprocess.run(spawn, capture_output=True, check=False)
    if done.returncode != 0:
        raise EngineStartError(f"cannot start the supervisor: {done.stderr.decode().strip()}")
    return int(done.stdout)


def _wait_settled(pid: int, specs: dict[str, EngineSpec], run_dir: Path, deadline: float) -> bool:
    """Wait until the supervisor's engines are all ready (True) or one failed, the
    supervisor exited or the deadline passed (False)."""
    while time.monotonic() < deadline and pid_alive(pid):
        states = [_state_under(pid, state_path(run_dir, name)) for name in specs]
        if all(state in SETTLED_STATES for state in states):
            return all(state == "ready" for state in states)
        time.sleep(POLL_S)
    return False


def _state_under(supervisor_pid: int, path: Path) -> str | None:
    try:
        record = read_record(path)
    except EngineStateError:
        return None
    return record.state if record.supervisor_pid == supervisor_pid else None


def _cell(value: float | None, form: str = "{}") -> str:
    return "-" if value is None else form.format(value)

"""The autostart supervisor `serve` starts is watched: killed, it is reaped, logged as an
error and started again (the engine it left running is replaced), and meanwhile the
engine is not reported ready; restarts are bounded; stopping, during a backoff too,
stops everything.

Over real processes: `local_engine.autostart` runs `engine up` on the vLLM stand-in; the
last test runs `cascade-gateway serve` itself, with two workers (the watch is in the
main process, whose child the supervisor is)."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.health.sla import SlaGuard, build_guard
from gateway.metrics import Metrics
from local_engine.autostart import Autostart, start_engines, stop_engines
from local_engine.errors import EngineStateError
from local_engine.state import EngineRecord, observed_state, pid_alive, read_record
from policies import load_policy
from policies.schema import Policy
from tests.local_engine.stand_in import fake_vllm_executable, free_port
from tests.support import eventually, serving

POLICY = """
engines:
  local:
    model: fake-model
    executable: {executable}
    port: {port}
    autostart: true
    extra_args: ["--load-seconds", "0.2"]
    health_interval_s: 0.1
    stop_timeout_s: 2
    restart_backoff_s: {backoff}
deployments:
  local:
    provider: openai
    engine: local
    model: fake-model
    tier: local
routes:
  auto:
    strategy: fallback
    deployments: [local]
"""
ADMIN_KEY = "fake-watch-admin-key"
START_S = 15.0  # a supervisor's imports, then the stand-in's "load"


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    return fake_vllm_executable(tmp_path)


@pytest.fixture
def started() -> Iterator[list[Autostart]]:
    autostarts: list[Autostart] = []
    yield autostarts
    for autostart in autostarts:
        stop_engines(autostart)


def policy_at(tmp_path: Path, executable: Path, backoff: float) -> tuple[Path, Policy, int]:
    port = free_port()
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(executable=executable, port=port, backoff=backoff))
    return path, load_policy(path).policy, port


def record(run_dir: Path) -> EngineRecord | None:
    try:
        return read_record(run_dir / "local.json")
    except EngineStateError:
        return None


def ready(run_dir: Path, supervisor: Callable[[int], bool]) -> EngineRecord:
    """The engine's record once it is ready under a supervisor `supervisor(pid)` accepts."""

    def check() -> EngineRecord | None:
        current = record(run_dir)
        if current and current.state == "ready" and supervisor(current.supervisor_pid):
            return current
        return None

    return eventually(check, START_S, "the engine ready", 0.05)


def start_ready(
    path: Path, policy: Policy, run_dir: Path, started: list[Autostart]
) -> tuple[Autostart, EngineRecord]:
    """The policy's engines started as serve starts them, once their engine is ready."""
    autostart = start_engines(path, policy.engines, run_dir)
    assert autostart is not None
    started.append(autostart)
    return autostart, ready(run_dir, lambda pid: pid == autostart.pid)


def reported(guard: SlaGuard) -> object:
    """The engine state `/admin/policy` shows for the deployment."""
    return guard.health_report("local")["engine_state"]


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "local_engine.autostart" and r.levelno == logging.ERROR
    ]


def reaped(pid: int) -> bool:
    """Gone from the process table: no zombie left (one keeps its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def test_a_killed_supervisor_is_reaped_logged_and_replaced(
    tmp_path: Path, fake_vllm: Path, started: list[Autostart], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="local_engine")
    run_dir = tmp_path / "engines"
    path, policy, port = policy_at(tmp_path, fake_vllm, backoff=1)
    autostart, first = start_ready(path, policy, run_dir, started)
    guard = build_guard(Metrics(), policy, None, "test:", run_dir)
    guard.warmup.watch(policy)
    assert reported(guard) == "ready"

    killed = autostart.process
    assert killed is not None
    os.kill(killed.pid, signal.SIGKILL)
    # Its last record still says `ready`; with no supervisor, the engine is not.
    eventually(lambda: reported(guard) == "unhealthy", 1.0, "the engine reported unhealthy")
    (line,) = eventually(lambda: errors(caplog), 3.0, "the error line")
    assert line == (
        f"the supervisor (pid {killed.pid}) of engine(s) 'local' died (killed by SIGKILL); "
        "restarting it in 1.0 s"
    )
    eventually(lambda: reaped(killed.pid), 3.0, "the killed supervisor reaped")
    assert killed.returncode == -signal.SIGKILL

    second = ready(run_dir, lambda pid: pid != killed.pid)
    assert second.supervisor_pid == autostart.pid
    assert second.pid != first.pid and not pid_alive(first.pid)  # its orphan was replaced
    assert reported(guard) == "ready"
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat, timeout=5)
    assert reply.status_code == 200

    stop_engines(autostart)
    assert not autostart.watching
    assert autostart.process is not None and autostart.process.returncode == 0
    assert not pid_alive(second.pid)
    stopped = record(run_dir)
    assert stopped is not None and stopped.state == "stopped"


def test_stopping_during_the_backoff_starts_nothing_and_stops_the_orphan(
    tmp_path: Path, fake_vllm: Path, started: list[Autostart], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="local_engine")
    run_dir = tmp_path / "engines"
    path, policy, _ = policy_at(tmp_path, fake_vllm, backoff=60)
    autostart, engine = start_ready(path, policy, run_dir, started)
    killed = autostart.pid
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    eventually(lambda: errors(caplog), 3.0, "the error line")

    begun = time.monotonic()
    stop_engines(autostart)
    assert time.monotonic() - begun < 5.0
    assert not autostart.watching and autostart.pid == killed
    assert reaped(killed) and not pid_alive(engine.pid)  # the engine it left: stopped


def test_restarts_are_bounded_then_the_watch_gives_up(
    tmp_path: Path, fake_vllm: Path, started: list[Autostart], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="local_engine")
    run_dir = tmp_path / "engines"
    path, policy, _ = policy_at(tmp_path, fake_vllm, backoff=0.1)
    autostart = Autostart(path, policy.engines, run_dir, interval_s=0.2, restarts=1)
    autostart.start()
    started.append(autostart)

    def owned_by(pid: int | None) -> bool:
        current = record(run_dir)
        return current is not None and current.supervisor_pid == pid

    pids = []
    for _ in range(2):
        pid = autostart.pid
        assert pid is not None and owned_by(pid)
        pids.append(pid)
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda gone=pid: autostart.pid != gone or not autostart.watching, 5.0, "a verdict"
        )
    assert not autostart.watching and autostart.pid == pids[-1]
    assert len(errors(caplog)) == 2
    assert errors(caplog)[-1].startswith(f"the supervisor (pid {pids[-1]}) of engine(s) 'local'")
    assert "; giving up, it was restarted 1 time(s) in 600 s already:" in errors(caplog)[-1]
    assert all(reaped(pid) for pid in pids)
    left = record(run_dir)
    assert left is not None and observed_state(left) == "unhealthy"


def test_serve_watches_its_supervisor_and_stops_everything(tmp_path: Path, fake_vllm: Path) -> None:
    path, _, engine_port = policy_at(tmp_path, fake_vllm, backoff=1)
    path.write_text(path.read_text() + 'admin_keys: ["${WATCH_ADMIN_KEY}"]\n')
    run_dir = tmp_path / "engines"  # serve's: beside its spool
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
    env |= {"CASCADE_SPOOL_PATH": str(tmp_path / "spool"), "WATCH_ADMIN_KEY": ADMIN_KEY}
    base = f"http://127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(path), "--workers", "2"]
    log = tmp_path / "gateway.log"

    def admin_state() -> object:
        admin = {"authorization": f"Bearer {ADMIN_KEY}", "connection": "close"}
        body = httpx.get(f"{base}/admin/policy", headers=admin, timeout=5).json()
        return body["deployments"]["local"]["health"]["engine_state"]

    with log.open("wb") as stderr:
        serve = subprocess.Popen([*argv, "--port", base.rsplit(":", 1)[1]], env=env, stderr=stderr)
        try:
            serving(serve, lambda: httpx.get(f"{base}/healthz").is_success, 60, log.read_text)
            first = ready(run_dir, lambda pid: True)
            eventually(lambda: admin_state() == "ready", 5.0, "the engine reported ready")
            killed = first.supervisor_pid
            os.kill(killed, signal.SIGKILL)
            eventually(lambda: admin_state() == "unhealthy", 1.0, "the engine reported unhealthy")
            line = (
                rf"ERROR local_engine\.autostart \[-\]: the supervisor \(pid {killed}\) .*SIGKILL"
            )
            eventually(lambda: re.search(line, log.read_text()), 3.0, "the error line")
            eventually(lambda: reaped(killed), 3.0, "the killed supervisor reaped")
            second = ready(run_dir, lambda pid: pid != killed)
            eventually(lambda: admin_state() == "ready", 5.0, "the engine reported ready again")
            assert httpx.get(f"http://127.0.0.1:{engine_port}/health").status_code == 200
        finally:
            serve.terminate()
            serve.wait(60)
    assert serve.returncode == 0, log.read_text()
    assert reaped(second.supervisor_pid) and not pid_alive(second.pid)


def test_a_supervisor_whose_records_cannot_be_written_is_not_left_running(
    tmp_path: Path, fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unrecorded, the watch could not judge it: it is stopped, and the error raised."""
    path, policy, _ = policy_at(tmp_path, fake_vllm, backoff=1.0)
    autostart = Autostart(path, policy.engines, tmp_path / "run")
    autostart.argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    spawned: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded_popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        spawned.append(popen(*args, **kwargs))  # type: ignore[call-overload]
        return spawned[-1]

    def disk_full(*args: object) -> None:
        raise OSError("no space left on device (test)")

    monkeypatch.setattr(subprocess, "Popen", recorded_popen)
    monkeypatch.setattr("local_engine.autostart.mark_starting", disk_full)
    with pytest.raises(OSError, match="no space left"):
        autostart.start()
    assert len(spawned) == 1 and spawned[0].poll() is not None  # stopped and reaped
    assert autostart.process is None and not autostart.watching


def test_a_watch_that_fails_says_so_in_the_log(
    tmp_path: Path, fake_vllm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path, policy, _ = policy_at(tmp_path, fake_vllm, backoff=1.0)
    autostart = Autostart(path, policy.engines, tmp_path / "run")

    def broken() -> None:
        raise PermissionError("killpg of a reused pid (test)")

    autostart._watch_until_stopped = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="local_engine.autostart"):
        autostart._watch()  # what the watch thread runs
    assert errors(caplog) == ["the engine supervisor watch failed; its engines are not restarted"]

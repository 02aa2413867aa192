"""The supervisor over real processes (the vLLM stand-in) and loopback sockets."""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from local_engine.config import EngineConfig
from local_engine.errors import EngineStateError
from local_engine.state import EngineRecord, pid_alive, write_record
from local_engine.supervisor import Supervisor
from tests.local_engine.stand_in import Running, fake_config, reaches, state_of
from tests.support import eventually


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "engines"


@pytest.fixture
def supervise() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for running in started:
        if running.thread.is_alive():
            running.stop()


def start(supervise: list[Running], *configs: EngineConfig) -> Running:
    running = Running(list(configs))
    supervise.append(running)
    return running


def test_waits_for_readiness_serves_and_stops(run_dir: Path, supervise: list[Running]) -> None:
    config = fake_config("small", run_dir, "--load-seconds", "0.4")
    running = start(supervise, config)

    starting = reaches(config, "starting")
    with pytest.raises(httpx.ConnectError):  # the port stays closed while the model loads
        httpx.get(config.health_url)
    ready = reaches(config, "ready")
    reply = httpx.post(f"{config.spec.api_base}/chat/completions", json={"messages": []})

    assert reply.json()["choices"][0]["message"]["content"] == "Hello from the fake vLLM."
    assert ready.pid == starting.pid and pid_alive(ready.pid)
    assert ready.ready_at is not None and ready.started_at is not None
    assert ready.base_url == config.spec.api_base
    assert running.stop() == 0
    stopped = reaches(config, "stopped")
    assert not pid_alive(stopped.pid)
    assert stopped.message == "supervisor exited"
    log = config.log_path.read_text()
    assert "starting: " in log and "fake-vllm: serving on" in log


def test_crashes_restart_with_doubling_backoff_then_fail(
    run_dir: Path, supervise: list[Running]
) -> None:
    config = fake_config(
        "crashy", run_dir, "--crash-after-s", "0.1", "--exit-code", "3", max_restarts=2
    )
    running = start(supervise, config)

    failed = reaches(config, "failed", timeout_s=15)

    assert failed.restarts == 2 and failed.last_exit == 3
    assert "exited with code 3; max_restarts spent" in failed.message
    assert config.log_path.read_text().count("starting: ") == 3
    running.thread.join(5)
    assert running.exit_code == 1  # every engine done, one failed


def test_backoff_delays_double_up_to_the_cap(
    run_dir: Path, supervise: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="local_engine.supervisor")
    config = fake_config("crashy", run_dir, "--crash-after-s", "0", max_restarts=4)
    start(supervise, config)

    reaches(config, "failed", timeout_s=15)

    delays = re.findall(r"restarting in ([0-9.]+)s", caplog.text)
    assert delays == ["0.1", "0.2", "0.4", "0.4"]  # doubling from 0.1, capped at 0.4
    assert config.log_path.read_text().count("starting: ") == 5


def test_unhealthy_engine_is_restarted(run_dir: Path, supervise: list[Running]) -> None:
    config = fake_config("sick", run_dir, "--unhealthy-after-s", "0.2", unhealthy_after=2)
    start(supervise, config)

    first = reaches(config, "ready")
    backoff = reaches(config, "backoff")
    again = reaches(config, "ready")

    assert "/health probe: unhealthy (2 probes in a row)" in backoff.message
    assert again.pid != first.pid and again.restarts == 1
    assert not pid_alive(first.pid)


def test_engine_not_ready_in_time_is_stopped(run_dir: Path, supervise: list[Running]) -> None:
    config = fake_config(
        "slow", run_dir, "--load-seconds", "30", startup_timeout_s=0.3, max_restarts=0
    )
    start(supervise, config)

    failed = reaches(config, "failed")

    assert "not ready after startup_timeout_s=0.3" in failed.message
    assert not pid_alive(failed.pid)


def test_sigterm_ignored_means_sigkill_after_stop_timeout(
    run_dir: Path, supervise: list[Running]
) -> None:
    config = fake_config("stubborn", run_dir, "--ignore-sigterm", stop_timeout_s=0.3)
    running = start(supervise, config)
    ready = reaches(config, "ready")

    began = time.monotonic()
    running.stop()

    assert time.monotonic() - began >= 0.3
    assert not pid_alive(ready.pid)
    assert reaches(config, "stopped").last_exit == -9


def test_stop_reaches_the_whole_process_group(run_dir: Path, supervise: list[Running]) -> None:
    config = fake_config("parent", run_dir, "--spawn-child")
    running = start(supervise, config)
    reaches(config, "ready")
    child = int(re.findall(r"child pid (\d+)", config.log_path.read_text())[0])
    assert pid_alive(child)

    running.stop()

    eventually(lambda: not pid_alive(child), 3, "the engine's child to die")


def test_stop_file_stops_one_engine_and_the_other_keeps_running(
    run_dir: Path, supervise: list[Running]
) -> None:
    first, second = fake_config("a", run_dir), fake_config("b", run_dir)
    running = start(supervise, first, second)
    reaches(first, "ready")
    reaches(second, "ready")

    first.stop_path.touch()

    stopped = reaches(first, "stopped")
    assert stopped.message == "stopped by engine down" and not first.stop_path.exists()
    assert reaches(second, "ready", timeout_s=0.1).message == ""
    second.stop_path.touch()
    running.thread.join(5)
    assert running.exit_code == 0  # every engine stopped: the supervisor is done


def test_engine_of_another_live_supervisor_is_refused(run_dir: Path) -> None:
    config = fake_config("taken", run_dir)
    run_dir.mkdir(parents=True)
    # pid 1 is alive and is not us: another supervisor, as far as the record tells
    write_record(config.state_path, EngineRecord("taken", "ready", supervisor_pid=1, pid=1))

    with pytest.raises(EngineStateError, match=r"engine 'taken' is supervised by pid 1"):
        Supervisor([config]).run()


def test_measured_throughput_lands_in_the_state_file(
    run_dir: Path, supervise: list[Running]
) -> None:
    config = fake_config("busy", run_dir, "--tokens-per-second", "2000")
    start(supervise, config)
    reaches(config, "ready")

    def measured() -> EngineRecord | None:
        record = state_of(config)
        return record if record and record.tokens_per_second else None

    record: EngineRecord = eventually(measured, 5, "a measured rate")

    assert record.tokens_per_second is not None and 1000 < record.tokens_per_second < 3000
    assert record.acceptance_rate == pytest.approx(2 / 3)


def test_engine_left_by_a_dead_supervisor_is_stopped_first(
    run_dir: Path, supervise: list[Running]
) -> None:
    config = fake_config("orphaned", run_dir)
    config.load()
    orphan = subprocess.Popen([*config.argv], env=config.env, start_new_session=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_record(
        config.state_path,
        EngineRecord("orphaned", "ready", supervisor_pid=dead.pid, pid=orphan.pid),
    )

    start(supervise, config)

    assert orphan.wait(5) is not None  # stopped, so the new engine can have its port

    def restarted() -> bool:
        record = state_of(config)
        return record is not None and record.pid not in (None, orphan.pid)

    eventually(restarted, 5, "a new engine")
    assert reaches(config, "ready").pid != orphan.pid

"""Warm-up, piece by piece: which deployments a state file makes warming (whoever runs
the engine: `serve` or `engine up`), how a /health answer ends it, what the guard does
not count, how the executor orders and waits, and the record `serve` writes first."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.errors import UpstreamTimeout
from gateway.health.breaker import BreakerSettings, CircuitBreakers
from gateway.health.warmup import Warmup
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamReply, UpstreamStatus
from local_engine.autostart import mark_starting
from local_engine.state import EngineRecord, EngineStateType, read_record, write_record
from policies import load_policy
from policies.schema import Policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.scripted import BODY, ScriptedClient, answers, deployment, executor, fails
from tests.local_engine.stand_in import free_port

REFUSED = UpstreamConnectFailed("cannot connect")
BROKEN = UpstreamStatus("boom", status=500)

POLICY = """
engines:
  local:
    model: some/model
    port: {port}
deployments:
  local:
    provider: openai
    engine: local
    model: some/model
    tier: local
  elsewhere:            # the same engine's name, but another server's address
    provider: openai
    engine: local
    api_base: http://127.0.0.1:9/v1
    model: some/model
    tier: local
routes:
  auto:
    strategy: fallback
    deployments: [local, elsewhere]
"""


def policy(tmp_path: Path, port: int) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(port=port))
    return load_policy(path).policy


def record(state: EngineStateType, supervisor_pid: int, started_at: float = 1000.0) -> EngineRecord:
    return EngineRecord("local", state, supervisor_pid, started_at=started_at)


@pytest.fixture
def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """A live process other than this one (another supervisor)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process.pid
    process.kill()
    process.wait()


def test_a_starting_engine_warms_its_deployments_while_its_supervisor_lives(
    tmp_path: Path, dead_pid: int
) -> None:
    changes: list[tuple[str, bool]] = []
    warmup = Warmup(tmp_path, on_change=lambda name, warming: changes.append((name, warming)))
    warmup.watch(policy(tmp_path, 8100))
    assert warmup.watched == ["local"]  # `elsewhere` talks to another server
    warmup.read()
    assert warmup.warming == set()  # no state file: not an engine run from here
    path = tmp_path / "local.json"
    write_record(path, record("starting", os.getpid()))  # as `engine up` writes it
    warmup.read()
    assert warmup.warming == {"local"}
    assert warmup.state_of("local") is not None and warmup.warming_for_s("local")
    write_record(path, record("starting", dead_pid))  # left by a dead supervisor
    warmup.read()
    assert warmup.warming == set()
    write_record(path, record("starting", os.getpid()))
    warmup.read()
    write_record(path, record("ready", os.getpid()))
    warmup.read()
    assert warmup.warming == set()
    assert [warming for _, warming in changes] == [False, True, False, True, False]


async def test_health_answering_ends_the_warm_up_of_that_start(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    port = int(fake_openai.url.removesuffix("/v1").rsplit(":", 1)[1])
    warmup = Warmup(tmp_path)
    warmup.watch(policy(tmp_path, port))
    path = tmp_path / "local.json"
    write_record(path, record("starting", os.getpid()))
    fake_openai.healthy = False  # up, but not serving yet
    await warmup.refresh()
    assert warmup.warming == {"local"}
    fake_openai.healthy = True
    await warmup.refresh()
    assert warmup.warming == set()  # before the supervisor's own probe says so
    warmup.read()
    assert warmup.warming == set()  # the file still says starting: that start answered
    write_record(path, record("starting", os.getpid(), started_at=2000.0))  # a restart
    warmup.read()
    assert warmup.warming == {"local"}
    await warmup.close()


async def test_wait_returns_once_the_deployment_is_not_warming() -> None:
    warmup = Warmup()
    warmup.warming = {"a"}
    asyncio.get_running_loop().call_later(0.1, warmup.warming.clear)
    started = time.monotonic()
    await asyncio.wait_for(warmup.wait("a"), 2.0)
    assert time.monotonic() - started >= 0.09


def test_refused_connections_while_warming_do_not_count() -> None:
    _, guard = executor(ScriptedClient({}), CircuitBreakers(BreakerSettings(failure_threshold=2)))
    guard.warmup.warming = {"a"}
    for _ in range(5):
        guard.failed("a", REFUSED)
    assert guard.breakers.state("a") == "closed"
    assert guard.latency.predict("a").error_rate == 0.0
    guard.failed("a", BROKEN)  # an answer is a verdict, loading or not
    guard.warmup.warming = set()
    guard.failed("a", REFUSED)  # ready, then refused: a real failure
    assert guard.breakers.state("a") == "open"


async def test_a_refused_connection_reads_the_state_file_again(tmp_path: Path) -> None:
    """`engine up` has just started the engine; no refresh saw its file yet."""
    path = tmp_path / "local.json"
    calls = 0

    async def engine() -> UpstreamReply:
        nonlocal calls
        calls += 1
        if calls > 1:
            return UpstreamReply({"choices": [{"message": {"content": "hi"}}]})
        write_record(path, record("starting", os.getpid()))
        later = record("ready", os.getpid())
        asyncio.get_running_loop().call_later(0.3, write_record, path, later)
        raise REFUSED

    run, guard = executor(ScriptedClient({"local": engine}))
    guard.breakers.settings = BreakerSettings(failure_threshold=1)
    guard.warmup = Warmup(tmp_path)
    guard.warmup.watch(policy(tmp_path, free_port()))
    refreshing = asyncio.create_task(guard.warmup.run())
    started = time.monotonic()
    try:
        done = await run.complete([deployment("local", retries=1)], "chat", BODY, 5.0)
    finally:
        refreshing.cancel()
        await guard.warmup.close()
    assert done.deployment.name == "local" and calls == 2
    assert time.monotonic() - started >= 0.29  # the retry waited for the load
    assert guard.breakers.state("local") == "closed"


async def test_other_deployments_are_tried_before_one_warming() -> None:
    client = ScriptedClient({"a": answers(), "b": answers()})
    run, guard = executor(client)
    guard.warmup.warming = {"a"}
    done = await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0)
    assert done.deployment.name == "b" and client.calls == ["b"]


async def test_one_warming_is_waited_for_when_the_others_fail() -> None:
    client = ScriptedClient({"a": answers(), "b": fails(BROKEN)})
    run, guard = executor(client)
    guard.warmup.warming = {"a"}
    asyncio.get_running_loop().call_later(0.2, guard.warmup.warming.clear)
    started = time.monotonic()
    done = await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0)
    assert done.deployment.name == "a" and client.calls == ["b", "a"]
    assert time.monotonic() - started >= 0.19
    assert not guard.breakers.is_ejected("a")


async def test_a_deadline_passed_while_warming_says_the_engine_is_loading() -> None:
    client = ScriptedClient({"a": answers()})
    run, guard = executor(client)
    guard.warmup.warming = {"a"}
    with pytest.raises(UpstreamTimeout) as caught:
        await run.complete([deployment("a")], "chat", BODY, 0.1)
    assert client.calls == []
    assert caught.value.code == "engine_loading" and caught.value.status == 504
    assert "deployment 'a' is still loading its model" in caught.value.message
    assert "request limit of 0.1s" in caught.value.message
    assert caught.value.headers == {"retry-after": "1"}


def test_serve_marks_its_engines_starting_in_its_supervisor_s_name(
    tmp_path: Path, live_pid: int
) -> None:
    engines = policy(tmp_path, 8100).engines
    run_dir = tmp_path / "engines"
    mark_starting(engines, run_dir, supervisor_pid=live_pid)
    written = read_record(run_dir / "local.json")
    assert written.state == "starting" and written.supervisor_pid == live_pid
    assert written.started_at is not None and written.base_url == engines["local"].api_base
    # A record whose supervisor lives stays as it is: it runs the engine (or ours wrote it).
    write_record(run_dir / "local.json", replace(written, state="ready"))
    mark_starting(engines, run_dir, supervisor_pid=os.getpid())
    assert read_record(run_dir / "local.json").state == "ready"

"""A request still running when the shutdown grace (`CASCADE_SHUTDOWN_GRACE_S`) ends:
uvicorn cancels its task. What was in flight is priced as cut off (its prompt, once),
in the ledger before the process exits, and the client is told: a 503 `shutting_down`
in OpenAI's shape, or a stream's in-band error event.

The executor's and the proxy's parts run in-process on scripted upstreams; the rest
over real sockets: `cascade-gateway serve` in a subprocess (one worker and two), SIGTERM while a
slow fake upstream holds the request, and the ledger read from Redis once it exited.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore, SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.executor import Hedge, Loser, Opened
from gateway.pipeline.proxy import Proxy
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime
from gateway.upstreams.base import UpstreamReply, UpstreamStatus, UpstreamTimedOut
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.ledger_fixtures import free_port
from tests.gateway.scripted import (
    BODY,
    Behaviour,
    ScriptedClient,
    answers,
    deployment,
    executor,
    fails,
)
from tests.support import eventually, serving

# --- the executor: cancelled runs price what they had in flight, once ---------------


def hangs() -> Behaviour:
    async def reply() -> UpstreamReply:
        await asyncio.sleep(60)
        raise AssertionError("unreachable")

    return reply


async def cancelled_run(
    client: ScriptedClient,
    candidates: list[DeploymentRuntime],
    calls: int,
    hedge: Hedge | None = None,
) -> list[str]:
    """Run `candidates`, cancel the run once `calls` upstream calls were made (and the
    loop had a moment), and return the deployments priced as cut off."""
    run, _ = executor(client)
    priced: list[str] = []
    task = asyncio.create_task(
        run.complete(
            candidates,
            "chat",
            BODY,
            30.0,
            hedge,
            cut_off=lambda d: priced.append(d.name),
        )
    )
    while len(client.calls) < calls:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # never swallowed
        await task
    return priced


async def test_a_cancelled_request_prices_its_attempt_in_flight() -> None:
    client = ScriptedClient({"a": hangs(), "b": answers()})
    priced = await cancelled_run(client, [deployment("a"), deployment("b")], calls=1)
    assert priced == ["a"]


async def test_a_cancelled_hedged_request_prices_every_chain_in_flight_once() -> None:
    client = ScriptedClient({"a": hangs(), "b": hangs()})
    candidates = [deployment("a"), deployment("b")]
    priced = await cancelled_run(client, candidates, calls=2, hedge=Hedge(0.02))
    assert sorted(priced) == ["a", "b"]


def slow_to_cancel() -> Behaviour:
    """An attempt whose cancellation takes a while (a connection closing)."""

    async def reply() -> UpstreamReply:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)
            raise
        raise AssertionError("unreachable")

    return reply


async def test_a_hedge_winner_is_priced_when_cancelled_while_the_losers_close() -> None:
    """b answers while a's chain is still closing; the request is cancelled then."""
    client = ScriptedClient({"a": slow_to_cancel(), "b": answers()})
    candidates = [deployment("a"), deployment("b")]
    priced = await cancelled_run(client, candidates, calls=2, hedge=Hedge(0.02))
    assert sorted(priced) == ["a", "b"]


async def test_an_attempt_its_timeout_priced_is_not_priced_again_when_cancelled() -> None:
    # a timed out (priced then; not retried: it had the prompt) and b is in flight when
    # the request is cancelled.
    client = ScriptedClient({"a": fails(UpstreamTimedOut("read timeout")), "b": hangs()})
    candidates = [deployment("a", retries=3, backoff_s=1.0), deployment("b")]
    priced = await cancelled_run(client, candidates, calls=2)
    assert priced == ["a", "b"]


async def test_a_cancelled_run_waiting_to_retry_prices_nothing() -> None:
    # a answered 502 (no cost) and waits to retry: nothing is in flight.
    client = ScriptedClient({"a": fails(UpstreamStatus("bad gateway", status=502))})
    priced = await cancelled_run(client, [deployment("a", retries=3, backoff_s=1.0)], calls=1)
    assert priced == []


# --- over real sockets: `serve`, SIGTERM, the grace ends -----------------------------

POLICY = """
deployments:
  upstream:
    api_base: ${UPSTREAM_URL}
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 2}
routes:
  auto: {deployments: [upstream]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
KEY = "fake-shutdown-key"
AUTH = {"authorization": f"Bearer {KEY}"}
GRACE_S = 1
PROMPT = "What is the capital of France? Answer in one word."
NANOS_PER_PROMPT_TOKEN = 1_000  # input_per_mtok: 1 -> 1e-6 USD a token


class Gateway:
    """`cascade-gateway serve` in a subprocess, on the test's Redis prefix."""

    def __init__(self, tmp_path: Path, upstream: FakeOpenAI, redis_url: str, prefix: str) -> None:
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        self.spool = tmp_path / "ledger.spool"
        self.log = tmp_path / "gateway.log"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "REDIS"))}
        env |= {
            "GATEWAY_TEST_KEY": KEY,
            "UPSTREAM_URL": upstream.url,
            "REDIS_URL": redis_url,
            "CASCADE_REDIS_PREFIX": prefix,
            "CASCADE_SPOOL_PATH": str(self.spool),
            "CASCADE_SHUTDOWN_GRACE_S": str(GRACE_S),
        }
        if cache := os.environ.get("CASCADE_CACHE_DIR"):
            env["CASCADE_CACHE_DIR"] = cache
        self.argv = [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(policy)]
        self.argv += ["--port", str(self.port)]
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, workers: int) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*self.argv, "--workers", str(workers)],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        ready = lambda: httpx.get(f"{self.base}/readyz").status_code == 200  # noqa: E731
        serving(self.proc, ready, 60, self.log.read_text)

    def terminate_and_wait(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def upstream() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def gateway(
    tmp_path: Path, upstream: FakeOpenAI, redis_url: str, redis_prefix: str
) -> Iterator[Gateway]:
    server = Gateway(tmp_path, upstream, redis_url, redis_prefix)
    yield server
    server.stop()


def in_background(send: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Run `send()` in a thread; its result (or exception) lands in the dict."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = send()
        except Exception as exc:  # reported by the test's assertions
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


async def records_of(redis_url: str, prefix: str, request_id: str) -> list[SpendRecord]:
    store = RedisStore(redis_url, prefix=prefix)
    try:
        return [r for r in await store.events() if r.request_id == request_id]
    finally:
        await store.close()


def chat(stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": PROMPT}]}
    return {**body, "stream": True} if stream else body


def assert_charged_the_prompt_once(records: list[SpendRecord], cut_id: str) -> None:
    partial = [r for r in records if r.status == "partial"]
    assert [r.record_id for r in partial] == [cut_id]
    (cut,) = partial
    assert (cut.deployment, cut.completion_tokens) == ("upstream", 0)
    assert cut.prompt_tokens > 0
    assert cut.cost_nanos == cut.prompt_tokens * NANOS_PER_PROMPT_TOKEN


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_request_cut_at_the_grace_is_answered_503_and_charged_its_prompt(
    gateway: Gateway, upstream: FakeOpenAI, redis_url: str, redis_prefix: str, workers: int
) -> None:
    upstream.delay_s = 30  # still upstream when the grace ends
    gateway.start(workers)
    url = f"{gateway.base}/v1/chat/completions"
    thread, result = in_background(lambda: httpx.post(url, json=chat(), headers=AUTH, timeout=30))
    eventually(lambda: upstream.requests, 10, "the upstream to have the prompt")
    gateway.terminate_and_wait()
    thread.join(timeout=10)
    response: httpx.Response = result.get("value") or pytest.fail(f"no reply: {result}")
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["retry-after"] == "1"
    assert response.json() == {
        "error": {
            "message": "the gateway is shutting down; retry",
            "type": "api_error",
            "param": None,
            "code": "shutting_down",
        }
    }
    request_id = response.headers["x-request-id"]
    assert request_id.startswith("req_")
    # Written to Redis before the process exited (flushed at shutdown, not spooled).
    records = await records_of(redis_url, redis_prefix, request_id)
    assert_charged_the_prompt_once(records, f"{request_id}:t1")
    (failed,) = [r for r in records if r.record_id == request_id]  # counts the request
    assert (failed.status, failed.cost_nanos, failed.sla_met) == ("error", 0, None)
    assert len(records) == 2
    assert not gateway.spool.exists() or not gateway.spool.read_text().strip()


async def test_a_stream_cut_at_the_grace_ends_with_an_error_event_and_is_priced(
    gateway: Gateway, upstream: FakeOpenAI, redis_url: str, redis_prefix: str
) -> None:
    upstream.stall_after_chunks = 2  # two chunks relayed, then nothing until the grace ends
    gateway.start(1)
    url = f"{gateway.base}/v1/chat/completions"
    started = threading.Event()
    head: dict[str, str] = {}

    def read() -> bytes:
        with httpx.stream("POST", url, json=chat(stream=True), headers=AUTH, timeout=30) as r:
            head.update(r.headers)
            chunks = []
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                started.set()
            return b"".join(chunks)

    thread, result = in_background(read)
    assert started.wait(10), result
    gateway.terminate_and_wait()
    thread.join(timeout=10)
    body: bytes = result.get("value") or pytest.fail(f"no stream: {result}")
    events = [e for e in body.decode().split("\n\n") if e]
    assert events[0].startswith("data: {")
    assert events[-1] == (
        'data: {"error":{"message":"the gateway is shutting down; retry","type":"api_error",'
        '"param":null,"code":"shutting_down"}}'
    )
    request_id = head["x-request-id"]
    records = await records_of(redis_url, redis_prefix, request_id)
    assert [(r.record_id, r.status) for r in records] == [(request_id, "partial")]
    assert records[0].prompt_tokens > 0 and records[0].completion_tokens > 0


# --- the proxy: a stream that opened but was never relayed --------------------------


class Ledger(list[SpendRecord]):
    def submit(self, record: SpendRecord) -> None:
        self.append(record)


class Events:
    """An upstream stream's remaining events: none come; `aclose` runs `on_close`."""

    def __init__(self, on_close: Callable[[], Awaitable[None]]) -> None:
        self.on_close = on_close

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> list[bytes]:
        await asyncio.sleep(60)
        raise StopAsyncIteration

    async def aclose(self) -> None:
        await self.on_close()


class HedgedStreamOpened:
    """An executor whose stream opens on `winner` after a hedge; the losing hedge's
    stream (which opened too late) takes long to close."""

    def __init__(self, winner: DeploymentRuntime, loser: DeploymentRuntime) -> None:
        self.winner, self.loser = winner, loser
        self.closing = asyncio.Event()
        self.rest_closed = False

    async def open_stream(self, *args: Any, **kwargs: Any) -> Opened:
        async def slow_to_close() -> None:
            self.closing.set()
            await asyncio.sleep(60)

        async def closed() -> None:
            self.rest_closed = True

        loser = Loser(self.loser, ([CHUNK], Events(slow_to_close)))
        return Opened(self.winner, [CHUNK], Events(closed), 2, [loser], hedges=1)


CHUNK = b'{"choices":[{"index":0,"delta":{"content":"Paris is the capital"}}]}'


async def test_a_stream_cancelled_before_it_is_relayed_is_priced_partial() -> None:
    metrics, ledger = Metrics(), Ledger()
    winner, loser = deployment("a"), deployment("b")
    opened = HedgedStreamOpened(winner, loser)
    proxy = Proxy(opened, Accountant(ledger, metrics), metrics)  # type: ignore[arg-type]
    route = RouteRuntime("auto", "fallback", ("a", "b"), None, None)
    body = {"messages": [{"role": "user", "content": PROMPT}], "stream": True}
    call = Call(
        "req_1", "team", "key", route, True, time.perf_counter(),
        endpoint="chat", body=body, deadline_s=10.0,
    )  # fmt: skip
    task = asyncio.create_task(proxy._stream(call, [winner, loser]))
    await opened.closing.wait()  # the losing hedge is being closed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [(r.record_id, r.deployment, r.status) for r in ledger] == [
        ("req_1:h1", "b", "partial"),
        ("req_1", "a", "partial"),  # the request's own: it counts the request
    ]
    assert ledger[1].completion_tokens > 0 and ledger[1].sla_met is None
    assert opened.rest_closed


# -- the outermost layer: only the server's cancels at shutdown are answered -----------


async def _slow_app(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(30)


def _render(request: Any, error: Any) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status)


async def test_a_cancel_without_a_shutdown_signal_goes_on() -> None:
    """An app run in-process (a caller's timeout, another server's cancel on a client
    that left) must see its cancellation go on, not a 503 in its place."""
    from gateway.http.shutdown import Requests

    requests = Requests()
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    task = asyncio.create_task(requests.serve(_slow_app, {"type": "http"}, None, send, _render))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sent == [] and requests.running == 0


async def test_after_a_shutdown_signal_the_cancelled_request_is_answered() -> None:
    from gateway.http.shutdown import Requests

    requests = Requests()
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        restore = requests.watch_shutdown()
        os.kill(os.getpid(), signal.SIGTERM)  # noted, then the server's handler runs
        assert seen == [signal.SIGTERM]
        restore()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert requests.stopping
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    task = asyncio.create_task(requests.serve(_slow_app, scope, None, send, _render))
    await asyncio.sleep(0.01)
    task.cancel()
    await task  # answered, not raised
    assert sent[0]["status"] == 503
    assert b'"shutting_down"' in sent[1]["body"]

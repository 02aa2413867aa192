"""Big request bodies are parsed and checked off the event loop, a few huge ones at a
time; a client that hangs up before its body is in ends its request quietly.

Before: a 17 MiB completions body (millions of token-id arrays) held the event loop for
seconds while it was parsed, so every other request of every tenant (`/healthz` too)
waited; a client gone mid-upload was an unexpected error (a 500 and two tracebacks).

Over real sockets: the gateway under uvicorn on loopback, a fake upstream, real Redis;
and `checked` itself, in-process, for where the work runs and how much runs at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.errors import InvalidRequest
from gateway.http import endpoints
from gateway.http.bridges.messages import MessagesTranslation
from gateway.http.bridges.responses import ResponsesTranslation
from gateway.http.endpoints import HUGE_BODY_BYTES, MAX_HUGE_PARSES, OFF_LOOP_BYTES, checked
from gateway.http.validation import parse_body, parse_object
from gateway.upstreams.base import EndpointType
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway
from tests.gateway.server import GatewayServer
from tests.support import eventually

POLICY = """
deployments:
  cheap:
    api_base: ${FAKE_URL}
    model: fake-model
    price: {input_per_mtok: 1, output_per_mtok: 2}
  premium:
    api_base: ${FAKE_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 20}
routes:
  auto: {deployments: [cheap]}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", allowed_routes: [auto]}
"""
JSON = {"content-type": "application/json"}
HI = {"role": "user", "content": "hi"}
# Sizes of the bodies below: one for each way off the loop.
SIZES = {"big": OFF_LOOP_BYTES * 3, "huge": HUGE_BODY_BYTES * 2}


@pytest.fixture
def gateway(start_gateway: StartGateway, fake_openai: FakeOpenAI) -> GatewayServer:
    return start_gateway(POLICY, FAKE_URL=fake_openai.url)


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog at INFO, uvicorn's error log included (it does not reach the root logger)."""
    server_log = logging.getLogger("uvicorn.error")
    server_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        server_log.removeHandler(caplog.handler)


def token_arrays(model: str, count: int, last: Any = None) -> bytes:
    """A completions body whose prompt is `count` one-token arrays (and `last`): the
    costliest shape per byte to parse and check."""
    prompt: list[Any] = [[1]] * count + ([last] if last is not None else [])
    return orjson.dumps({"model": model, "prompt": prompt, "max_tokens": 1})


# --- (a) the event loop keeps serving while a huge body is parsed


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/completions", token_arrays("premium", 2_000_000)),
        (
            "/v1/messages",
            orjson.dumps({"model": "premium", "max_tokens": 1, "messages": [HI] * 200_000}),
        ),
    ],
    ids=["completions", "messages"],
)
def test_healthz_answers_while_a_huge_body_is_parsed(
    gateway: GatewayServer, path: str, raw: bytes
) -> None:
    """`/healthz`, polled throughout, never waits for more than a fraction of the time
    the huge request takes (most of it, before); the huge one is still refused
    (the key may not use the route it names), after its body was read and checked."""
    polls: list[tuple[float, float]] = []  # (started, took)
    stop = threading.Event()

    def poll() -> None:
        with httpx.Client(base_url=gateway.url, timeout=60) as client:
            while not stop.is_set():
                started = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                polls.append((started, time.perf_counter() - started))
                time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    eventually(lambda: len(polls) >= 3, what="/healthz answering")
    with httpx.Client(base_url=gateway.url, headers=AUTH | JSON, timeout=120) as client:
        small = {"model": "premium", "max_tokens": 1, "prompt": "hi", "messages": [HI]}
        client.post(path, json=small)  # the bridges' library loaded first: not timed
        began = time.perf_counter()
        response = client.post(path, content=raw)
        took = time.perf_counter() - began
    stop.set()
    poller.join(timeout=60)
    assert response.status_code == 403, response.text
    during = [t for started, t in polls if began <= started <= began + took]
    assert len(during) >= 5, (took, during)
    assert max(during) < took * 0.5, (took, max(during))


# --- (b) the same answers as before, whatever the body's size


def _endpoint_error(endpoint: EndpointType) -> Callable[[bytes], InvalidRequest]:
    def error(raw: bytes) -> InvalidRequest:
        with pytest.raises(InvalidRequest) as caught:
            parse_body(raw, endpoint)
        return caught.value

    return error


def _bridge_error(kind: type[MessagesTranslation | ResponsesTranslation]) -> Any:
    def error(raw: bytes) -> InvalidRequest:
        with pytest.raises(InvalidRequest) as caught:
            kind.check(parse_object(raw))
        return caught.value

    return error


def _chat(count: int) -> bytes:
    messages = [HI] * count + [{"role": "robot", "content": "x"}]
    return orjson.dumps({"model": "auto", "messages": messages})


def _completions(count: int) -> bytes:
    return token_arrays("auto", count // 4, last=[-1])


def _embeddings(count: int) -> bytes:
    return orjson.dumps({"model": "auto", "input": ["hi"] * (count // 5) + [""]})


def _messages(count: int) -> bytes:
    messages = [HI] * count + [{"role": "robot", "content": "x"}]
    return orjson.dumps({"model": "auto", "max_tokens": 5, "messages": messages})


def _responses(count: int) -> bytes:
    items = [{"type": "message", **HI}] * count + [{"type": "message", "role": "robot"}]
    return orjson.dumps({"model": "auto", "input": items})


INVALID = [
    # (path, body of about n bytes -> bytes, the error the checks raise for it)
    ("/v1/chat/completions", lambda n: _chat(n // 30), _endpoint_error("chat")),
    ("/v1/completions", _completions, _endpoint_error("completions")),
    ("/v1/embeddings", _embeddings, _endpoint_error("embeddings")),
    ("/v1/messages", lambda n: _messages(n // 30), _bridge_error(MessagesTranslation)),
    ("/v1/messages/count_tokens", lambda n: _messages(n // 30), _bridge_error(MessagesTranslation)),
    ("/v1/responses", lambda n: _responses(n // 45), _bridge_error(ResponsesTranslation)),
]


def error_of(response: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize(("path", "body", "expected"), INVALID, ids=[path for path, *_ in INVALID])
def test_a_big_invalid_body_gets_the_same_400(
    gateway: GatewayServer,
    path: str,
    body: Callable[[int], bytes],
    expected: Callable[[bytes], InvalidRequest],
    size: str,
) -> None:
    """A body whose last element is wrong is checked to its end, off the loop, and gets
    the 400 the checks give it in-process (message and field); so does one that is not
    JSON (cut one byte short)."""
    raw = body(SIZES[size])
    assert len(raw) >= (HUGE_BODY_BYTES if size == "huge" else OFF_LOOP_BYTES)
    with httpx.Client(base_url=gateway.url, headers=AUTH | JSON, timeout=60) as client:
        for sent in (raw, raw[:-1]):
            error = expected(sent)
            response = client.post(path, content=sent)
            assert response.status_code == 400, response.text
            assert error_of(response)["message"] == error.message
            if "messages" not in path:  # Anthropic's error shape names no field
                assert error_of(response)["param"] == error.param


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/messages", "/v1/messages/count_tokens"])
def test_a_big_body_for_a_route_the_key_may_not_use_gets_the_same_403(
    gateway: GatewayServer, path: str, size: str
) -> None:
    """Checked (off the loop) before the key's routes are: the 403 of a small body."""
    count = SIZES[size] // 30
    if path == "/v1/completions":
        small = orjson.dumps({"model": "premium", "prompt": "hi", "max_tokens": 1})
        raw = token_arrays("premium", count * 30 // 4)
    else:
        small = orjson.dumps({"model": "premium", "max_tokens": 1, "messages": [HI]})
        raw = orjson.dumps({"model": "premium", "max_tokens": 1, "messages": [HI] * count})
    assert len(raw) >= (HUGE_BODY_BYTES if size == "huge" else OFF_LOOP_BYTES)
    with httpx.Client(base_url=gateway.url, headers=AUTH | JSON, timeout=60) as client:
        refused = client.post(path, content=small)
        response = client.post(path, content=raw)
    assert refused.status_code == response.status_code == 403, response.text
    assert error_of(response) == error_of(refused)


def test_a_big_valid_body_is_answered(gateway: GatewayServer, fake_openai: FakeOpenAI) -> None:
    """Parsed off the loop, the body reaches the upstream as it was sent."""
    prompt = [[7, 8, 9]] * (HUGE_BODY_BYTES // 8)
    body = {"model": "auto", "prompt": prompt, "max_tokens": 1, "seed": 3}
    with httpx.Client(base_url=gateway.url, headers=AUTH, timeout=60) as client:
        response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    (sent,) = fake_openai.requests
    assert sent["body"]["prompt"] == prompt and sent["body"]["seed"] == 3


# --- (c) a client gone mid-upload


def metric_lines(base: str, name: str) -> list[str]:
    return [
        line for line in httpx.get(f"{base}/metrics").text.splitlines() if line.startswith(name)
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
    ],
)
def test_a_client_gone_mid_upload_ends_its_request_quietly(
    gateway: GatewayServer, errors_logged: pytest.LogCaptureFixture, path: str
) -> None:
    """It says a body of 100 bytes follows, sends 8 and hangs up: the request ends with
    an INFO line, counted under status 499 (as a client gone before its answer is), no
    500 and no error logged."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {CLIENT_KEY}\r\n"
        "content-type: application/json\r\ncontent-length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
        sock.sendall(head.encode() + b'{"model"')
        time.sleep(0.1)  # the gateway is reading the body when the client goes
    requests = "cascade_requests_total{"
    eventually(
        lambda: [line for line in metric_lines(gateway.url, requests) if 'status="499"' in line],
        what="the request counted",
    )
    lines = metric_lines(gateway.url, requests)
    assert not [line for line in lines if 'status="500"' in line], lines
    ((line,),) = [[line for line in lines if 'status="499"' in line]]
    assert 'route="-"' in line and line.endswith(" 1.0"), line
    assert not metric_lines(gateway.url, "cascade_errors_total{")
    records = errors_logged.records
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], records
    gone = [r for r in records if "went away before its body" in r.getMessage()]
    assert len(gone) == 1 and gone[0].levelno == logging.INFO
    assert gone[0].getMessage().startswith("request req_"), gone[0].getMessage()


# --- where `checked` runs the work, and how much at once


async def test_small_bodies_are_checked_inline_others_in_worker_threads() -> None:
    def thread() -> str:
        return threading.current_thread().name

    here = threading.current_thread().name
    assert await checked(OFF_LOOP_BYTES - 1, thread) == here
    big = await checked(OFF_LOOP_BYTES, thread)
    huge = await checked(HUGE_BODY_BYTES, thread)
    assert big != here and not big.startswith("body-parse")
    assert huge.startswith("body-parse")


@pytest.mark.parametrize("size", [OFF_LOOP_BYTES, HUGE_BODY_BYTES])
async def test_checks_off_the_loop_raise_the_same_errors_and_leave_the_collector_on(
    size: int,
) -> None:
    raw = token_arrays("auto", size // 4, last=[-1])
    with pytest.raises(InvalidRequest) as inline:
        parse_body(raw, "completions")
    with pytest.raises(InvalidRequest) as off_loop:
        await checked(size, parse_body, raw, "completions")
    assert (off_loop.value.message, off_loop.value.param, off_loop.value.code) == (
        inline.value.message,
        inline.value.param,
        inline.value.code,
    )
    valid = token_arrays("auto", size // 4)
    assert await checked(size, parse_body, valid, "completions") == parse_body(valid, "completions")
    assert gc.isenabled()


async def test_at_most_max_huge_parses_run_at_once_even_when_their_requests_go() -> None:
    """The others wait; a request cancelled while its parse runs (its client gone) does
    not free a place before that parse ends."""
    lock, release = threading.Lock(), threading.Event()
    running, most = [0], [0]

    def parse() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            release.wait(10)
        finally:
            with lock:
                running[0] -= 1

    tasks = [asyncio.create_task(checked(HUGE_BODY_BYTES, parse)) for _ in range(5)]
    try:
        await asyncio.to_thread(eventually, lambda: running[0] == MAX_HUGE_PARSES)
        tasks[0].cancel()
        await asyncio.sleep(0.2)
        assert running[0] == most[0] == MAX_HUGE_PARSES
    finally:
        release.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.to_thread(eventually, lambda: running[0] == 0 and endpoints._pauses == 0)
    assert most[0] == MAX_HUGE_PARSES and gc.isenabled()


async def test_the_collector_runs_while_parses_overlap() -> None:
    """Paused while any parse off the loop runs, the collector still runs as one ends
    once enough new objects wait: parses one after another, each overlapping the next,
    cannot keep cyclic garbage from being collected."""
    started, release = threading.Event(), threading.Event()

    def long_parse() -> None:
        started.set()
        release.wait(10)

    long = asyncio.create_task(checked(HUGE_BODY_BYTES, long_parse))
    try:
        await asyncio.to_thread(started.wait, 10)
        assert not gc.isenabled()
        collected = threading.Event()

        class Node:
            pass

        for _ in range(endpoints.COLLECT_AFTER_OBJECTS):
            node = Node()
            node.itself = node  # type: ignore[attr-defined]
        weakref.finalize(node, collected.set)
        del node
        assert not collected.is_set()
        await checked(OFF_LOOP_BYTES, int)  # a short parse ends while the long one runs
        assert collected.is_set()
        assert not gc.isenabled()
    finally:
        release.set()
        await long
    assert gc.isenabled()

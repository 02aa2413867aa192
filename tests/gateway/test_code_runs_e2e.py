"""A cascade route that runs code answers against their own examples, through the
running gateway: two answers alike to the eye, one whose claimed example fails, and
only that one goes on to the premium tier; without the runs the two are one to the
verifier."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.http.app import load_check
from gateway.ledger import RedisStore
from gateway.pipeline import code_runs
from gateway.pipeline.code_runs import run_code
from gateway.pipeline.scoring import AnswerVerifier
from gateway.runtime import build_runtime, log_new_warnings
from policies import PolicyReloader, load_policy
from router import sandbox
from router.code_examples import ExampleRun
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import route_policy
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.support import requires

pytestmark = requires(sandbox.available(), "the sandbox")
QUESTION = {"role": "user", "content": "Write a python function to add two numbers."}


def adder(op: str) -> str:
    return f"```python\ndef add(a, b):\n    return a {op} b\n\nprint(add(2, 3))  # Output: 5\n```"


RIGHT, WRONG = adder("+"), adder("-")


def scores(code_runs: bool) -> tuple[float, float]:
    """The shipped verifier's scores of the right and the wrong answer, as the route
    judges them (with their runs, or without)."""
    verify, body = AnswerVerifier(), {"messages": [QUESTION]}
    run = {RIGHT: ExampleRun(1, 0), WRONG: ExampleRun(0, 1)}
    right, wrong = (
        verify(
            "chat",
            body,
            {"choices": [{"message": {"content": answer}}]},
            code_run=run[answer] if code_runs else None,
        )
        for answer in (RIGHT, WRONG)
    )
    return right, wrong


@pytest.mark.parametrize("wrong", [False, True], ids=["holds", "fails"])
async def test_an_answer_whose_own_example_fails_escalates(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    wrong: bool,
) -> None:
    right_score, wrong_score = scores(code_runs=True)
    assert wrong_score < right_score - 0.01, (wrong_score, right_score)
    with FakeOpenAI() as premium:
        fake_openai.reply_text, premium.reply_text = (WRONG if wrong else RIGHT), RIGHT
        policy = route_policy((right_score + wrong_score) / 2, run_code=True)
        base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
        body = {"model": "careful", "messages": [QUESTION]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 200
        assert response.headers["x-cascade-escalations"] == ("1" if wrong else "0")
        assert response.json()["choices"][0]["message"]["content"] == RIGHT
        assert len(premium.requests) == (1 if wrong else 0)
        request_id = response.headers["x-request-id"]
        first = await wait_for_record(ledger_store, request_id)
        assert first.deployment == "cheap" and first.verifier_score is not None
        assert abs(first.verifier_score - (wrong_score if wrong else right_score)) < 1e-6
        if wrong:
            assert (await wait_for_record(ledger_store, f"{request_id}:1")).deployment == "premium"
        metrics = httpx.get(f"{base}/metrics").text
        outcome = "failed" if wrong else "held"
        assert f'cascade_code_runs_total{{outcome="{outcome}",route="careful"}} 1.0' in metrics


def test_without_runs_the_two_answers_are_alike_and_both_kept(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    """The same route without `run_code_examples`: the verifier cannot tell them apart
    (so it is the run that decides above), and nothing is run."""
    right_score, wrong_score = scores(code_runs=False)
    assert abs(right_score - wrong_score) < 0.01
    with FakeOpenAI() as premium:
        fake_openai.reply_text = WRONG
        policy = route_policy(min(right_score, wrong_score) - 0.01, run_code=False)
        base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
        body = {"model": "careful", "messages": [QUESTION]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert response.headers["x-cascade-escalations"] == "0"
        assert premium.requests == []
        assert "cascade_code_runs_total{" not in httpx.get(f"{base}/metrics").text


def test_a_host_that_cannot_isolate_code_keeps_the_runs_off(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The policy asks for runs, the host has no user namespaces: the route verifies
    without them (no code is run) and the load says why."""
    path = tmp_path / "policy.yaml"
    path.write_text(route_policy(0.5, run_code=True))
    env = {"CHEAP_URL": "http://127.0.0.1:9", "PREMIUM_URL": "http://127.0.0.1:9"}
    for name, value in {**env, "GATEWAY_TEST_KEY": "fake-key"}.items():
        monkeypatch.setenv(name, value)
    assert build_runtime(load_policy(path)).routes["careful"].run_code_examples
    monkeypatch.setattr(sandbox, "available", lambda: "no user namespaces (test)")
    runtime = build_runtime(load_policy(path))
    assert not runtime.routes["careful"].run_code_examples
    [(level, message)] = runtime.warnings
    assert level == logging.ERROR and "route careful: run_code_examples is off" in message
    assert "no user namespaces (test)" in message
    with caplog.at_level(logging.ERROR, logger="gateway.runtime"):
        log_new_warnings(runtime, None)  # what serve and a reload log
    assert message in caplog.text


async def test_a_run_that_cannot_start_or_has_no_time_is_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answer is then verified without the run (the request goes on), and the
    metric says why: error (logged), or none (the deadline came first)."""
    body = {"messages": [QUESTION]}
    reply = {"choices": [{"message": {"content": WRONG}}]}
    soon = time.monotonic() + 10
    assert await run_code("chat", body, reply, soon) == (ExampleRun(0, 1), "failed")
    assert await run_code("chat", body, reply, time.monotonic()) == (None, "none")

    def broken(*args: object, **kwargs: object) -> ExampleRun:
        raise OSError("EAGAIN (test)")

    monkeypatch.setattr(sandbox, "run_examples", broken)
    assert await run_code("chat", body, reply, soon) == (None, "error")


SLEEPER = {
    "choices": [
        {
            "message": {
                "content": "```python\nimport time\ntime.sleep(60)\n\ndef add(a, b):\n"
                "    return a + b\n\nprint(add(2, 3))  # Output: 5\n```"
            }
        }
    ]
}


async def test_answers_that_sleep_hold_no_other_check_to_its_deadline() -> None:
    """Every run slot held by code that sleeps: a check queued behind them gives up
    within its share of the request's time (its cascade can still escalate), one that
    finds every place taken is refused at once, and the places come back after."""
    body = {"messages": [QUESTION]}
    wrong = {"choices": [{"message": {"content": WRONG}}]}
    start = time.monotonic()
    running = [
        asyncio.create_task(run_code("chat", body, SLEEPER, start + 4))
        for _ in range(code_runs.MAX_RUNNING)
    ]
    await asyncio.sleep(0.1)
    queued_ends = time.monotonic() + 2
    assert await run_code("chat", body, wrong, queued_ends) == (None, "none")
    assert time.monotonic() < queued_ends  # time left to escalate

    # The check that gave up keeps its place in the queue until the pool drops it.
    queued = [
        asyncio.create_task(run_code("chat", body, SLEEPER, time.monotonic() + 4))
        for _ in range(code_runs.MAX_WAITING - 1)
    ]
    await asyncio.sleep(0.1)
    assert await run_code("chat", body, wrong, time.monotonic() + 10) == (None, "busy")
    outcomes = {outcome for _, outcome in await asyncio.gather(*running, *queued)}
    assert outcomes <= {"failed", "none"}  # cut off, or never started
    assert await run_code("chat", body, wrong, time.monotonic() + 10) == (
        ExampleRun(0, 1),
        "failed",
    )


async def test_a_reload_that_turns_runs_on_probes_the_sandbox_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe is a child process of up to 20 s: started from the loader's thread,
    never from the event loop that applies the policy."""
    probed_in: list[threading.Thread] = []

    def available() -> None:
        probed_in.append(threading.current_thread())

    monkeypatch.setattr(sandbox, "available", available)
    env = {"CHEAP_URL": "http://x/v1", "PREMIUM_URL": "http://y/v1", "GATEWAY_TEST_KEY": "k"}
    path = tmp_path / "policy.yaml"
    path.write_text(route_policy(0.5, run_code=False))
    applied: list[object] = []
    reloader = PolicyReloader(path, applied.append, env=env, install_check=load_check)
    assert await reloader.check_now() and probed_in == []
    path.write_text(route_policy(0.5, run_code=True))
    assert await reloader.check_now() and len(applied) == 2
    assert probed_in and threading.current_thread() not in probed_in

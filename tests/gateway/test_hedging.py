"""The executor's hedging and its bookkeeping with the breakers and the latency model,
driven with a scripted in-process upstream client (timing-level behaviour; the same
paths run over real sockets in test_sla.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.errors import GatewayError
from gateway.health.latency import LatencyModel
from gateway.pipeline.executor import Hedge
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamReply, UpstreamStatus
from tests.gateway.scripted import (
    BODY,
    ScriptedClient,
    answers,
    deployment,
    due_for_a_probe,
    executor,
    fails,
)


async def test_a_hedge_starts_at_a_deployment_not_called_yet() -> None:
    a, b, c = deployment("a"), deployment("b"), deployment("c")
    client = ScriptedClient(
        {"a": fails(UpstreamConnectFailed("refused")), "b": answers(0.5), "c": answers()}
    )
    run, _ = executor(client)
    done = await run.complete([a, b, c], "chat", BODY, 5.0, Hedge(0.05))
    assert client.calls == ["a", "b", "c"]  # a refused, b slow: the hedge asks c, not b again
    assert done.deployment is c and done.won_by_hedge
    assert [loser.deployment.name for loser in done.losers] == ["b"]


async def test_a_hedge_that_fails_does_not_call_the_deployment_still_answering() -> None:
    """b, the hedge, answers 503 and falls back: a, still answering the first chain, is
    not called a second time (it would bill the prompt twice and answer no sooner)."""
    a, b = deployment("a"), deployment("b")
    client = ScriptedClient({"a": answers(0.3), "b": fails(UpstreamStatus("busy", status=503))})
    run, _ = executor(client)
    done = await run.complete([a, b], "chat", BODY, 5.0, Hedge(0.05))
    assert client.calls == ["a", "b"] and done.deployment is a and not done.won_by_hedge
    assert done.losers == []


async def test_a_hedge_does_not_take_a_deployment_waiting_to_retry() -> None:
    """a failed once and waits out its backoff to try again; b, the hedge, fails and
    would fall back onto a meanwhile: a is never called twice at once."""
    calling, most, calls = 0, 0, 0

    async def a_behaviour() -> UpstreamReply:
        nonlocal calling, most, calls
        calling, calls = calling + 1, calls + 1
        most = max(most, calling)
        try:
            await asyncio.sleep(0.1 if calls == 1 else 0.3)
            if calls == 1:
                raise UpstreamStatus("boom", status=500)
            return UpstreamReply({"choices": [{"message": {"content": "hi"}}]})
        finally:
            calling -= 1

    a, b = deployment("a", retries=1, backoff_s=0.2), deployment("b")
    busy = fails(UpstreamStatus("busy", status=503), after_s=0.1)  # at 0.15 s: a waits
    client = ScriptedClient({"a": a_behaviour, "b": busy})
    run, _ = executor(client)
    done = await run.complete([a, b], "chat", BODY, 5.0, Hedge(0.05))
    assert done.deployment is a and (most, calls) == (1, 2)


async def test_a_probe_answered_busy_frees_its_slot() -> None:
    breakers = due_for_a_probe()
    client = ScriptedClient({"a": fails(UpstreamStatus("queue full", status=503)), "b": answers()})
    run, _ = executor(client, breakers)
    done = await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0)
    assert client.calls == ["a", "b"] and done.deployment.name == "b"
    assert breakers.state("a") == "half_open" and not breakers.is_ejected("a")  # may probe again


async def test_a_probe_cancelled_by_a_lost_race_frees_its_slot() -> None:
    breakers = due_for_a_probe()
    client = ScriptedClient({"a": answers(2.0), "b": answers()})
    run, _ = executor(client, breakers)
    done = await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0, Hedge(0.05))
    assert done.deployment.name == "b"
    assert not breakers.is_ejected("a")


async def test_a_route_s_only_deployment_is_ejected_again_after_its_cooldown() -> None:
    breakers = due_for_a_probe()
    client = ScriptedClient({"a": fails(UpstreamStatus("boom", status=500))})
    run, _ = executor(client, breakers)
    with pytest.raises(GatewayError):
        await run.complete([deployment("a")], "chat", BODY, 5.0)  # the probe fails
    assert breakers.state("a") == "open" and breakers.is_ejected("a")


async def test_a_hedge_that_just_started_is_not_counted_late() -> None:
    client = ScriptedClient({"a": answers(0.07), "b": answers(0.03)})
    run, guard = executor(client)
    for _ in range(6):  # a answers at 70 ms; b, asked at 50 ms, is cancelled 20 ms in
        done = await run.complete(
            [deployment("a"), deployment("b")], "chat", BODY, 5.0, Hedge(0.05)
        )
        assert done.deployment.name == "a"
    assert guard.latency.predict("b").ttft_s is None  # no sample: not "infinitely slow"


async def test_a_primary_that_lost_counts_as_late() -> None:
    client = ScriptedClient({"a": answers(1.0), "b": answers()})
    run, guard = executor(client)
    for _ in range(6):
        await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0, Hedge(0.05))
    predicted = guard.latency.predict("a").ttft_s
    assert predicted is not None and predicted > 1.0


async def test_a_chain_waiting_to_retry_is_not_a_loser() -> None:
    slow_failure = fails(UpstreamStatus("bad gateway", status=502), after_s=0.1)
    client = ScriptedClient({"a": slow_failure, "b": answers(0.05)})
    run, _ = executor(client)
    a = deployment("a", retries=1, backoff_s=1.0)
    done = await run.complete([a, deployment("b")], "chat", BODY, 5.0, Hedge(0.12))
    assert done.deployment.name == "b"
    assert done.losers == []  # a had failed and was only waiting: nothing of it to price


async def test_cancelling_the_request_is_not_swallowed_by_the_cleanup() -> None:
    cleaning_up = asyncio.Event()

    async def slow_to_cancel() -> UpstreamReply:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cleaning_up.set()
            await asyncio.sleep(0.3)  # closing a connection
            raise
        raise AssertionError("unreachable")

    client = ScriptedClient({"a": slow_to_cancel, "b": answers()})
    run, _ = executor(client)
    task = asyncio.create_task(
        run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0, Hedge(0.05))
    )
    await cleaning_up.wait()  # b won; the loser's cleanup is running
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_the_latency_window_stays_bounded_without_predictions() -> None:
    model = LatencyModel(window_s=60)
    started = time.monotonic()
    for second in range(10_000):
        model.observe("a", ok=True, ttft_s=0.1, now=started + second)
    assert len(model._series["a"].buckets) <= 62

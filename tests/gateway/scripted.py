"""A scripted in-process upstream client for timing-level gateway tests (hedging,
breakers, warm-up, second opinions, prompt counts): each deployment's answer is a
coroutine the test writes. The same paths run over real sockets in the end-to-end
tests.

For the executor's tests (test_hedging, test_breaker, test_warming_units): deployments
reached only through the script, answers and failures to script them with, and an
executor over the client with its SLA guard.

    client = ScriptedClient({"a": fails(UpstreamConnectFailed("refused")), "b": answers()})
    run, guard = executor(client)
    done = await run.complete([deployment("a"), deployment("b")], "chat", BODY, 5.0)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.billing.pricing import TokenPrice
from gateway.health.breaker import BreakerSettings, CircuitBreakers
from gateway.health.latency import LatencyModel
from gateway.health.load import LoadView
from gateway.health.sla import SlaGuard
from gateway.metrics import Metrics
from gateway.pipeline.executor import Executor
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import EndpointType, UpstreamReply, UpstreamStatus, UpstreamTarget

Behaviour = Callable[[], Awaitable[UpstreamReply]]


class ScriptedClient:
    """An UpstreamClient whose answers are scripted per deployment; records the calls."""

    def __init__(self, behaviours: dict[str, Behaviour]) -> None:
        self.behaviours = behaviours
        self.calls: list[str] = []

    async def complete(
        self, target: UpstreamTarget, endpoint: EndpointType, body: dict[str, Any]
    ) -> UpstreamReply:
        self.calls.append(target.deployment)
        return await self.behaviours[target.deployment]()


BODY: dict[str, Any] = {"messages": []}


def deployment(name: str, retries: int = 0, backoff_s: float = 0.0) -> DeploymentRuntime:
    """An OpenAI-style deployment at a fixed price, reached only through the script."""
    target = UpstreamTarget(name, "openai", f"{name}-model", "http://unused", None)
    price = TokenPrice(1e-6, 2e-6, "policy")
    return DeploymentRuntime(name, "gpu", "openai", target, price, retries, backoff_s, None)


def answers(after_s: float = 0.0) -> Behaviour:
    """Answers "hi" after `after_s`."""

    async def reply() -> UpstreamReply:
        await asyncio.sleep(after_s)
        return UpstreamReply({"choices": [{"message": {"content": "hi"}}]})

    return reply


def fails(failure: Exception, after_s: float = 0.0) -> Behaviour:
    """Raises `failure` after `after_s`."""

    async def reply() -> UpstreamReply:
        await asyncio.sleep(after_s)
        raise failure

    return reply


def executor(
    client: ScriptedClient, breakers: CircuitBreakers | None = None
) -> tuple[Executor, SlaGuard]:
    """An executor over `client`, and the guard that keeps its breakers and latencies."""
    metrics = Metrics()
    latency = LatencyModel()
    guard = SlaGuard(metrics, latency, breakers or CircuitBreakers(), LoadView(latency))
    return Executor({"openai": client}, metrics, max_retry_wait_s=2.0, guard=guard), guard


def due_for_a_probe() -> CircuitBreakers:
    """a's breaker opened, and read at the end of its cooldown: half-open, not waited for."""
    breakers = CircuitBreakers(BreakerSettings(failure_threshold=1, cooldown_s=30))
    breakers.record_failure("a", UpstreamStatus("boom", status=500))
    assert breakers.state("a", now=time.time() + 30) == "half_open"
    return breakers

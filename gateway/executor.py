"""Carry out a plan: call deployments in order, retrying and falling back.

Per deployment: up to `max_retries` further tries on retryable answers (408/409/429/
5xx), waiting `Retry-After` when the upstream gives one (a wait longer than the cap
moves on instead), else exponential backoff with jitter. A refused connection or a
timeout moves straight to the next deployment (retrying a dead or stuck one only adds
latency); on the last deployment it is retried like the rest. Non-retryable answers:
a 400/413/422 is the client's fault and is returned at once (another deployment would
reject it too); a 401/403/404/501 means this deployment is misconfigured or cannot do
this, so the next one is tried. The whole run is bounded by the policy's
`request_timeout_s`. A stream is only retried before its first event reached us;
after that, failures go to the client.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.metrics import Metrics
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import (
    EndpointType,
    UpstreamClient,
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamReply,
    UpstreamStatus,
    UpstreamTimedOut,
    close_stream,
)

log = logging.getLogger(__name__)

CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})

AttemptFn = Callable[[DeploymentRuntime], Awaitable[Any]]  # one try on one deployment


@dataclass(slots=True)
class Completed:
    deployment: DeploymentRuntime
    reply: UpstreamReply
    attempts: int


@dataclass(slots=True)
class Opened:
    """A stream whose first events have arrived; `rest` yields the others."""

    deployment: DeploymentRuntime
    first: list[bytes]
    rest: AsyncIterator[list[bytes]]
    attempts: int


class Executor:
    def __init__(
        self,
        clients: Mapping[str, UpstreamClient],
        metrics: Metrics,
        max_retry_wait_s: float = 5.0,
    ) -> None:
        self._clients = clients
        self._metrics = metrics
        self._max_wait = max_retry_wait_s

    def client_for(self, deployment: DeploymentRuntime) -> UpstreamClient:
        return self._clients.get(deployment.provider) or self._clients["litellm"]

    async def complete(
        self,
        candidates: list[DeploymentRuntime],
        endpoint: EndpointType,
        body: dict[str, Any],
        deadline_s: float,
    ) -> Completed:
        async def call(d: DeploymentRuntime) -> UpstreamReply:
            return await self.client_for(d).complete(d.target, endpoint, upstream_body(d, body))

        deployment, reply, attempts = await self._run(candidates, call, deadline_s)
        return Completed(deployment, reply, attempts)

    async def open_stream(
        self,
        candidates: list[DeploymentRuntime],
        endpoint: EndpointType,
        body: dict[str, Any],
        deadline_s: float,
    ) -> Opened:
        async def call(d: DeploymentRuntime) -> tuple[list[bytes], AsyncIterator[list[bytes]]]:
            events = self.client_for(d).stream(d.target, endpoint, upstream_body(d, body))
            try:
                first = await anext(events)
            except StopAsyncIteration:
                raise UpstreamFailure(f"deployment '{d.name}' closed the stream empty") from None
            except BaseException:
                await close_stream(events)
                raise
            return first, events

        deployment, (first, rest), attempts = await self._run(candidates, call, deadline_s)
        return Opened(deployment, first, rest, attempts)

    async def _run(
        self, candidates: list[DeploymentRuntime], call: AttemptFn, deadline_s: float
    ) -> tuple[Any, Any, int]:
        failures: list[UpstreamFailure] = []
        try:
            async with asyncio.timeout(deadline_s):
                return await self._attempts(candidates, call, failures)
        except TimeoutError:
            raise UpstreamTimeout(
                f"no deployment answered within the request limit of {deadline_s:g}s"
            ) from None

    async def _attempts(
        self, candidates: list[DeploymentRuntime], call: AttemptFn, failures: list[UpstreamFailure]
    ) -> tuple[Any, Any, int]:
        attempts = 0
        for position, deployment in enumerate(candidates):
            last = position == len(candidates) - 1
            for retry in range(deployment.max_retries + 1):
                attempts += 1
                try:
                    result = await call(deployment)
                except UpstreamFailure as failure:
                    failures.append(failure)
                    wait = self._next_wait(deployment, failure, retry, last)
                    self._count(deployment, "retry" if wait is not None else "fallback")
                    log.info("attempt %d failed: %s", attempts, failure.message)
                    if wait is None:
                        break
                    await asyncio.sleep(wait)
                else:
                    self._count(deployment, "ok")
                    return deployment, result, attempts
        raise final_error(candidates, failures)

    def _next_wait(
        self, deployment: DeploymentRuntime, failure: UpstreamFailure, retry: int, last: bool
    ) -> float | None:
        """Seconds to wait before retrying here, or None to move to the next deployment."""
        if isinstance(failure, UpstreamStatus) and failure.status in CLIENT_FAULT_STATUSES:
            raise client_fault(failure) from failure
        if not failure.retryable or retry >= deployment.max_retries:
            return None
        if not last and isinstance(failure, UpstreamConnectFailed | UpstreamTimedOut):
            return None
        if failure.retry_after_s is not None:
            return failure.retry_after_s if failure.retry_after_s <= self._max_wait else None
        backoff: float = deployment.retry_backoff_s * 2.0**retry
        return min(self._max_wait, backoff * random.uniform(0.5, 1.5))

    def _count(self, deployment: DeploymentRuntime, outcome: str) -> None:
        self._metrics.child(self._metrics.upstream_attempts, deployment.name, outcome).inc()


def upstream_body(deployment: DeploymentRuntime, body: dict[str, Any]) -> dict[str, Any]:
    """The client's body with the deployment's model name; every other field untouched."""
    return {**body, "model": deployment.target.model}


def client_fault(failure: UpstreamStatus) -> GatewayError:
    error_type = PayloadTooLarge if failure.status == 413 else InvalidRequest
    return error_type(f"upstream rejected the request: {failure.message}")


def final_error(
    candidates: list[DeploymentRuntime], failures: list[UpstreamFailure]
) -> GatewayError:
    if not candidates:
        return UpstreamUnavailable("no deployment is available for this route")
    summary = "; ".join(dict.fromkeys(f.message for f in failures[-3:]))  # no repeats
    names = ", ".join(d.name for d in candidates)
    if failures and all(f.status == 429 for f in failures):
        waits = [f.retry_after_s for f in failures if f.retry_after_s is not None]
        return RateLimited(
            f"every deployment is rate limited ({names}): {summary}",
            retry_after_s=min(waits) if waits else 1.0,
            code="upstream_rate_limited",
        )
    if failures and all(isinstance(f, UpstreamTimedOut) for f in failures):
        return UpstreamTimeout(f"every deployment timed out ({names}): {summary}")
    if failures and all(_is_unavailable(f) for f in failures):
        return UpstreamUnavailable(f"no deployment could take the request ({names}): {summary}")
    return UpstreamError(f"every deployment failed ({names}): {summary}")


def _is_unavailable(failure: UpstreamFailure) -> bool:
    return isinstance(failure, UpstreamConnectFailed) or failure.status in (429, 503, 529)

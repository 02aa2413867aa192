"""Carry out a plan: call deployments in order, retrying and falling back.

Per deployment: up to `max_retries` further tries on retryable answers (408/409/429/
5xx), waiting `Retry-After` when the upstream gives one (a wait longer than the cap
moves on instead), else exponential backoff with jitter. A refused connection or a
timeout moves straight to the next deployment (retrying a dead or stuck one only adds
latency); on the last deployment it is retried like the rest, except a non-streamed
attempt that timed out: it had the prompt, and another try would pay for a second
generation. A non-streamed attempt waits for its answer until the request's deadline
(it comes whole, at the end of the generation); a deployment's `timeout_s` bounds a
stream's silences, its first byte included. Non-retryable answers:
a 400/413/422 is the client's fault and is returned at once (another deployment would
reject it too) with the upstream's error `type`, `code` and `param`; a 401/403/404/501
means this deployment is misconfigured or cannot do this, so the next one is tried.
The whole run is bounded by the policy's `request_timeout_s`. A stream is only retried
before its first event reached us; after that, failures go to the client.

A deployment whose engine is still loading (warming, see `gateway.health.warmup`) is tried
after the others; reached, it is waited for until its engine is ready, within the
request's deadline (past it: a 504 that says the engine is still loading). A refused
connection has the guard read the engine's state again, so a retry waits too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    UpstreamTimeout,
    retry_after_header,
)
from gateway.metrics import Metrics
from gateway.native import NativeCall
from gateway.native.formats import NativeEvent
from gateway.native.upstream import NativeClient
from gateway.pipeline.upstream_errors import client_fault, final_error
from gateway.request import output_cap
from gateway.runtime import DeploymentRuntime
from gateway.upstreams.base import (
    EndpointType,
    UpstreamClient,
    UpstreamConnectFailed,
    UpstreamFailure,
    UpstreamReply,
    UpstreamStatus,
    UpstreamTarget,
    UpstreamTimedOut,
    UpstreamUnsupported,
    close_stream,
)
from gateway.upstreams.openai_impl import OpenAICompatibleClient

if TYPE_CHECKING:
    from gateway.health.sla import SlaGuard

log = logging.getLogger(__name__)
decisions = logging.getLogger("gateway.decisions")  # proxy.DECISIONS_LOGGER: why, per request

CLIENT_FAULT_STATUSES = frozenset({400, 413, 422})
ANSWER_WAIT_MARGIN_S = 1.0  # a non-streamed call waits this much past the request's deadline
ENGINE_LOADING_RETRY_S = 1.0  # Retry-After of a request whose deadline passed first

AttemptFn = Callable[[DeploymentRuntime], Awaitable[Any]]  # one try on one deployment
# Told of each attempt that was sent and then cut off by a timeout (its own, or the
# request's deadline) or by the run's cancellation (the request's task cancelled, as at
# the end of the shutdown grace), once each: the upstream had the prompt, so the caller
# prices it.
CutOffFn = Callable[[DeploymentRuntime], None]


def _not_priced(deployment: DeploymentRuntime) -> None:
    """The default `CutOffFn`: a caller that prices no cut-off attempt."""


@dataclass(slots=True)
class Hedge:
    """When to ask another deployment too: after `after_s` without an answer (a first
    event, for streams), up to `max_hedges` more; the first to answer wins."""

    after_s: float
    max_hedges: int = 1


@dataclass(slots=True)
class Loser:
    """A hedged attempt that lost the race: cancelled (`result` None) or answered too
    late. Priced all the same: the upstream did the work."""

    deployment: DeploymentRuntime
    result: Any = None


@dataclass(slots=True)
class Completed:
    deployment: DeploymentRuntime
    reply: UpstreamReply
    attempts: int
    losers: list[Loser] = field(default_factory=list)
    hedges: int = 0  # hedges fired
    won_by_hedge: bool = False


# A stream's events as its client yields them: payloads of chat chunks, or a native
# stream's events, parsed once (`gateway.native.upstream`).
StreamEvents = list[bytes] | list[NativeEvent]


@dataclass(slots=True)
class Opened:
    """A stream whose first events have arrived; `rest` yields the others."""

    deployment: DeploymentRuntime
    first: StreamEvents
    rest: AsyncIterator[StreamEvents]
    attempts: int
    losers: list[Loser] = field(default_factory=list)
    hedges: int = 0
    won_by_hedge: bool = False
    opened_at: float = 0.0  # time.perf_counter() when the first events arrived


@dataclass(slots=True)
class _Run:
    """Shared by the attempt chains of one request (several when hedged)."""

    attempts: int = 0
    failures: list[UpstreamFailure] = field(default_factory=list)
    current: dict[int, DeploymentRuntime] = field(default_factory=dict)  # chain -> in flight
    started: dict[int, float] = field(default_factory=dict)  # chain -> its call's start
    tried: set[str] = field(default_factory=set)  # deployments called so far
    waiting: dict[int, DeploymentRuntime] = field(default_factory=dict)  # chain -> warming
    # chain -> the deployment it calls, or waits to call again (a retry's backoff)
    held: dict[int, DeploymentRuntime] = field(default_factory=dict)
    hedges: int = 0
    won_by_hedge: bool = False
    cut_off: CutOffFn = _not_priced


class Executor:
    def __init__(
        self,
        clients: Mapping[str, UpstreamClient],
        metrics: Metrics,
        max_retry_wait_s: float = 5.0,
        guard: SlaGuard | None = None,
        native_client: NativeClient | None = None,
    ) -> None:
        self._clients = clients
        self._metrics = metrics
        self._max_wait = max_retry_wait_s
        self._guard = guard
        # Calls in a bridged API's wire format, over the OpenAI-compatible pool by
        # default (without one, a native call fails over to the next deployment).
        http = clients.get("openai")
        if native_client is None and isinstance(http, OpenAICompatibleClient):
            native_client = NativeClient(http)
        self._native = native_client

    def ejected(self, deployment: str) -> bool:
        """Is `deployment` ejected by its circuit breaker now? (A pure read: a caller
        with a fallback of its own, such as the judge, skips it rather than probe.)"""
        return self._guard is not None and self._guard.breakers.is_ejected(deployment)

    def client_for(self, deployment: DeploymentRuntime) -> UpstreamClient:
        return self._clients.get(deployment.provider) or self._clients["litellm"]

    def _native_client(self, deployment: DeploymentRuntime) -> NativeClient:
        if self._native is None:  # built without an OpenAI-compatible client's pool
            raise UpstreamStatus(
                f"deployment '{deployment.name}': no client for native calls", status=501
            )
        return self._native

    async def complete(
        self,
        candidates: list[DeploymentRuntime],
        endpoint: EndpointType,
        body: dict[str, Any],
        deadline_s: float,
        hedge: Hedge | None = None,
        priority: int | None = None,
        logprobs: bool = False,
        cut_off: CutOffFn = _not_priced,
        native: NativeCall | None = None,
    ) -> Completed:
        """One answer from the first candidate that gives one; `logprobs` asks those
        that return token logprobs for them (a cascade verifying the answer);
        `native`: the bridged request for the deployments serving its format."""
        ends_at = time.monotonic() + deadline_s

        async def call(d: DeploymentRuntime) -> UpstreamReply:
            target = answer_target(d, ends_at)
            try:
                if native is not None and native.serves(d):
                    client = self._native_client(d)
                    request = native.body_for(d, body)
                    return await client.complete(target, native.surface, request, native.headers)
                request = upstream_body(d, endpoint, body, priority, logprobs)
                return await self.client_for(d).complete(target, endpoint, request)
            except UpstreamTimedOut as failure:
                failure.retryable = False  # it had the prompt: another try pays again
                raise

        deployment, reply, run, losers = await self._run(
            candidates, call, deadline_s, hedge, cut_off
        )
        return Completed(deployment, reply, run.attempts, losers, run.hedges, run.won_by_hedge)

    async def open_stream(
        self,
        candidates: list[DeploymentRuntime],
        endpoint: EndpointType,
        body: dict[str, Any],
        deadline_s: float,
        hedge: Hedge | None = None,
        priority: int | None = None,
        cut_off: CutOffFn = _not_priced,
        native: NativeCall | None = None,
    ) -> Opened:
        async def call(d: DeploymentRuntime) -> tuple[StreamEvents, AsyncIterator[StreamEvents]]:
            events: AsyncIterator[StreamEvents]
            if native is not None and native.serves(d):
                client = self._native_client(d)
                request = native.body_for(d, body)
                events = client.stream(d.target, native.surface, request, native.headers)
            else:
                request = upstream_body(d, endpoint, body, priority)
                events = self.client_for(d).stream(d.target, endpoint, request)
            try:
                first: StreamEvents = await anext(events)
            except StopAsyncIteration:
                raise UpstreamFailure(f"deployment '{d.name}' closed the stream empty") from None
            except BaseException:
                await close_stream(events)
                raise
            return first, events

        deployment, (first, rest), run, losers = await self._run(
            candidates, call, deadline_s, hedge, cut_off
        )
        opened_at = time.perf_counter()
        return Opened(
            deployment, first, rest, run.attempts, losers, run.hedges, run.won_by_hedge, opened_at
        )

    async def _run(
        self,
        candidates: list[DeploymentRuntime],
        call: AttemptFn,
        deadline_s: float,
        hedge: Hedge | None,
        cut_off: CutOffFn = _not_priced,
    ) -> tuple[DeploymentRuntime, Any, _Run, list[Loser]]:
        run = _Run(cut_off=cut_off)
        candidates = self._ready_first(candidates)
        try:
            return await self._run_within(candidates, call, deadline_s, hedge, run)
        except GatewayError as error:  # what it cost: a cascade counts its tiers' calls
            error.attempts, error.hedges = run.attempts, run.hedges
            raise

    async def _run_within(
        self,
        candidates: list[DeploymentRuntime],
        call: AttemptFn,
        deadline_s: float,
        hedge: Hedge | None,
        run: _Run,
    ) -> tuple[DeploymentRuntime, Any, _Run, list[Loser]]:
        try:
            async with asyncio.timeout(deadline_s):
                if hedge is None or len(candidates) < 2:
                    deployment, result = await self._attempts(candidates, call, run)
                    return deployment, result, run, []
                return await self._hedged(candidates, call, run, hedge)
        except TimeoutError:
            self._report_silent(run)
            _cut_off_in_flight(run)  # in flight when the deadline hit
            if run.waiting:
                raise self._still_loading(run, deadline_s) from None
            raise UpstreamTimeout(
                f"no deployment answered within the request limit of {deadline_s:g}s"
            ) from None
        except asyncio.CancelledError:
            # The request itself was cancelled (the server's shutdown grace ran out, say):
            # what was in flight had the prompt. Priced at once (a hedged run's chains
            # were cancelled on the way out), then the cancellation goes on.
            _cut_off_in_flight(run, cancelled=True)
            raise

    async def _hedged(
        self, candidates: list[DeploymentRuntime], call: AttemptFn, run: _Run, hedge: Hedge
    ) -> tuple[DeploymentRuntime, Any, _Run, list[Loser]]:
        """Race attempt chains: each hedge starts a chain at the first candidate not
        called yet (falling back through the rest), once the chains running have gone
        `hedge.after_s` without an answer."""
        chains: dict[asyncio.Task[tuple[DeploymentRuntime, Any]], int] = {}

        def launch(start: int, k: int) -> None:  # chain k: 0 the first, then the hedges
            order = candidates[start:] + candidates[:start]
            chains[asyncio.create_task(self._attempts(order, call, run, chain=k))] = k

        launch(0, 0)
        errors: list[BaseException] = []
        try:
            while chains:
                more = (
                    run.hedges < hedge.max_hedges and _idle_candidate(candidates, run) is not None
                )
                done, _ = await asyncio.wait(
                    chains, timeout=hedge.after_s if more else None, return_when="FIRST_COMPLETED"
                )
                if not done:
                    start = _idle_candidate(candidates, run)  # chosen now, not before the wait
                    if start is None:  # the first chain reached them all meanwhile
                        continue
                    run.hedges += 1
                    launch(start, run.hedges)
                    continue
                winner = _first_success(done, errors)
                if winner is not None:
                    run.won_by_hedge = chains[winner] > 0
                    winning_chain = chains[winner]
                for task in done:
                    chains.pop(task)
                if winner is not None:
                    losers = [Loser(*t.result()) for t in done if t is not winner and _ok(t)]
                    try:
                        losers += await self._cancel_losers(chains, run, hedge)
                    except asyncio.CancelledError:
                        # Cancelled while the losers close (the shutdown grace ran out):
                        # the winner had the prompt too; priced with what is in flight.
                        deployment, result = winner.result()
                        run.current[winning_chain] = deployment
                        await _release(result)
                        raise
                    return (*winner.result(), run, losers)
                if _client_faults(errors):  # another deployment would refuse it too
                    break
        finally:
            await _cancel(chains, run)
        raise (_client_faults(errors) or errors or [final_error(candidates, run.failures)])[0]

    async def _cancel_losers(
        self, chains: dict[asyncio.Task[Any], int], run: _Run, hedge: Hedge
    ) -> list[Loser]:
        """Cancel the chains that lost; one that had waited past `hedge.after_s` counts as
        a late answer in the latency model (a hedge that just started does not)."""
        now = time.perf_counter()
        late = {k for k in chains.values() if now - run.started.get(k, now) >= hedge.after_s}
        losers = await _cancel(chains, run)
        for chain, loser in losers:
            self._count(loser.deployment, "cancelled")
            if self._guard is not None and chain in late:
                self._guard.lost_race(loser.deployment.name)
        return [loser for _, loser in losers]

    async def _attempts(
        self, candidates: list[DeploymentRuntime], call: AttemptFn, run: _Run, chain: int = 0
    ) -> tuple[DeploymentRuntime, Any]:
        guard = self._guard
        for position, deployment in enumerate(candidates):
            if _held_elsewhere(deployment, run, chain):
                continue  # a hedge that fell back onto it: a second call buys nothing
            last = position == len(candidates) - 1
            # Asked of the last one too (it moves an expired breaker to half-open), but the
            # last candidate is tried whatever the answer: there is nothing else.
            admission = guard.allows(deployment.name) if guard is not None else None
            if guard is not None and admission is None and not last:
                continue  # ejected meanwhile, or its half-open probe is taken
            run.held[chain] = deployment
            try:
                for retry in range(deployment.max_retries + 1):
                    if guard is not None and deployment.name in guard.warmup.warming:
                        await self._warm_up(deployment, run, chain)
                    run.attempts += 1
                    run.current[chain] = deployment
                    run.tried.add(deployment.name)
                    started = run.started[chain] = time.perf_counter()
                    try:
                        result = await call(deployment)
                    except UpstreamFailure as failure:
                        run.current.pop(chain, None)  # nothing in flight while it waits
                        run.failures.append(failure)
                        if isinstance(failure, UpstreamUnsupported):
                            # Refused before any call: no upstream call, no verdict on
                            # the deployment's health; the next one may take it.
                            run.attempts -= 1
                            self._count(deployment, "fallback")
                            break
                        if isinstance(failure, UpstreamTimedOut):
                            run.cut_off(deployment)
                        if guard is not None:
                            guard.failed(deployment.name, failure)
                        wait = self._next_wait(deployment, failure, retry, last)
                        self._count(deployment, "retry" if wait is not None else "fallback")
                        log.info("attempt %d failed: %s", run.attempts, failure.logged)
                        if wait is None:
                            break
                        await asyncio.sleep(wait)
                    else:
                        run.current.pop(chain, None)
                        if guard is not None:
                            elapsed = time.perf_counter() - started
                            streamed = isinstance(result, tuple)  # (first, rest)
                            guard.succeeded(deployment.name, elapsed, streamed=streamed)
                        self._count(deployment, "ok")
                        return deployment, result
            finally:
                run.held.pop(chain, None)
                # Retries keep the probe slot; only the one this request took goes back
                # (a last resort tried without one frees nobody else's).
                if guard is not None and admission is not None:
                    guard.release(admission)
        run.current.pop(chain, None)
        raise final_error(candidates, run.failures)

    def _ready_first(self, candidates: list[DeploymentRuntime]) -> list[DeploymentRuntime]:
        """The candidates with those warming moved last (in their order)."""
        warming = self._guard.warmup.warming if self._guard is not None else None
        if not warming:
            return candidates
        later = [d for d in candidates if d.name in warming]
        if not later or len(later) == len(candidates):
            return candidates
        decisions.info(
            "%s warming (engine loading): tried after the others",
            ", ".join(d.name for d in later),
        )
        return [d for d in candidates if d.name not in warming] + later

    async def _warm_up(self, deployment: DeploymentRuntime, run: _Run, chain: int) -> None:
        """Wait for a deployment whose engine is loading; the request's deadline bounds
        the wait (`_run` then says the engine is still loading)."""
        assert self._guard is not None
        warmup = self._guard.warmup
        run.waiting[chain] = deployment
        started = time.perf_counter()
        await warmup.wait(deployment.name)
        del run.waiting[chain]
        waited = time.perf_counter() - started
        who = warmup.describe(deployment.name)
        decisions.info("waited %.2fs for deployment %s to load its model", waited, who)

    def _report_silent(self, run: _Run) -> None:
        """Tell the breakers of the attempts the deadline cut off after they waited past
        their deployment's `timeout_s` (a non-streamed answer is waited for until the
        deadline): a timeout, as a stream silent that long is. A deadline shorter than
        that (an SLA's) is no verdict on the deployment."""
        if self._guard is None:
            return
        now = time.perf_counter()
        for chain, deployment in run.current.items():
            waited = now - run.started.get(chain, now)
            if waited >= deployment.target.timeout_s:
                message = f"deployment '{deployment.name}' did not answer within {waited:.3g}s"
                self._guard.failed(deployment.name, UpstreamTimedOut(message))

    def _still_loading(self, run: _Run, deadline_s: float) -> GatewayError:
        assert self._guard is not None
        waited = next(iter(run.waiting.values()))  # hedged chains: the first one is enough
        return UpstreamTimeout(
            f"deployment {self._guard.warmup.describe(waited.name)} is still loading its "
            f"model and was not ready within the request limit of {deadline_s:g}s; "
            "retry in a few seconds",
            code="engine_loading",
            headers=retry_after_header(ENGINE_LOADING_RETRY_S),
        )

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
        if not last and failure.status == 503:  # vLLM's "queue full": busy, go elsewhere
            return None
        if failure.retry_after_s is not None:
            return failure.retry_after_s if failure.retry_after_s <= self._max_wait else None
        backoff: float = deployment.retry_backoff_s * 2.0**retry
        return min(self._max_wait, backoff * random.uniform(0.5, 1.5))

    def _count(self, deployment: DeploymentRuntime, outcome: str) -> None:
        self._metrics.child(self._metrics.upstream_attempts, deployment.name, outcome).inc()


def answer_target(deployment: DeploymentRuntime, ends_at: float) -> UpstreamTarget:
    """The deployment's target for a non-streamed call: its answer waited for until the
    request's deadline (`ends_at`, time.monotonic()), and a little past it, so that the
    deadline ends the wait and the client's 504 names it."""
    wait_s = max(0.0, ends_at - time.monotonic()) + ANSWER_WAIT_MARGIN_S
    return dataclasses.replace(deployment.target, answer_timeout_s=wait_s)


def upstream_body(
    deployment: DeploymentRuntime,
    endpoint: EndpointType,
    body: dict[str, Any],
    priority: int | None = None,
    logprobs: bool = False,
) -> dict[str, Any]:
    """The client's body with the deployment's model name, the route's priority (for
    engines scheduling by priority), `logprobs: true` (when asked for and the
    deployment returns them) and the deployment's `max_output_tokens` cap; every other
    field untouched."""
    extra: dict[str, Any] = {"model": deployment.target.model}
    if deployment.max_output_tokens is not None:
        extra.update(output_cap(endpoint, body, deployment.max_output_tokens))
    if priority is not None and deployment.priority_scheduling and "priority" not in body:
        extra["priority"] = priority
    if logprobs and deployment.returns_logprobs:
        extra["logprobs"] = True
    return {**body, **extra}


def _cut_off_in_flight(run: _Run, cancelled: bool = False) -> None:
    """Price each attempt in flight as cut off, once: each is taken out of
    `run.current` as it is priced. `cancelled`: the run is being cancelled, which
    nothing here may turn into another exception (a pricing bug is logged)."""
    in_flight = list(run.current.values())
    run.current.clear()
    for deployment in in_flight:
        try:
            run.cut_off(deployment)
        except Exception:
            if not cancelled:
                raise
            log.exception("pricing the attempt cut off on deployment %s failed", deployment.name)


async def _release(result: Any) -> None:
    """Close an opened stream's upstream (a stream attempt's result is `(first, rest)`);
    a whole reply holds nothing open."""
    if isinstance(result, tuple) and len(result) == 2 and hasattr(result[1], "aclose"):
        await close_stream(result[1])


def _ok(task: asyncio.Task[Any]) -> bool:
    return not task.cancelled() and task.exception() is None


def _first_success(
    done: set[asyncio.Task[Any]], errors: list[BaseException]
) -> asyncio.Task[Any] | None:
    winner = None
    for task in done:
        if _ok(task):
            winner = winner or task
        elif not task.cancelled() and (error := task.exception()) is not None:
            errors.append(error)
    return winner


def _client_faults(errors: list[BaseException]) -> list[BaseException]:
    return [e for e in errors if isinstance(e, InvalidRequest | PayloadTooLarge)]


def _idle_candidate(candidates: list[DeploymentRuntime], run: _Run) -> int | None:
    """The first candidate not called yet, where a hedge would start (None: no hedge)."""
    for index, deployment in enumerate(candidates):
        if deployment.name not in run.tried:
            return index
    return None


def _held_elsewhere(deployment: DeploymentRuntime, run: _Run, chain: int) -> bool:
    """Whether another chain of the run is calling `deployment`, or waits to again."""
    return any(d.name == deployment.name for k, d in run.held.items() if k != chain)


async def _cancel(chains: dict[asyncio.Task[Any], int], run: _Run) -> list[tuple[int, Loser]]:
    """Cancel the chains still running; the deployments they were calling lost."""
    losers = [(k, Loser(run.current[k])) for k in chains.values() if k in run.current]
    for task in chains:
        task.cancel()
    # return_exceptions: the chains' own endings are theirs; a cancellation of the
    # request itself still reaches this await and propagates.
    await asyncio.gather(*chains, return_exceptions=True)
    chains.clear()
    return losers

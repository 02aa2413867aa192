"""The request lifecycle after auth and validation: route, plan, execute, account, reply.

Non-streaming replies forward the upstream's bytes unchanged; streams are relayed by
`gateway.pipeline.streaming`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response

from gateway.auth import Principal
from gateway.errors import GatewayError, PayloadTooLarge, UpstreamUnavailable
from gateway.health.sla import SlaGuard
from gateway.ledger.record import StatusType, SurfaceType, usd
from gateway.limits import UNLIMITED, Admission, Limiter
from gateway.metrics import Metrics
from gateway.native import NativeCall
from gateway.pipeline.accounting import Accountant, count_unreported, reply_usage
from gateway.pipeline.capabilities import required, unserved
from gateway.pipeline.cascade import Cascade, CascadeResult
from gateway.pipeline.executor import Executor, Hedge, Loser, Opened
from gateway.pipeline.native_streams import native_tally
from gateway.pipeline.opinions import configured
from gateway.pipeline.scoring import AnswerVerifier, RequestScorer
from gateway.pipeline.selector import QualitySelector, TrafficProfiles
from gateway.pipeline.streaming import (
    SSE_HEADERS,
    RelayedStream,
    StreamSettlement,
    buffered_events,
    loser_answer,
    loser_usage,
)
from gateway.request import Call, asked_tokens, client_hung_up
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime, climbs
from gateway.upstreams.base import EndpointType, close_stream
from router import SCORED_STRATEGIES
from router.target_selection import Choice

DECISIONS_LOGGER = "gateway.decisions"
log = logging.getLogger(__name__)
decisions = logging.getLogger(DECISIONS_LOGGER)  # one line per request when enabled

# 429s that mean the route's upstreams could not take the request in time.
SLA_FAILURES = frozenset({"upstream_rate_limited", "sla_unmeetable"})
# OpenAI's `max_tokens` for a legacy completion that sets none (chat's is the model's).
LEGACY_COMPLETION_MAX_TOKENS = 16


def new_request_id() -> str:
    return "req_" + secrets.token_hex(16)


class RequestIds:
    """Request ids for the hot path: a random prefix drawn when the proxy is built (in
    each worker process) and a counter. Unique across workers and replicas, which the
    ledger's exactly-once key needs, at a fraction of the cost of random ids."""

    def __init__(self) -> None:
        self._prefix = "req_" + secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter):08x}"


class Proxy:
    def __init__(
        self,
        executor: Executor,
        accountant: Accountant,
        metrics: Metrics,
        scorer: RequestScorer | None = None,
        verifier: AnswerVerifier | None = None,
        guard: SlaGuard | None = None,
        limits: Limiter | None = None,
        traffic: TrafficProfiles | None = None,
    ) -> None:
        self._executor = executor
        self._guard = guard
        self._limits = limits or Limiter(None, metrics)
        self._accountant = accountant
        self._metrics = metrics
        self._scorer = scorer or RequestScorer()
        verifier = verifier or AnswerVerifier(scorer=self._scorer)
        self._cascade = Cascade(executor, accountant, verifier, metrics)
        self.selector = QualitySelector(accountant.output_lengths, traffic=traffic)
        self.request_ids = RequestIds()

    async def handle(
        self,
        runtime: Runtime,
        principal: Principal,
        endpoint: EndpointType,
        body: dict[str, Any],
        request_id: str,
        body_size: int,
        started: float,
        *,
        surface: SurfaceType | None = None,
        native: NativeCall | None = None,
    ) -> Response:
        """Answer one request; `started` (perf_counter) is when it arrived, which its
        latency, SLA verdict and deadline count from. `surface`: the API the client
        called (default: `endpoint`); `native`: a bridged API's request as the client
        sent it, for the deployments that serve its wire format (`gateway.native`)."""
        route = runtime.resolve(body["model"], principal.can_use)
        principal.check_route(route.name)
        if route.max_body_bytes is not None and body_size > route.max_body_bytes:
            raise PayloadTooLarge(
                f"request body is {body_size} bytes; route '{route.name}' accepts at most "
                f"{route.max_body_bytes}"
            )
        stream = bool(body.get("stream"))
        chat_needs = required(endpoint, body)
        # What a deployment must serve; the strategy goes by the request's content.
        needs = chat_needs if native is None else native.needs(chat_needs)
        strategy = effective_strategy(route, stream, endpoint, chat_needs)
        score = None
        if strategy in SCORED_STRATEGIES:
            score = await self._scorer.score(endpoint, body, route.classifier)
            self._metrics.child(self._metrics.router_score, route.name).observe(score)
        call = Call(
            request_id,
            principal.team,
            principal.key_id,
            route,
            stream,
            started,
            score,
            surface=surface or endpoint,
            native=native,
            endpoint=endpoint,
            body=body,
        )
        try:
            planned, choice = self._candidates(runtime, call, strategy, needs)
            candidates = self._select(route, planned, strategy)
        except GatewayError as error:  # nothing may serve it (unavailable, ejected, shed)
            self._fail(runtime, call, [], error)
            raise
        self._log_dropped(call, planned, candidates)
        if choice is not None:  # its records carry the predicted quality and the target
            call.choice = choice
            met = "true" if choice.meets(choice.chosen) else "false"
            self._metrics.child(self._metrics.select_choices, route.name, choice.chosen, met).inc()
        deadline_s = runtime.request_timeout_s
        if route.sla is not None and route.sla.timeout_s is not None:
            deadline_s = min(deadline_s, route.sla.timeout_s)
        # Time spent deciding counts: a request queued for the embedding classifier
        # has that much less for its upstreams.
        call.deadline_s = max(0.001, deadline_s - (time.perf_counter() - started))
        admission = await self._limits.admit(
            runtime,
            principal,
            route,
            endpoint,
            limited_body(endpoint, body),
            candidates,
            strategy,
            request_id,
            call.prompt,
            frozenset(needs),
        )
        response: Response | None = None
        # The call's body becomes admission's capped copy: upstreams are asked for no
        # more than was held (the one update of the body, besides a cascade's below).
        call.body = admission.cap(call.endpoint, call.body)
        try:  # from here on the admission's budget hold is released however it ends
            if admission.candidates:  # a soft budget limit downgraded the request
                candidates = self._select(route, admission.candidates, strategy)
            if strategy == "cascade":
                response = await self._run_cascade(call, candidates)
            elif call.choice is not None and climbs(route, strategy, chat_needs):
                response = await self._run_select(call, call.choice, candidates)
            elif call.stream:
                response = await self._stream(call, candidates, admission)
            else:
                response = await self._complete(call, candidates)
        except GatewayError as error:
            self._fail(runtime, call, candidates, error)
            raise
        except asyncio.CancelledError:
            # Cancelled (its client hung up, or the server's shutdown grace ran out): the
            # attempts in flight are priced as cut off by now; the request is recorded as
            # ended without an answer, and the cancellation goes on.
            self._cut_short(runtime, call, candidates)
            raise
        finally:
            if not isinstance(response, RelayedStream):  # a relayed stream settles as it ends
                admission.settle(call.records)
        if admission.headers:
            response.headers.update(admission.headers)
        return response

    def _select(
        self, route: RouteRuntime, candidates: list[DeploymentRuntime], strategy: str
    ) -> list[DeploymentRuntime]:
        if self._guard is None:
            return candidates
        # A cascade keeps its tier order: only ejected deployments are dropped.
        return self._guard.select(route, candidates, use_sla=strategy != "cascade")

    def _log_dropped(
        self, call: Call, planned: list[DeploymentRuntime], kept: list[DeploymentRuntime]
    ) -> None:
        """For the decisions log: which of the plan's deployments the guard left out and
        why (the plan's reasons, logged before, still named them), and those left."""
        if len(kept) == len(planned) or not decisions.isEnabledFor(logging.INFO):
            return
        left = [d.name for d in kept]
        reasons = [
            f"skip '{d.name}': {self._drop_reason(d)}" for d in planned if d.name not in left
        ]
        names = ", ".join(f"'{name}'" for name in left)
        decisions.info("%s %s; left: %s", call.request_id, "; ".join(reasons), names)

    def _drop_reason(self, deployment: DeploymentRuntime) -> str:
        if self._guard is not None and self._guard.breakers.is_ejected(deployment.name):
            return "ejected by its circuit breaker"
        return "predicted to miss the route's TTFT SLA"

    def _fail(
        self,
        runtime: Runtime,
        call: Call,
        planned: list[DeploymentRuntime],
        error: GatewayError,
    ) -> None:
        """A request that ends in `error` after its route was chosen: counted against the
        route's SLA when the fault is the route's, and, unless something answered it,
        recorded once as an error under the deployment its plan named first."""
        missed = missed_sla(error)
        if self._guard is not None and missed:
            self._guard.count_missed(call.route)
        if error.hedges:  # fired, though no answer won: `fired` counts every hedge sent
            self._metrics.child(self._metrics.hedges, call.route.name, "fired").inc(error.hedges)
        self._record_unanswered(runtime, call, planned, missed)

    def _cut_short(self, runtime: Runtime, call: Call, planned: list[DeploymentRuntime]) -> None:
        """A request cancelled before it answered: recorded once (not the route's fault:
        no SLA verdict), unless something answered it, as `cancelled` when its client
        hung up (counted under HTTP status 499, as proxies log it), else as an `error`
        (the shutdown grace ran out). Never raises: it runs while a cancellation
        propagates."""
        try:
            if client_hung_up():
                self._metrics.count_client_closed(call.route.name, call.team)
                self._record_unanswered(runtime, call, planned, False, "cancelled")
            else:
                self._record_unanswered(runtime, call, planned, missed=False)
        except Exception:
            log.exception("recording the cancelled request %s failed", call.request_id)

    def _record_unanswered(
        self,
        runtime: Runtime,
        call: Call,
        planned: list[DeploymentRuntime],
        missed: bool,
        status: StatusType = "error",
    ) -> None:
        """Unless something answered it, record the request once (`status`) under the
        deployment its plan named first."""
        if any(r.is_request for r in call.records):
            return
        first = planned[0] if planned else runtime.deployments.get(call.route.deployments[0])
        if first is not None:
            self._accountant.settle_failure(call, first, missed, status)

    def _candidates(
        self,
        runtime: Runtime,
        call: Call,
        strategy: str,
        needs: Mapping[str, str],
    ) -> tuple[list[DeploymentRuntime], Choice | None]:
        """The plan's deployments, and a `select` route's choice among them."""
        wanted, route = frozenset(needs), call.route
        choice = None
        if strategy == "select":
            choice = self.selector.choose(runtime, route, call.endpoint, call.body)
        plan = runtime.plan(route, call.score, strategy, wanted, choice)
        if decisions.isEnabledFor(logging.INFO):
            decisions.info("%s %s", call.request_id, "; ".join(plan.reasons()))
        if not plan.steps:
            if any(not runtime.deployments[name].serves(wanted) for name, _ in plan.skipped):
                raise unserved(runtime, route, needs)  # the gateway's answer: a 400
            reasons = "; ".join(f"{name}: {why}" for name, why in plan.skipped)
            raise UpstreamUnavailable(
                f"route '{route.name}' has no available deployment ({reasons})"
            )
        return [runtime.deployments[step.deployment] for step in plan.steps], plan.choice

    async def _complete(self, call: Call, candidates: list[DeploymentRuntime]) -> Response:
        route, endpoint, body = call.route, call.endpoint, call.body
        done = await self._executor.complete(
            candidates,
            endpoint,
            body,
            call.deadline_s,
            hedge_of(route),
            priority_of(route),
            cut_off=self._accountant.cut_off_pricer(call),
            native=call.native,
        )
        reply = done.reply.body
        try:
            await self._settle_hedges(call, done.losers, done.hedges, done.won_by_hedge)
            await count_unreported(call.prompt, endpoint, body, [(done.deployment, reply)])
        finally:  # priced however these waits end (cut short: counted on the loop)
            usage = reply_usage(done.deployment, endpoint, body, reply, call.prompt)
            self._accountant.settle(call, done.deployment, usage)
        self._observe(call, done.deployment, "200")
        headers = cascade_headers(call, done.deployment, done.attempts)
        headers["x-cascade-cost-usd"] = f"{usd(call.cost_nanos):.9f}"  # hedges, cut-offs too
        content = done.reply.raw if done.reply.raw is not None else orjson.dumps(reply)
        return Response(content, media_type="application/json", headers=headers)

    async def _run_select(
        self, call: Call, choice: Choice, candidates: list[DeploymentRuntime]
    ) -> Response:
        """A verified `select`: the choice's climb among `candidates`, a candidate just
        under the target tried first on the route's `explore` share."""
        chain = climb(choice, candidates)
        tried = explored(choice, chain, candidates, call.route.explore)
        if len(tried) > len(chain) and decisions.isEnabledFor(logging.INFO):
            decisions.info("%s explores %s first", call.request_id, tried[0].name)
        extra = len(tried) - len(chain)
        return await self._run_cascade(call, tried, one_step_each=True, extra_steps=extra)

    async def _run_cascade(
        self,
        call: Call,
        candidates: list[DeploymentRuntime],
        one_step_each: bool = False,
        extra_steps: int = 0,
    ) -> Response:
        """Verify before answering; a stream is verified whole, then sent as SSE, so
        its upstreams get `call.body` without the stream fields. `one_step_each`: each
        candidate is a step of the climb (a `select` route's chain), not each tier;
        `extra_steps`: steps beyond the route's `max_escalations` (an exploring try)."""
        body = call.body  # as the client asked (its stream options: the SSE it gets)
        call.body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        opinions = self._second_opinions(call.route)
        result = await self._cascade.run(call, candidates, opinions, one_step_each, extra_steps)
        if call.choice is not None:
            self._learn(call.route, call.choice, result)
        final = result.final
        m = self._metrics
        m.child(m.escalations, call.route.name).inc(result.escalations)
        self._observe(call, final.deployment, "200")
        headers = cascade_headers(call, final.deployment, result.attempts)
        headers["x-cascade-escalations"] = str(result.escalations)
        headers["x-cascade-verdict"] = result.verdict
        if result.judge_scores:  # the judge's grade of each checked answer
            headers["x-cascade-judge"] = ",".join(
                "fallback" if s is None else f"{s:.3f}" for s in result.judge_scores
            )
        headers["x-cascade-cost-usd"] = f"{usd(call.cost_nanos):.9f}"  # opinions, cut-offs too
        if result.second_opinions is not None:
            agreeing, answered = result.second_opinions
            headers["x-cascade-second-opinions"] = f"{agreeing}/{answered}"
        if decisions.isEnabledFor(logging.INFO):
            decisions.info("%s %s", call.request_id, cascade_verdict(call.route, result))
        if call.stream:  # a native deployment's answer in its API's events, with its ids
            events = buffered_events(
                call.native, final.deployment, final.reply, body, call.endpoint
            )
            return Response(
                events, media_type="text/event-stream", headers={**headers, **SSE_HEADERS}
            )
        content = final.reply.raw if final.reply.raw is not None else orjson.dumps(final.reply.body)
        return Response(content, media_type="application/json", headers=headers)

    def _learn(self, route: RouteRuntime, choice: Choice, result: CascadeResult) -> None:
        """Each verified answer of a `select` route is an observation of its deployment's
        quality: did its record's score (the judge's grade where it gave one) pass?"""
        for record in result.records:
            if (score := record.verifier_score) is not None:
                accepted = score >= route.verify_threshold
                self.selector.learn(choice, record.deployment, accepted)

    def _second_opinions(self, route: RouteRuntime) -> list[DeploymentRuntime]:
        """The route's second opinions that may be asked now: configured (their env
        vars set) and not ejected by their breaker. An opinion is optional: the others
        are skipped, never tried as a last resort."""
        usable = configured(route)
        if self._guard is None:
            return usable
        return [d for d in usable if not self._guard.breakers.is_ejected(d.name)]

    async def _stream(
        self,
        call: Call,
        candidates: list[DeploymentRuntime],
        admission: Admission = UNLIMITED,
    ) -> Response:
        """Relay a stream; its upstream is always asked for usage (priced by
        `call.body`, which is as the client sent it)."""
        options = call.body.get("stream_options") or {}
        wants_usage = bool(options.get("include_usage"))
        upstream = {**call.body, "stream_options": {**options, "include_usage": True}}
        route = call.route
        opened = await self._executor.open_stream(
            candidates,
            call.endpoint,
            upstream,
            call.deadline_s,
            hedge_of(route),
            priority_of(route),
            cut_off=self._accountant.cut_off_pricer(call),
            native=call.native,
        )
        try:
            await self._settle_hedges(call, opened.losers, opened.hedges, opened.won_by_hedge)
        except BaseException:  # cancelled while closing a loser: price, release the winner
            self._cut_before_relay(call, opened)
            await close_stream(opened.rest)
            raise
        ttft = time.perf_counter() - call.started
        self._metrics.child(self._metrics.ttft, call.route.name, opened.deployment.name).observe(
            ttft
        )
        tally = native_tally(call.native, opened.deployment)  # None: a chat stream
        settlement = StreamSettlement(
            self._accountant, self._observe, call, opened, wants_usage, ttft, tally
        )
        settlement.guard, settlement.admission = self._guard, admission
        headers = {**cascade_headers(call, opened.deployment, opened.attempts), **SSE_HEADERS}
        return RelayedStream(
            settlement.relay(), settlement.finish, media_type="text/event-stream", headers=headers
        )

    def _cut_before_relay(self, call: Call, opened: Opened) -> None:
        """A stream that opened but was never relayed (its request was cancelled): priced
        as a stream cut short is, `partial`, from the events that had come."""
        try:
            usage, _ = loser_usage(Loser(opened.deployment, (opened.first, opened.rest)), call)
            settle = self._accountant.settle
            settle(call, opened.deployment, usage, status="partial", delivered=False)
        except Exception:
            log.exception("pricing the stream of %s failed", call.request_id)

    async def _settle_hedges(
        self,
        call: Call,
        losers: list[Loser],
        fired: int,
        won: bool,
    ) -> None:
        """Count the hedges and price the attempts that lost the race: the upstream
        worked on them (a cancelled one is charged its prompt, as it was sent)."""
        if not fired:
            return
        m = self._metrics
        m.child(m.hedges, call.route.name, "fired").inc(fired)
        if won:
            m.child(m.hedges, call.route.name, "won").inc()
        try:
            answers = map(loser_answer, losers)
            await count_unreported(call.prompt, call.endpoint, call.body, answers)
        finally:  # priced, then closed, however the wait ends (cut short: counted on the loop)
            for n, loser in enumerate(losers, start=1):
                usage, status = loser_usage(loser, call)
                self._accountant.settle(call, loser.deployment, usage, status=status, label=f"h{n}")
            for loser in losers:
                if isinstance(loser.result, tuple):  # a stream that opened too late
                    await close_stream(loser.result[1])

    def _observe(
        self, call: Call, deployment: DeploymentRuntime, status: str, ttft_s: float | None = None
    ) -> None:
        """Count an answered request: its metrics and its SLA outcome (a non-streamed
        answer's first token is the answer: `ttft_s` None means the whole elapsed time)."""
        m = self._metrics
        elapsed = time.perf_counter() - call.started
        m.child(m.requests, call.route.name, deployment.name, call.team, status).inc()
        m.child(m.tier_requests, call.route.name, deployment.tier).inc()
        m.child(m.latency, call.route.name, deployment.name).observe(elapsed)
        if self._guard is not None:
            self._guard.count_outcome(call.route, ttft_s, elapsed)


def limited_body(endpoint: EndpointType, body: dict[str, Any]) -> dict[str, Any]:
    """The body as limits read it: a legacy completion without `max_tokens` asks for the
    API's own default, 16 tokens, which is then what is held and, when a budget or rate
    limit applies, sent (not the route's `max_output_tokens`, which would let it write
    more than the client would get from OpenAI); a chat request as it is."""
    if endpoint != "completions" or asked_tokens(body) is not None:
        return body
    return {**body, "max_tokens": LEGACY_COMPLETION_MAX_TOKENS}


def hedge_of(route: RouteRuntime) -> Hedge | None:
    sla = route.sla
    if sla is None or sla.hedge_after_s is None:
        return None
    return Hedge(sla.hedge_after_s, sla.max_hedges)


def priority_of(route: RouteRuntime) -> int | None:
    return None if route.sla is None else route.sla.priority


def cascade_verdict(route: RouteRuntime, result: CascadeResult) -> str:
    """What the cascade decided, for the decisions log."""
    scores = ", ".join(f"{s:.3f}" for s in result.scores) or "none (one tier)"
    if route.strategy == "select":  # every answer of the chain is judged, its last too
        judged = [(r.deployment, r.verifier_score) for r in result.records]
        scores = ", ".join(f"'{d}' {s:.3f}" for d, s in judged if s is not None) or "none"
    verdict = (
        f"{route.strategy}: verifier scores {scores} against {route.verify_threshold}; "
        f"{result.escalations} escalation(s); answered by '{result.final.deployment.name}' "
        f"(tier {result.final.deployment.tier})"
    )
    if result.second_opinions is not None:
        agreeing, answered = result.second_opinions
        verdict += f"; second opinions: {agreeing} of {answered} agreeing"
    return verdict


def missed_sla(error: GatewayError) -> bool:
    """A request the upstreams failed (or that was shed) missed its SLA; one the client
    or its limits refused is not the route's to count."""
    return error.status >= 500 or error.code in SLA_FAILURES


def climb(choice: Choice, candidates: list[DeploymentRuntime]) -> list[DeploymentRuntime]:
    """A verified `select`: the candidates (those left to try) along the chain of the
    choice made again among them, so that a chosen deployment the breaker ejected gives
    way to the next cheapest that meets the target, not to the dearest."""
    by_name = _rated(choice, candidates)
    if not by_name:
        return candidates[:1]
    return [by_name[name] for name in choice.among(by_name).chain()]


def _rated(choice: Choice, candidates: list[DeploymentRuntime]) -> dict[str, DeploymentRuntime]:
    """The `candidates` the choice rated, by name: those left to try, made again among."""
    return {d.name: d for d in candidates if d.name in choice.estimates}


def explored(
    choice: Choice,
    chain: list[DeploymentRuntime],
    candidates: list[DeploymentRuntime],
    share: float,
    roll: Callable[[], float] = random.random,
) -> list[DeploymentRuntime]:
    """`chain` with, on `share` of the requests, the candidate just under the target
    (`Choice.explorer`) tried first: verified, escalated when rejected, and learned from,
    so that a candidate placed below the target can earn its place back."""
    if share <= 0 or roll() >= share:
        return chain
    by_name = _rated(choice, candidates)
    name = choice.among(by_name).explorer() if by_name else None
    return chain if name is None else [by_name[name], *chain]


def effective_strategy(
    route: RouteRuntime,
    stream: bool,
    endpoint: EndpointType,
    needs: Mapping[str, str] | None = None,
) -> str:
    """A cascade route routes streams by classifier when its policy says so, and
    embeddings and tool requests in tier order (cheapest first, the next on failure):
    a vector has no text to verify, nor has a tool call (its content is empty, so the
    verifier would reject every one), and escalating would pay every tier for the last
    one's answer."""
    if route.strategy == "select" and endpoint == "embeddings":
        return "fallback"  # a vector's quality is not predicted: the route's order
    if route.strategy != "cascade":
        return route.strategy
    if endpoint == "embeddings" or (needs is not None and "tools" in needs):
        return "fallback"
    if stream and route.stream_cascade == "classifier":
        return "classifier"
    return route.strategy


def cascade_headers(call: Call, deployment: DeploymentRuntime, attempts: int) -> dict[str, str]:
    headers = {
        "x-request-id": call.request_id,
        "x-cascade-route": call.route.name,
        "x-cascade-deployment": deployment.name,
        "x-cascade-tier": deployment.tier,
        "x-cascade-escalations": "0",
        "x-cascade-attempts": str(attempts),
    }
    if call.score is not None:
        headers["x-cascade-score"] = f"{call.score:.4f}"
    return headers

"""Admission and settlement of budgets and rate limits, around each upstream call.

    admission = await limiter.admit(runtime, principal, route, endpoint, body,
                                    candidates, strategy, request_id, call.prompt)
    body = admission.cap(endpoint, body)  # no more output asked than was reserved
    ... call admission.candidates or the planned candidates ...
    admission.settle(records)        # exactly once, however the request ended

A request with no limits (no budget on its key, team or route, no rate limit on its key
or team) gets `UNLIMITED` without a Redis round trip or a token count. Otherwise its
prompt is counted (into the request's `PromptCounts`, which pricing reuses when an
upstream reports no usage), one script call admits it (rate limits, then budgets: a
soft limit may switch the plan to the budget's downgrade tier, a hard limit refuses
with 429), and one settles it later: `settle` only queues, a writer task sends queued
settlements in pipelined batches. A budget's period starts from the ledger's spend in
it (`gateway.limits.ledger_spend`), read per worker, scope and period until the
budget is seeded (`gateway.limits.seeds`). The script call runs in a task of its own: a request
cancelled meanwhile (its client went away) may have been admitted by Redis all the
same, and that admission is then released as a request that ends unanswered is.

Redis unreachable: the policy's `gateway.limits_when_redis_down` decides: `open`
serves without checks (counted, logged once per outage) and still queues the
request's settlement so its spend reaches the budget counters when Redis is back;
`closed` refuses with 503. Admissions in flight when the store hangs wait one
bounded timeout; from then on they skip it, and a background task probes it once a
second until it answers, so an outage costs no per-request timeouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from gateway.auth import Principal
from gateway.billing.tokens import PromptCounts
from gateway.errors import LimitsUnavailable, retry_after_header
from gateway.ledger.record import SpendRecord, usd
from gateway.limits.budgets import (
    Output,
    budget_exceeded,
    capped_body,
    dollars,
    downgrade_plans,
    output_of,
    worst_case_nanos,
)
from gateway.limits.rate_limits import rate_limited, ratelimit_headers
from gateway.limits.rules import Calendar, RuleBook, Rules
from gateway.limits.seeds import Seeds, SpendReader
from gateway.limits.store import (
    Admitted,
    Ask,
    Balances,
    BudgetRefusal,
    Charge,
    LimitsStoreUnavailable,
    LimitStore,
    RateRefusal,
)
from gateway.metrics import Metrics
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime
from gateway.tasks import start_background, stop_tasks
from gateway.upstreams.base import EndpointType

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 1.0  # during an outage, how often the probe task tries the store
WATCH_INTERVAL_S = 5.0  # otherwise, how often the watch task does (see `watch`)
HOLD_GRACE_S = 600.0  # a hold outlives the request timeout by this (streams run longer)
BATCH_MAX = 64
MAX_PENDING = 100_000  # settlements kept while Redis is down; older ones are dropped


@dataclass(frozen=True, slots=True)
class Reserved:
    """What an admission counted on: output tokens per answer (sent upstream as the
    cap) and, where budgets held money, how much (None: nothing was held)."""

    route: str
    per_choice: int
    nanos: int | None


class Admission:
    """One admitted request: the plan to use and the headers to send, and its
    settlement, which happens once (later calls do nothing)."""

    __slots__ = ("_charge", "_limiter", "_reserved", "_tokens", "candidates", "headers")

    def __init__(
        self,
        limiter: Limiter | None = None,
        charge: Charge | None = None,
        tokens: int = 0,
        candidates: list[DeploymentRuntime] | None = None,
        headers: Mapping[str, str] | None = None,
        reserved: Reserved | None = None,
    ) -> None:
        self._limiter, self._charge, self._tokens = limiter, charge, tokens
        self._reserved = reserved
        self.candidates = candidates  # None: as planned; else the downgrade tier's
        self.headers: Mapping[str, str] = headers or {}

    def cap(self, endpoint: EndpointType, body: dict[str, Any]) -> dict[str, Any]:
        """`body` asking upstreams for no more output than was reserved for it."""
        if self._reserved is None:
            return body
        return capped_body(endpoint, body, self._reserved.per_choice)

    def settle(self, records: Sequence[SpendRecord]) -> None:
        """Charge what `records` (the request's priced attempts) cost and release the
        reservation. Synchronous: safe in `finally` blocks of cancelled tasks."""
        limiter, charge = self._limiter, self._charge
        if limiter is None or charge is None:
            return
        self._limiter = None
        used = sum(r.prompt_tokens + r.completion_tokens for r in records)
        cost = sum(r.cost_nanos for r in records)
        delta = used - self._tokens if charge.window >= 0 else 0
        limiter.enqueue(dataclasses.replace(charge, token_delta=delta, cost_nanos=cost))
        reserved = self._reserved
        if reserved is not None and reserved.nanos is not None and cost > reserved.nanos:
            limiter.overrun(charge.request_id, reserved, records, cost - reserved.nanos)


UNLIMITED = Admission()


def _release_abandoned(checking: asyncio.Future[Admission]) -> None:
    """The admission of a request cancelled while the store checked it: released as a
    request that ends unanswered is (its holds, its tokens), once the store answered."""
    if checking.cancelled() or checking.exception() is not None:
        return
    checking.result().settle([])


class Limiter:
    """Budgets and rate limits for the gateway, on a `LimitStore` (None: no store, as
    when REDIS_URL is unset; limits then follow the outage policy)."""

    def __init__(
        self,
        store: LimitStore | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        ledger_spend: SpendReader | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self.clock = clock  # wall clock for budget periods (tests move it)
        self._calendar = Calendar()
        self._seeds = None if ledger_spend is None else Seeds(ledger_spend)
        self._runtime: Runtime | None = None
        self._book = RuleBook({}, {}, {})
        self._down = False  # admissions skip the store until the probe finds it again
        self._prober: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._heard_at = -math.inf  # time.monotonic() when the store last answered
        self._queue: deque[Charge] = deque()
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._writing = False  # a batch is off the queue and not yet written
        self._stopped = False
        self._dropped = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def admit(
        self,
        runtime: Runtime,
        principal: Principal,
        route: RouteRuntime,
        endpoint: EndpointType,
        body: Mapping[str, Any],
        candidates: list[DeploymentRuntime],
        strategy: str,
        request_id: str,
        prompt: PromptCounts,
        needs: frozenset[str] = frozenset(),
    ) -> Admission:
        """Admit the request or raise `RateLimited`, `BudgetExceeded` or (store down,
        policy closed) `LimitsUnavailable`. The prompt's count lands in `prompt`."""
        rules = self._book_of(runtime).rules_for(principal.key_id, principal.team, route.name)
        if rules is None or not candidates:  # no candidates: nothing will be called
            return UNLIMITED
        plans = self._plans(runtime, route, candidates, rules, needs)
        tokens = await prompt.count(plans[0][0].target.model, endpoint, body)
        output = output_of(endpoint, body, rules.max_output_tokens)
        ask = self._ask(runtime, route, output, plans, strategy, rules, request_id, tokens)
        if self._store is None or self._down:
            return self._unchecked(
                runtime, ask, None, Reserved(route.name, output.per_choice, None)
            )
        if self._seeds is not None and ask.budgets:
            seeds = await self._seeds.offer(ask.budgets, ask.periods, self.clock())
            ask = dataclasses.replace(ask, seeds=seeds)
        reserved = Reserved(route.name, output.per_choice, None)
        # Shielded from the caller: once the script is sent, Redis may run it whether or
        # not its reply is awaited, and only the task's result can release what it took.
        checking = asyncio.ensure_future(self._checked(runtime, ask, plans, reserved))
        try:
            return await asyncio.shield(checking)
        except asyncio.CancelledError:
            checking.add_done_callback(_release_abandoned)
            raise

    async def _checked(
        self,
        runtime: Runtime,
        ask: Ask,
        plans: list[list[DeploymentRuntime]],
        reserved: Reserved,
    ) -> Admission:
        """The store's verdict on `ask`, as an admission or the refusal it raises."""
        assert self._store is not None
        try:
            verdict = await self._store.admit(ask)
        except LimitsStoreUnavailable as exc:
            return self._unchecked(runtime, ask, exc, reserved)
        self._recovered()
        if self._seeds is not None:
            self._seeds.note(ask, verdict)
        if isinstance(verdict, RateRefusal):
            self._refuse_rate(ask, verdict)
        if isinstance(verdict, BudgetRefusal):
            self._refuse_budget(ask, verdict)
        held = ask.options[verdict.option] if ask.budgets else None
        return self._admitted(ask, verdict, plans, dataclasses.replace(reserved, nanos=held))

    @staticmethod
    def _plans(
        runtime: Runtime,
        route: RouteRuntime,
        candidates: list[DeploymentRuntime],
        rules: Rules,
        needs: frozenset[str],
    ) -> list[list[DeploymentRuntime]]:
        """The planned candidates, then one plan per downgrade tier the route serves."""
        return [candidates, *downgrade_plans(runtime, route, rules, needs).values()]

    def _ask(
        self,
        runtime: Runtime,
        route: RouteRuntime,
        output: Output,
        plans: list[list[DeploymentRuntime]],
        strategy: str,
        rules: Rules,
        request_id: str,
        prompt: int,
    ) -> Ask:
        options = tuple(
            worst_case_nanos(plan, strategy, route, prompt, output, rules.copies) for plan in plans
        )
        tiers = [plan[0].tier for plan in plans]
        now = self.clock()
        periods = tuple(self._calendar.period(b.period, now) for b in rules.budgets)
        down = tuple(  # the option a budget past its soft limit switches to; 0: none
            tiers.index(b.downgrade_tier, 1) if b.downgrade_tier in tiers[1:] else 0
            for b in rules.budgets
        )
        hold_ms = int((runtime.request_timeout_s + HOLD_GRACE_S) * 1000)
        tokens = prompt + output.per_choice * output.choices
        return Ask(request_id, rules.rates, rules.budgets, periods, options, down, tokens, hold_ms)

    def _admitted(
        self,
        ask: Ask,
        verdict: Admitted,
        plans: list[list[DeploymentRuntime]],
        reserved: Reserved,
    ) -> Admission:
        m = self._metrics
        candidates = None
        if verdict.option > 0:
            candidates = plans[verdict.option]
            for budget, period, past in zip(
                ask.budgets, ask.periods, verdict.past_soft, strict=True
            ):
                if past and budget.downgrade_tier == candidates[0].tier:
                    m.child(m.budget_downgrades, budget.scope, budget.name, budget.period).inc()
                    log.info(
                        "%s is past its soft limit (period %s): request %s goes to tier '%s'",
                        budget.label,
                        period.id,
                        ask.request_id,
                        budget.downgrade_tier,
                    )
                    break
        charge = Charge(
            ask.request_id, ask.rates, ask.budgets, ask.periods, verdict.window, 0, 0,
            verdict.windows,
        )  # fmt: skip
        headers = ratelimit_headers(ask.rates, verdict.remaining) if ask.rates else None
        return Admission(self, charge, ask.tokens, candidates, headers, reserved)

    def _refuse_rate(self, ask: Ask, refusal: RateRefusal) -> NoReturn:
        rule = ask.rates[refusal.rule]
        m = self._metrics
        m.child(m.rate_limit_rejections, rule.scope, rule.name, refusal.kind).inc()
        raise rate_limited(rule, refusal, ask.tokens)

    def _refuse_budget(self, ask: Ask, refusal: BudgetRefusal) -> NoReturn:
        budget, period = ask.budgets[refusal.rule], ask.periods[refusal.rule]
        m = self._metrics
        m.child(m.budget_rejections, budget.scope, budget.name, budget.period).inc()
        raise budget_exceeded(budget, period, refusal, self.clock())

    def _unchecked(
        self,
        runtime: Runtime,
        ask: Ask,
        exc: LimitsStoreUnavailable | None,
        reserved: Reserved,
    ) -> Admission:
        """The store is down (or absent): fail open or closed, as the policy says."""
        if exc is not None or not self._down:
            self._enter_outage(exc)
        m = self._metrics
        if runtime.policy.gateway.limits_when_redis_down == "closed":
            m.child(m.limits_unavailable, "refused").inc()
            raise LimitsUnavailable(
                "budgets and rate limits cannot be checked (their store is unreachable) "
                "and the policy's gateway.limits_when_redis_down is 'closed'",
                headers=retry_after_header(1),
            )
        m.child(m.limits_unavailable, "served_unchecked").inc()
        charge = Charge(ask.request_id, ask.rates, ask.budgets, ask.periods, -1, 0, 0)
        return Admission(self, charge, ask.tokens, reserved=reserved)

    def overrun(
        self, request_id: str, reserved: Reserved, records: Sequence[SpendRecord], nanos: int
    ) -> None:
        """A request cost `nanos` more than its budgets held: its real cost is settled
        all the same; counted, and logged once (the request's one line)."""
        deployment = records[-1].deployment
        m = self._metrics
        m.child(m.budget_overrun, reserved.route, deployment).inc(usd(nanos))
        log.warning(
            "request %s cost %s more than its budgets reserved (%s; answered by '%s', "
            "%d upstream call(s)): an upstream billed past the max_tokens it was sent, "
            "or attempts that timed out were charged their prompts",
            request_id,
            dollars(nanos),
            dollars(reserved.nanos or 0),
            deployment,
            len(records),
        )

    async def show_budgets(self, runtime: Runtime) -> None:
        """Set `cascade_budget_remaining_usd` (and `..._soft_limit_remaining_usd`) of every
        budget of the policy from the
        store, for a scrape: every worker and replica reads the same counters, and a
        budget reads its full limit from startup and from the first second of a new
        period, before any request settles there. While the store is down the gauges
        keep the last figures read (`cascade_limits_degraded` says so)."""
        if self._store is None or self._down:
            return
        budgets = [rule for rules in self._book_of(runtime).budgets.values() for rule in rules]
        if not budgets:
            return
        now = self.clock()
        periods = [self._calendar.period(rule.period, now) for rule in budgets]
        try:
            spent = await self._store.spent(list(zip(budgets, periods, strict=True)))
        except LimitsStoreUnavailable as exc:
            log.debug("budget gauges not refreshed: %s", exc)
            return
        m = self._metrics
        for rule, nanos in zip(budgets, spent, strict=True):
            labels = (rule.scope, rule.name, rule.period)
            m.child(m.budget_remaining, *labels).set(usd(rule.limit_nanos - nanos))
            if rule.soft_nanos is not None:  # a state, for an alert that holds while past it
                m.child(m.budget_soft_remaining, *labels).set(usd(rule.soft_nanos - nanos))

    def _enter_outage(self, exc: LimitsStoreUnavailable | None) -> None:
        if not self._down:
            self._down = True
            self._metrics.limits_degraded.set(1)
            why = "REDIS_URL is not set" if exc is None else str(exc)
            log.warning("limits store unavailable (%s): applying limits_when_redis_down", why)
        if self._store is not None and not self._stopped and not self._probing:
            self._prober = start_background(self._probe_loop())

    def _book_of(self, runtime: Runtime) -> RuleBook:
        if runtime is not self._runtime:
            self._book = RuleBook.build(runtime.policy)
            self._runtime = runtime
        return self._book

    def watch(self, runtime: Callable[[], Runtime]) -> None:
        """While the serving policy (`runtime()`) sets limits, probe the store whenever
        it has not answered for `WATCH_INTERVAL_S`, from startup on, so that an outage
        shows (`cascade_limits_degraded`, the log) before an admission meets it. Needs a
        running loop; `stop` ends it."""
        if self._store is None:
            if not self._book_of(runtime()).empty:
                self._enter_outage(None)  # limits with nowhere to keep them: say so now
        elif self._watcher is None:
            self._watcher = start_background(self._watch_loop(runtime))

    async def _watch_loop(self, runtime: Callable[[], Runtime]) -> None:
        assert self._store is not None
        while not self._stopped:
            # Only while traffic is quiet: under load, admissions and settlements tell
            # already, and a probe queued behind them could time out and fake an outage.
            quiet = time.monotonic() - self._heard_at >= WATCH_INTERVAL_S
            if quiet and not self._down and not self._book_of(runtime()).empty:
                try:
                    await self._store.probe()
                    self._heard_at = time.monotonic()
                except LimitsStoreUnavailable as exc:
                    self._enter_outage(exc)
                except Exception:  # a bug must not end the watch
                    log.exception("probing the limits store failed")
            await asyncio.sleep(WATCH_INTERVAL_S)

    @property
    def _probing(self) -> bool:
        return self._prober is not None and not self._prober.done()

    async def _probe_loop(self) -> None:
        """Try the store once a second while it is down; the first answer ends the
        outage. Off the request path: no admission ever waits on a probe."""
        assert self._store is not None
        while self._down:
            await asyncio.sleep(PROBE_INTERVAL_S)
            try:
                await self._store.probe()
            except LimitsStoreUnavailable:
                continue
            except Exception:  # a bug must not end probing and leave limits off for good
                log.exception("probing the limits store failed")
                continue
            self._recovered()

    def _recovered(self) -> None:
        """The store answered (an admission, a settlement, a probe)."""
        self._heard_at = time.monotonic()
        if self._down:
            self._down = False
            self._metrics.limits_degraded.set(0)
            log.warning("limits store is reachable again; limits are checked")

    def enqueue(self, charge: Charge) -> None:
        """Queue a settlement for the writer task (needs a running loop)."""
        if self._store is None:
            return
        if self._stopped:
            log.warning("settlement of %s after shutdown is dropped", charge.request_id)
            return
        if len(self._queue) >= MAX_PENDING:
            self._queue.popleft()
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.error("%d budget settlement(s) dropped: the queue is full", self._dropped)
        self._queue.append(charge)
        self._wakeup.set()
        if self._writer is None or self._writer.done():
            self._writer = start_background(self._write_loop())

    async def _write_loop(self) -> None:
        assert self._store is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(BATCH_MAX, len(self._queue)))]
                self._writing = True
                try:
                    results = await self._store.settle_many(batch)
                except LimitsStoreUnavailable as exc:
                    self._queue.extendleft(reversed(batch))  # idempotent: resend them later
                    self._enter_outage(exc)
                    self._metrics.limits_pending.set(len(self._queue))
                    await asyncio.sleep(PROBE_INTERVAL_S)
                    continue
                except Exception:  # a bug must not end the writer and strand the queue
                    log.exception("settling %d budget charge(s) failed", len(batch))
                    continue
                finally:
                    self._writing = False
                self._recovered()
                for charge, balances in zip(batch, results, strict=True):
                    if balances is not None:
                        self._observe(charge, balances)
            self._metrics.limits_pending.set(0)

    def _observe(self, charge: Charge, balances: Balances) -> None:
        m = self._metrics
        for budget, period, balance in zip(charge.budgets, charge.periods, balances, strict=True):
            if balance is None:  # its slot had settled this charge before
                continue
            labels = (budget.scope, budget.name, budget.period)
            soft = budget.soft_nanos
            before = balance.spent_nanos - charge.cost_nanos
            if soft is not None and before < soft <= balance.spent_nanos:
                m.child(m.budget_soft_crossings, *labels).inc()
                log.warning(
                    "%s passed its soft limit of %s for %s: %s spent of %s",
                    budget.label,
                    dollars(soft),
                    period.id,
                    dollars(balance.spent_nanos),
                    dollars(budget.limit_nanos),
                )

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Write the queued settlements (up to `timeout_s`), then stop the writer."""
        deadline = time.monotonic() + timeout_s
        while (self._queue or self._writing) and not self._down and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._stopped = True
        if self._queue:
            log.error(
                "%d budget settlement(s) not written at shutdown; their holds expire and "
                "their spend is in the ledger only",
                len(self._queue),
            )
        await stop_tasks(self._writer, self._prober, self._watcher)
        self._writer = self._prober = self._watcher = None
        if self._store is not None:
            await self._store.close()

"""Budgets: what a request may cost at worst, the plans a soft limit may switch to,
and the 429 a hard limit answers.

The worst case is reserved before the upstream call: prompt tokens (every form counted:
`gateway.billing.tokens`) plus, per answer billed (`n`, a completion's `best_of` and its list of
prompts), the request's `max_completion_tokens`/`max_tokens` (else the route's
`max_output_tokens`, which is then sent upstream: `capped_body`; never more than a
deployment's own `max_output_tokens`), priced at the most expensive deployment the plan
may call; a cascade may pay for one answer per tier, so it is the sum over the tiers it may
try (plus one answer per second opinion when it has a tier to escalate to, even for a
prompt that turns out to get none: the hold errs high; and, on a route with a `judge`,
one grade per verified answer, its prompt the request's, an answer and the rubric), and
a hedged
route may pay for `1 + max_hedges` answers at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gateway.errors import BudgetExceeded, RateLimited
from gateway.limits.rules import BudgetRule, Period, Rules
from gateway.limits.store import BudgetRefusal
from gateway.request import asked_tokens, choices_of, output_cap
from gateway.runtime import (
    JUDGE_OVERHEAD_TOKENS,
    DeploymentRuntime,
    RouteRuntime,
    Runtime,
    tier_groups,
)
from gateway.upstreams.base import EndpointType

SIGNIFICANT_DIGITS = 6  # in dollar amounts of messages
# A busy budget's Retry-After: requests in flight release their holds as they end.
BUSY_RETRY_S = 2.0


@dataclass(frozen=True, slots=True)
class Output:
    """The output a request may be billed for: `per_choice` tokens for each of
    `choices` answers (0 for embeddings)."""

    per_choice: int
    choices: int

    def tokens(self, deployment: DeploymentRuntime) -> int:
        """At most, from `deployment` (which is never asked for more than its own cap)."""
        cap = deployment.max_output_tokens
        return min(self.per_choice, cap if cap is not None else self.per_choice) * self.choices


def output_of(endpoint: EndpointType, body: Mapping[str, Any], default: int) -> Output:
    """The most output a request may be billed for; `default` when it sets no maximum."""
    if endpoint == "embeddings":
        return Output(0, 0)
    return Output(asked_tokens(body) or default, choices_of(endpoint, body))


def capped_body(endpoint: EndpointType, body: dict[str, Any], per_choice: int) -> dict[str, Any]:
    """`body` asking for no more than `per_choice` output tokens per answer, what was
    reserved: an upstream honours the cap, so what it bills stays within the hold."""
    fields = output_cap(endpoint, body, per_choice)
    return {**body, **fields} if fields else body


def worst_case_nanos(
    candidates: Sequence[DeploymentRuntime],
    strategy: str,
    route: RouteRuntime,
    prompt: int,
    output: Output,
    copies: int,
) -> int:
    def answer(d: DeploymentRuntime) -> int:
        return d.price.worst_case_nanos(prompt, output.tokens(d))

    steps = route.max_escalations + 1
    if strategy == "cascade":
        groups = tier_groups(list(candidates))[:steps]
    elif strategy == "select" and route.verify:  # may climb (`climbs`): the dearest, distinct
        steps += route.explore > 0  # an exploring request tries one candidate more first
        groups = [[d] for d in sorted(candidates, key=answer, reverse=True)[:steps]]
    else:
        groups = [list(candidates)]

    per_answer = (max(answer(d) for d in group) for group in groups)
    # Second opinions may be asked when a cascade verifies an answer, i.e. has a second
    # tier; held whether or not this prompt gets them (the hold errs high, never low).
    opinions = route.second_opinions if len(groups) > 1 else ()
    # The judge reads the prompt and one answer (one choice: its first) and writes a token.
    judge, verified = route.judge, len(groups) - 1
    grades = (
        verified
        * judge.price.worst_case_nanos(prompt + output.per_choice + JUDGE_OVERHEAD_TOKENS, 1)
        if judge is not None
        else 0
    )
    return copies * sum(per_answer) + sum(answer(d) for d in opinions) + grades


def downgrade_plans(
    runtime: Runtime, route: RouteRuntime, rules: Rules, needs: frozenset[str] = frozenset()
) -> dict[str, list[DeploymentRuntime]]:
    """For each downgrade tier of the budgets in `rules`: the route's available
    deployments in that tier that serve what the request `needs` (tools, vision...), in
    route order. Tiers with none are left out (for this request the budget only alerts)."""
    plans: dict[str, list[DeploymentRuntime]] = {}
    for budget in rules.budgets:
        tier = budget.downgrade_tier
        if tier is None or budget.soft_nanos is None or tier in plans:
            continue
        deployments = [runtime.deployments[name] for name in route.deployments]
        found = [
            d
            for d in deployments
            if d.tier == tier and d.unavailable_reason is None and d.serves(needs)
        ]
        if found:
            plans[tier] = found
    return plans


def dollars(nanos: int) -> str:
    """A USD amount for messages: `$12.50`, `$1234.57`, `$0.0003`, `$0.000123457`.
    Up to 6 significant digits, trailing zeros trimmed, never fewer than cents (a
    budget of $0.0003 must not read `$0.00`)."""
    sign = "-" if nanos < 0 else ""
    digits = len(str(abs(nanos)))
    decimals = min(9, max(2, 9 - digits + SIGNIFICANT_DIGITS))
    whole, _, fraction = f"{Decimal(abs(nanos)).scaleb(-9):.{decimals}f}".partition(".")
    return f"{sign}${whole}.{fraction.rstrip('0').ljust(2, '0')}"


def budget_exceeded(
    budget: BudgetRule, period: Period, refusal: BudgetRefusal, now: float
) -> RateLimited:
    """The refusal's error. A budget whose settled spend leaves room for the request,
    full only of what requests in flight hold (their worst cases, released as they
    end: a burst, or a Redis Cluster's slots each holding for a request another
    refused), is busy, not spent: a 429 to retry in a few seconds, not one that tells
    the SDKs to wait until the period ends."""
    used, cost, spent = refusal.used_nanos, refusal.cost_nanos, refusal.spent_nanos
    if refusal.busy and spent is not None:
        return RateLimited(
            f"{budget.label} is held by requests in flight: {dollars(used)} of "
            f"{dollars(budget.limit_nanos)} is spent or reserved ({dollars(spent)} spent) "
            f"and this request may cost up to {dollars(cost)}; retry once they end",
            retry_after_s=BUSY_RETRY_S,
            code="budget_busy",
        )
    left = max(0, budget.limit_nanos - used)
    limit = dollars(budget.limit_nanos)
    if cost > budget.limit_nanos:
        why = (
            f"this request alone may cost up to {dollars(cost)}, more than the whole "
            f"budget of {limit}; lower max_tokens"
        )
    else:
        why = (
            f"{dollars(used)} of {limit} is spent or reserved and "
            f"this request may cost up to {dollars(cost)}"
        )
    message = (
        f"{budget.label} is exhausted: {why} ({dollars(left)} left); it resets at {period.ends_iso}"
    )
    return BudgetExceeded(message, retry_after_s=math.ceil(period.ends_at - now))

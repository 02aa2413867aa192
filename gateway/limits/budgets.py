"""Budgets: what a request may cost at worst, the plans a soft limit may switch to,
and the 429 a hard limit answers.

The worst case is reserved before the upstream call: prompt tokens (counted with the
tokenizer) plus the request's `max_completion_tokens`/`max_tokens` (else the route's
`max_output_tokens`), times `n`, priced at the most expensive deployment the plan may
call; a cascade may pay for one answer per tier, so it is the sum over the tiers it may
try (plus one answer per second opinion when it has a tier to escalate to, even for a
prompt that turns out to get none: the hold errs high), and a hedged
route may pay for `1 + max_hedges` answers at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from gateway.cascade import tier_groups
from gateway.errors import BudgetExceeded
from gateway.limits.rules import BudgetRule, Period, Rules
from gateway.runtime import DeploymentRuntime, RouteRuntime, Runtime
from gateway.upstreams.base import EndpointType

SIGNIFICANT_DIGITS = 6  # in dollar amounts of messages


def output_tokens(endpoint: EndpointType, body: Mapping[str, Any], default: int) -> int:
    """The most output tokens a request may be billed for."""
    if endpoint == "embeddings":
        return 0
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    per_choice = asked if isinstance(asked, int) and asked > 0 else default
    n = body.get("n")
    return per_choice * (n if isinstance(n, int) and n > 1 else 1)


def worst_case_nanos(
    candidates: Sequence[DeploymentRuntime],
    strategy: str,
    route: RouteRuntime,
    prompt: int,
    output: int,
    copies: int,
) -> int:
    groups = (
        tier_groups(list(candidates))[: route.max_escalations + 1]
        if strategy == "cascade"
        else [candidates]
    )
    per_answer = (max(d.price.cost_nanos(prompt, output) for d in group) for group in groups)
    # Second opinions may be asked when a cascade verifies an answer, i.e. has a second
    # tier; held whether or not this prompt gets them (the hold errs high, never low).
    opinions = route.second_opinions if len(groups) > 1 else ()
    return copies * sum(per_answer) + sum(d.price.cost_nanos(prompt, output) for d in opinions)


def downgrade_plans(
    runtime: Runtime, route: RouteRuntime, rules: Rules
) -> dict[str, list[DeploymentRuntime]]:
    """For each downgrade tier of the budgets in `rules`: the route's available
    deployments in that tier, in route order. Tiers the route does not serve are left
    out (such a budget only alerts)."""
    plans: dict[str, list[DeploymentRuntime]] = {}
    for budget in rules.budgets:
        tier = budget.downgrade_tier
        if tier is None or budget.soft_nanos is None or tier in plans:
            continue
        deployments = [runtime.deployments[name] for name in route.deployments]
        found = [d for d in deployments if d.tier == tier and d.unavailable_reason is None]
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
    budget: BudgetRule, period: Period, used: int, cost: int, now: float
) -> BudgetExceeded:
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

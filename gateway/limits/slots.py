"""How a request's limit rules fall into Redis Cluster slots, and its verdict put back
together from one script call per slot.

On a cluster every rule's keys carry the tag of its scope and name
(`{limits:team:research}`), so the rules of one team, key or route share a slot and
different ones spread over the masters. An admission then runs `ADMIT_LUA` once per
slot (each atomic, and a budget is only ever checked and reserved in its own slot), and
a refusal in one slot releases what the others reserved (`RELEASE_LUA`). A budget is
never overspent: a reservation stands for its hold time at most, and while it stands it
only makes a concurrent request more likely to be refused, never less.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.limits.rules import BudgetRule, RateRule
from gateway.limits.store import Admitted, BudgetRefusal, RateRefusal, Verdict


@dataclass(frozen=True, slots=True)
class SlotGroup:
    """The rules of one scope and name: indices into the request's rates and budgets."""

    scope: str
    name: str
    rates: tuple[int, ...]
    budgets: tuple[int, ...]


def slot_groups(rates: Sequence[RateRule], budgets: Sequence[BudgetRule]) -> list[SlotGroup]:
    """The request's rules by (scope, name), in the order they first appear."""
    found: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    for i, rate in enumerate(rates):
        found.setdefault((rate.scope, rate.name), ([], []))[0].append(i)
    for i, budget in enumerate(budgets):
        found.setdefault((budget.scope, budget.name), ([], []))[1].append(i)
    return [SlotGroup(scope, name, tuple(r), tuple(b)) for (scope, name), (r, b) in found.items()]


def first_downgrade(
    budgets: Sequence[BudgetRule], downgrades: Sequence[int], used: Sequence[int | None]
) -> int:
    """The plan an admission takes, as `ADMIT_LUA` picks it in one slot: the downgrade
    of the first budget past its soft limit that has one, else 0. `used`: spent plus
    reserved per budget (None where it was not read: no downgrade to take)."""
    for budget, down, amount in zip(budgets, downgrades, used, strict=True):
        soft = budget.soft_nanos
        if down > 0 and soft is not None and amount is not None and amount >= soft:
            return down
    return 0


def merged(
    groups: Sequence[SlotGroup],
    verdicts: Sequence[Verdict],
    n_rate: int,
    n_budget: int,
    forced: int | None,
) -> Verdict:
    """One verdict from each group's (their rule indices local to the group): the first
    refusal in the order one script checks (rate rules, then budgets), else the
    admission. `forced`: the plan every group was given (its scripts saw it as plan 0),
    None when each chose its own (none could downgrade: all chose 0)."""
    rates: list[RateRefusal] = []
    budgets: list[BudgetRefusal] = []
    remaining: list[tuple[int | None, int | None]] = [(None, None)] * n_rate
    minutes = [-1] * n_rate
    past_soft = [False] * n_budget
    unseeded = [False] * n_budget
    windows: list[tuple[bool, int]] = []  # (counted no rate, its minute) per admission
    for group, verdict in zip(groups, verdicts, strict=True):
        if isinstance(verdict, RateRefusal):
            rates.append(dataclasses.replace(verdict, rule=group.rates[verdict.rule]))
        elif isinstance(verdict, BudgetRefusal):
            option = verdict.option if forced is None else forced
            rule = group.budgets[verdict.rule]
            budgets.append(dataclasses.replace(verdict, rule=rule, option=option))
        else:
            windows.append((not group.rates, verdict.window))
            for local, rule in enumerate(group.rates):
                remaining[rule] = verdict.remaining[local]
                minutes[rule] = verdict.window
            for local, rule in enumerate(group.budgets):
                past_soft[rule] = verdict.past_soft[local]
            for local, flag in enumerate(verdict.unseeded):
                unseeded[group.budgets[local]] = flag
    if rates:
        return min(rates, key=lambda r: r.rule)
    if budgets:  # a spent budget before a busy one: only a spent one says "until it resets"
        return min(budgets, key=lambda r: (r.busy, r.rule))
    # The first minute a rate rule counted the request in; each rule's own, which a
    # settlement corrects its tokens in, is in `windows` (two slots' scripts may run
    # either side of a turn of the minute).
    window = min(windows)[1]
    return Admitted(
        forced or 0,
        window,
        tuple(remaining),
        tuple(past_soft),
        tuple(minutes),
        tuple(unseeded) if any(unseeded) else (),
    )

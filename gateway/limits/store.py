"""What the limiter asks of its store, and the answers (Redis is the one store today).

Contract:
- `admit` checks every rate limit and budget of one request and, only if all pass,
  counts the request in its rate windows and holds its worst-case cost on each budget,
  all atomically: concurrent admissions (any worker, any replica) see each other.
  Holds older than `hold_ms` are released by later admissions on the same budget. A
  budget's counters take one seed per period, as the larger of it and what they hold,
  and an admission tells which budgets' counters have none yet (`Admitted.unseeded`).
- `settle_many` settles each charge once (idempotent on the request id): releases the
  request's holds, adds its real cost to each budget and corrects its token count.
- `spent` reads what each budget has settled in its period (a scrape's gauge).
- `probe` returns if the store can take writes now, else raises (during an outage it
  runs off the request path and tells when to admit through the store again).
- Connection failures raise `LimitsStoreUnavailable`, never a foreign exception, and
  come within a bounded wait (a hung store is a failure, not a stall).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.limits.rules import BudgetRule, Period, RateRule

RateKindType = Literal["requests", "tokens"]


class LimitsStoreUnavailable(Exception):
    """The store cannot be reached; nothing was checked or changed."""


class LimitsLayoutError(Exception):
    """Budgets of this period are still in the one-slot layout a cluster no longer reads."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One request's admission question."""

    request_id: str
    rates: tuple[RateRule, ...]
    budgets: tuple[BudgetRule, ...]
    periods: tuple[Period, ...]  # the period of each budget, at admission
    options: tuple[int, ...]  # worst-case cost (nanos) per plan: 0 as planned, i downgraded
    downgrades: tuple[int, ...]  # per budget: the option used past its soft limit, 0 none
    tokens: int  # prompt + max output tokens, counted against tokens per minute
    hold_ms: int
    # Per budget: the ledger's spend in its period so far, which the budget's counters
    # take if they hold no seed yet (-1, or none given: none offered). See
    # `gateway.limits.ledger_spend`.
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Admitted:
    option: int  # the plan chosen: 0 as planned, else a downgrade
    window: int  # the rate-limit minute the request was counted in
    remaining: tuple[tuple[int | None, int | None], ...]  # per rate rule: requests, tokens
    past_soft: tuple[bool, ...]  # per budget
    # Per rate rule, the minute its slot counted the request in (a cluster's slots may
    # straddle a turn of the minute); empty: `window` for every rule.
    windows: tuple[int, ...] = ()
    # Per budget: its counters hold no seed (created without one: none offered, or
    # lost and created again); empty: every budget's do.
    unseeded: tuple[bool, ...] = ()


@dataclass(frozen=True, slots=True)
class RateRefusal:
    rule: int  # index into `Ask.rates`
    kind: RateKindType
    previous: int  # the previous minute's count
    current: int  # this minute's count
    elapsed_ms: int  # into this minute


@dataclass(frozen=True, slots=True)
class BudgetRefusal:
    rule: int  # index into `Ask.budgets`
    used_nanos: int  # spent + reserved before this request
    cost_nanos: int  # this request's worst case
    option: int
    spent_nanos: int | None = None  # of `used_nanos`, what was settled (None: not told)
    limit_nanos: int | None = None

    @property
    def busy(self) -> bool:
        """Full only of what requests in flight hold: what is settled leaves room."""
        if self.spent_nanos is None or self.limit_nanos is None:
            return False
        return self.spent_nanos + self.cost_nanos <= self.limit_nanos


Verdict = Admitted | RateRefusal | BudgetRefusal


@dataclass(frozen=True, slots=True)
class Charge:
    """One request's settlement: its real cost replaces its holds."""

    request_id: str
    rates: tuple[RateRule, ...]
    budgets: tuple[BudgetRule, ...]
    periods: tuple[Period, ...]
    window: int  # the minute its tokens were counted in; -1 when they were not
    token_delta: int  # real tokens minus the tokens counted at admission
    cost_nanos: int
    windows: tuple[int, ...] = ()  # per rate rule, as `Admitted.windows`


@dataclass(frozen=True, slots=True)
class Balance:
    """A budget's state right after a settlement."""

    spent_nanos: int
    reserved_nanos: int


# Per budget of a charge, its state after the settlement; None for a budget whose slot
# had settled the charge before (a cluster settles each slot by its own marker).
Balances = tuple[Balance | None, ...]


class LimitStore(Protocol):
    async def admit(self, ask: Ask) -> Verdict: ...

    async def probe(self) -> None: ...

    async def settle_many(self, charges: Sequence[Charge]) -> list[Balances | None]:
        """Per charge: the balance of each of its budgets, or None if it was settled
        before."""
        ...

    async def spent(self, budgets: Sequence[tuple[BudgetRule, Period]]) -> list[int]:
        """Nano-USD settled on each budget in its period so far (0 before any)."""
        ...

    async def close(self) -> None: ...

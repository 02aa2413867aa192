"""Summing metrics into `AggregateRow`s, shared by the ledger stores.

A store feeds `Rollup.add` with (group values, metric totals) pairs in whatever order
it reads them; `rows()` returns one row per group, sorted by the group values so that
every store answers the same query with the same list. Groups with no records produce
no rows, so an empty ledger aggregates to `[]` even with an empty `group_by`.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.ledger.record import (
    CLASS_FIELDS,
    DIMENSIONS,
    UNANSWERED,
    AggregateRow,
    SpendRecord,
)

# The order of AggregateRow's counters; Redis field names use these words.
METRICS: tuple[str, ...] = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cost_nanos",
    "reference_cost_nanos",
    "sla_met",
    "sla_missed",
    "calls",
    "unreferenced",
    "unreferenced_cost_nanos",
    *CLASS_FIELDS,  # token classes (parts of prompt and completion tokens), cache savings
)
GROUPABLE: tuple[str, ...] = ("day", *DIMENSIONS)


def check_group_by(group_by: Sequence[str]) -> tuple[str, ...]:
    """Validate `group_by` and drop repeats, keeping the caller's order."""
    names = tuple(dict.fromkeys(group_by))
    for name in names:
        if name not in GROUPABLE:
            raise ValueError(f"cannot group by {name!r}; choose from {', '.join(GROUPABLE)}")
    return names


def metrics_of(rec: SpendRecord) -> tuple[int, ...]:
    """The counters one record adds, in `METRICS` order. `requests` counts client
    requests: only a request's first answer (its record id is the request id) counts
    one; its escalations, hedges and second opinions add cost, not requests. `calls`
    counts the upstream calls priced: every record but that of a request that got no
    answer (an `error` or `cancelled` record), so a deployment that only answers
    escalations shows how often it was called. `unreferenced` counts records with no
    reference model (their cost is left out of the savings)."""
    # A request its client cancelled is neither a call nor an error: not one to compare.
    unreferenced = not rec.has_reference and rec.status != "cancelled"
    return (
        int(rec.is_request),
        int(rec.status == "error"),
        rec.prompt_tokens,
        rec.completion_tokens,
        rec.cost_nanos,
        rec.reference_cost_nanos,
        int(rec.sla_met is True),
        int(rec.sla_met is False),
        int(rec.status not in UNANSWERED),
        int(unreferenced),
        rec.cost_nanos if unreferenced else 0,
        rec.cache_read_tokens,
        rec.cache_write_tokens,
        rec.audio_prompt_tokens,
        rec.image_prompt_tokens,
        rec.reasoning_tokens,
        rec.audio_completion_tokens,
        rec.image_completion_tokens,
        rec.cache_savings_nanos,
    )


class Rollup:
    """Totals per group for one `aggregate` query.

    >>> rollup = Rollup(("team",))
    >>> rollup.add(("research",), (1, 0, 10, 5, 300, 900, 1, 0, 1, 0, 0))
    """

    def __init__(self, group_by: tuple[str, ...]) -> None:
        self.group_by = group_by
        self._totals: dict[tuple[str, ...], list[int]] = {}

    def add(self, group: tuple[str, ...], amounts: Sequence[int]) -> None:
        totals = self._totals.setdefault(group, [0] * len(METRICS))
        for i, amount in enumerate(amounts):
            totals[i] += amount

    def add_metric(self, group: tuple[str, ...], metric: int, amount: int) -> None:
        self._totals.setdefault(group, [0] * len(METRICS))[metric] += amount

    def rows(self) -> list[AggregateRow]:
        return [
            AggregateRow(dict(zip(self.group_by, group, strict=True)), *totals)
            for group, totals in sorted(self._totals.items())
        ]

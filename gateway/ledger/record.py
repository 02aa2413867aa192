"""What the ledger stores: one priced attempt at an upstream call.

Money is kept as integer nano-dollars (1e-9 USD) so that sums in Redis
(HINCRBY) and in memory are exact; `usd()` converts for display.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

# Dimensions an aggregate can be grouped by (besides `day`).
DIMENSIONS: tuple[str, ...] = ("team", "key", "route", "tier", "deployment", "model")
DimensionType = Literal["day", "team", "key", "route", "tier", "deployment", "model"]
# `error`: a request that got no answer; `cancelled`: one whose client went away before
# its answer (not the gateway's failure: `errors` does not count it, `requests` does).
StatusType = Literal["ok", "error", "partial", "cancelled"]
UNANSWERED: frozenset[str] = frozenset(("error", "cancelled"))
UsageSourceType = Literal["upstream", "counted", "none"]
ReferenceCoverageType = Literal["full", "partial", "none"]
# The API the client called: an endpoint of the OpenAI-compatible surface, or a bridged
# one (`gateway.http.bridges`), whatever wire format the upstream spoke.
SurfaceType = Literal["chat", "completions", "embeddings", "responses", "messages"]

NANOS_PER_USD = 1_000_000_000


@functools.lru_cache(maxsize=64)
def utc_day(epoch_day: int) -> str:
    """`YYYY-MM-DD` of a day counted from 1970-01-01 (formatting dates is not free)."""
    return datetime.fromtimestamp(epoch_day * 86400, UTC).strftime("%Y-%m-%d")


def to_nanos(usd: float) -> int:
    return round(usd * NANOS_PER_USD)


def usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD


@dataclass(frozen=True, slots=True)
class SpendRecord:
    """One priced upstream attempt. `record_id` is the idempotency key:
    `<request_id>` for the request's first answer (the one that counts the request and
    carries its reference cost), `<request_id>:<n>` / `:h<n>` / `:o<n>` for later
    answers, losing hedges and second opinions."""

    record_id: str
    request_id: str
    ts: float  # unix seconds, when the attempt finished
    team: str
    key: str  # the key's id, never the secret
    route: str
    tier: str
    deployment: str
    model: str  # the upstream model name
    prompt_tokens: int
    completion_tokens: int
    cost_nanos: int
    # What the request is compared with; None on a route without a `reference_model`
    # (or a deployment asked for by name): no counterfactual, so no reference cost.
    reference_model: str | None
    reference_cost_nanos: int
    status: StatusType = "ok"
    usage_source: UsageSourceType = "upstream"
    stream: bool = False
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    escalations: int = 0
    score: float | None = None  # the router's complexity score, on scored routes
    # Whether the answer met its route's latency SLA (`Route.sla`: TTFT for streams, the
    # whole answer within `timeout_ms`); None when the route has no SLA. Records written
    # before this field existed read back as None.
    sla_met: bool | None = None
    # On a cascade, the verifier's score of this attempt's answer (None when it was not
    # judged: the last tier, a cancelled request, other strategies): the live sample
    # `router calibrate-verify --from-ledger` picks a verify_threshold from.
    verifier_score: float | None = None
    # `select` routes: the quality predicted for this deployment, and the route's
    # target (quality_target x the reference's predicted quality) it was chosen against.
    predicted_quality: float | None = None
    quality_target: float | None = None
    # Token classes priced apart (`gateway.billing.usage`): parts of prompt_tokens (cache reads
    # and writes, audio, image) and of completion_tokens (reasoning, audio, image), never
    # on top of them. Records written before these fields existed read back as 0.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    audio_prompt_tokens: int = 0
    image_prompt_tokens: int = 0
    reasoning_tokens: int = 0
    audio_completion_tokens: int = 0
    image_completion_tokens: int = 0
    # What the prompt cache saved on this attempt: its cache reads and writes priced as
    # plain input, less what they cost (negative when writes cost more than reads saved).
    cache_savings_nanos: int = 0
    # The API the client called. Records written before this field existed read back
    # as "chat", the only API there was.
    surface: SurfaceType = "chat"

    @property
    def day(self) -> str:
        return utc_day(int(self.ts // 86400))

    @property
    def is_request(self) -> bool:
        """The request's own record (its id is the request id): its first answer, or the
        error record of one that got none. It alone counts the request; escalations,
        hedges, second opinions and cut-offs add cost only."""
        return self.record_id == self.request_id

    @property
    def is_first_answer(self) -> bool:
        """The request's first answer: its own record, or one a cascade refused to
        deliver as broken (`<request id>:r0`, the request's record being its error)."""
        return self.record_id == self.request_id or self.record_id == f"{self.request_id}:r0"

    @property
    def has_reference(self) -> bool:
        return bool(self.reference_model)

    def dimension(self, name: str) -> str:
        return self.day if name == "day" else str(getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> bytes:
        """The record as stored (Redis, the spool): JSON without the zero token-class
        fields, which most records have and `from_dict` reads back as 0."""
        data = dict(zip(_FIELD_NAMES, _field_values(self), strict=True))
        for name in SPARSE_FIELDS:
            if not data[name]:
                del data[name]
        return orjson.dumps(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpendRecord:
        """Inverse of `to_dict`; also accepts the all-strings form a Redis Stream returns."""
        kwargs: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if field.name not in data:
                continue
            kwargs[field.name] = _coerce(field.name, data[field.name])
        return cls(**kwargs)


# Token classes and cache savings: summed by the aggregates, and left out of the stored
# JSON when zero.
CLASS_FIELDS: tuple[str, ...] = (
    "cache_read_tokens",
    "cache_write_tokens",
    "audio_prompt_tokens",
    "image_prompt_tokens",
    "reasoning_tokens",
    "audio_completion_tokens",
    "image_completion_tokens",
    "cache_savings_nanos",
)
SPARSE_FIELDS = frozenset(CLASS_FIELDS)
_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(SpendRecord))
_field_values = operator.attrgetter(*_FIELD_NAMES)  # one C call for all the values
_INTS = {
    "prompt_tokens",
    "completion_tokens",
    "cost_nanos",
    "reference_cost_nanos",
    "escalations",
    *SPARSE_FIELDS,
}
_FLOATS = {"ts", "latency_ms"}


def _coerce(name: str, value: Any) -> Any:
    if name in _INTS:
        return int(value)
    if name in _FLOATS:
        return float(value)
    if name == "reference_model":
        return None if value in (None, "", "None") else value
    if name in ("ttft_ms", "score", "verifier_score", "predicted_quality", "quality_target"):
        return None if value in (None, "", "None") else float(value)
    if name == "stream":
        return truthy(value)
    if name == "sla_met":
        return None if value in (None, "", "None") else truthy(value)
    return value


def truthy(value: Any) -> bool:
    """A flag as the stored forms write it (JSON `true`, the stream's "1"/"true")."""
    return value in (True, "1", "true", "True", 1)


@dataclass(frozen=True, slots=True)
class AggregateRow:
    """Totals for one group (e.g. {"team": "research", "day": "2026-11-30"})."""

    group: dict[str, str]
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    cost_nanos: int
    reference_cost_nanos: int
    sla_met: int = 0  # records on routes with an SLA that met it
    sla_missed: int = 0  # ... and that missed it
    calls: int = 0  # upstream calls priced (escalations, hedges, second opinions too)
    # Records with no reference model, and their cost: left out of the savings. Days
    # written before these counters existed read 0 here, as if all had a reference.
    unreferenced: int = 0
    unreferenced_cost_nanos: int = 0
    # Token classes and what the prompt cache saved (`SpendRecord`'s fields of the same
    # names); days written before they existed read 0.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    audio_prompt_tokens: int = 0
    image_prompt_tokens: int = 0
    reasoning_tokens: int = 0
    audio_completion_tokens: int = 0
    image_completion_tokens: int = 0
    cache_savings_nanos: int = 0

    @property
    def has_records(self) -> bool:
        """Whether any record went into the row (the total of no rows has none). Every
        record counts a call or an error; days written before `calls` existed show
        theirs as requests or cost."""
        return bool(
            self.calls
            or self.errors
            or self.requests
            or self.cost_nanos
            or self.reference_cost_nanos
            or self.unreferenced
        )

    @property
    def coverage(self) -> ReferenceCoverageType:
        """How much of the row has a reference to be compared with: "none" when no
        record of it had one, which a row with no records at all has neither. Every
        record is an error or a call, so `calls + errors` counts the row's records, but
        a request its client cancelled, which is neither and compares nothing (it is
        not counted in `unreferenced` either)."""
        # Cancelled requests alone (no call, no error, nothing priced); rows written
        # before `calls` was counted have calls 0, but cost, and compare as they did.
        priced = self.calls + self.errors or self.cost_nanos or self.reference_cost_nanos
        if not self.has_records or not priced:
            return "none"
        if not self.unreferenced:
            return "full"
        return "none" if self.unreferenced >= self.calls + self.errors else "partial"

    @property
    def savings_nanos(self) -> int | None:
        """Reference cost less what the requests that have a reference cost; None when
        no record of the row had a reference model (nothing to compare with)."""
        if self.coverage == "none":
            return None
        return self.reference_cost_nanos - (self.cost_nanos - self.unreferenced_cost_nanos)

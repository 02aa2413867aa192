"""The gateway's recent traffic, read back from the ledger as the router's calibration
sample, not a hand-made file: `cascade-gateway router calibrate --from-ledger ROUTE`
picks a route's tier thresholds from the complexity scores its requests got
(`SpendRecord.score`, in the classifier the route uses), `router calibrate-verify
--from-ledger ROUTE` its verify_threshold from the verifier's scores of its cascades'
first answers (`SpendRecord.verifier_score`).

A request's first record (`record_id == request_id`) is its first attempt, so the sample
is one score per request.
"""

from __future__ import annotations

from gateway.ledger import (
    LedgerLayoutError,
    LedgerStore,
    LedgerUnavailable,
    RedisStore,
    read_ledger,
)
from gateway.settings import Settings
from router.cli import ScoreField
from router.errors import RoutingError

_SAMPLE_OF: dict[str, tuple[str, str]] = {
    "score": (
        "scored requests",
        "only classifier routes, and cascades routing streams by tiers, score requests",
    ),
    "verifier_score": ("verified cascade answers", "only cascade routes verify answers"),
}


async def recent_scores(
    store: LedgerStore, route: str, last: int, field: ScoreField = "score"
) -> list[float]:
    """`field` of `route`'s requests' first answers among the ledger's latest `last`
    records (all routes), oldest first; records without it are left out."""
    found = []
    for record in await store.events(last):
        value = getattr(record, field)
        if record.route == route and record.is_first_answer and value is not None:
            found.append(float(value))
    return found


def ledger_scores(route: str, last: int, field: ScoreField = "score") -> list[float]:
    """`recent_scores` from the Redis ledger the settings name (REDIS_URL, the prefix)."""
    settings = Settings()
    if not settings.redis_url:
        raise RoutingError("set REDIS_URL: --from-ledger reads the Redis ledger")

    async def read(store: RedisStore) -> list[float]:
        return await recent_scores(store, route, last, field)

    try:
        scores = read_ledger(settings, read)
    except LedgerUnavailable as exc:
        raise RoutingError(f"the ledger is unreachable: {exc}") from exc
    except LedgerLayoutError as exc:
        raise RoutingError(str(exc)) from exc
    except ValueError as exc:  # redis-py's word for a URL it cannot parse
        raise RoutingError(f"REDIS_URL is not a Redis URL: {exc}") from exc
    if not scores:
        what, why = _SAMPLE_OF[field]
        raise RoutingError(
            f"no {what} of route '{route}' among the ledger's last {last} records ({why})"
        )
    return scores

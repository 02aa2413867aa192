"""The gateway's recent traffic, read back from the ledger as the router's calibration
sample: `cascade-gateway router calibrate --from-ledger ROUTE` picks a route's tier
thresholds from the scores its own requests got, not from a hand-made prompt file.

Every scored request's first record (`record_id == request_id`) carries the complexity
score its route's classifier gave it (`SpendRecord.score`), so the sample is one score
per request, in the classifier the route uses.
"""

from __future__ import annotations

import asyncio

from gateway.ledger import LedgerStore, LedgerUnavailable, RedisStore
from gateway.settings import Settings
from router.errors import RoutingError


async def recent_scores(store: LedgerStore, route: str, last: int) -> list[float]:
    """The scores of `route`'s requests among the ledger's latest `last` records (all
    routes), oldest first."""
    return [
        record.score
        for record in await store.events(last)
        if record.route == route
        and record.record_id == record.request_id
        and record.score is not None
    ]


def ledger_scores(route: str, last: int) -> list[float]:
    """`recent_scores` from the Redis ledger the settings name (REDIS_URL, the prefix)."""
    settings = Settings()
    if not settings.redis_url:
        raise RoutingError("set REDIS_URL: --from-ledger reads the Redis ledger")

    async def read() -> list[float]:
        store = RedisStore(settings.redis_url or "", prefix=settings.redis_prefix)
        try:
            return await recent_scores(store, route, last)
        finally:
            await store.close()

    try:
        scores = asyncio.run(read())
    except LedgerUnavailable as exc:
        raise RoutingError(f"the ledger is unreachable: {exc}") from exc
    if not scores:
        raise RoutingError(
            f"no scored requests of route '{route}' among the ledger's last {last} records "
            "(only classifier routes, and cascades routing streams by tiers, score requests)"
        )
    return scores

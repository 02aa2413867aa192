"""Moving budgets and rate limits from the one `{limits}` slot (a single Redis's
layout) to their own slots on a Redis Cluster (`redis_store.spread_tag`), so a cluster
deployment keeps its period's spend: `cascade-gateway spend reshard` does it, gateways
stopped, when CASCADE_REDIS_CLUSTER is set.

Each key is copied whole (DUMP, then RESTORE with its time to live) under its new name,
then deleted: a move cut short is finished by running it again. Settlement markers are
left to expire (a stopped gateway has no settlement in flight); the probe key stays.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.limits.redis_store import spread_tag

SCAN_COUNT = 1000
# `budget:<scope>:<name>:<period>[:held]` or `rate:<scope>:<name>`; a name may hold ':'.
BUDGET = re.compile(r"budget:(key|team|route):(.+):(\d{4}-\d{2}(?:-\d{2})?)(:held)?")
RATE = re.compile(r"rate:(key|team):(.+)")


async def spread_limits(client: Any, prefix: str) -> int:
    """Move every budget and rate key under `prefix`; returns how many moved."""
    old = f"{prefix}{{limits}}:"
    moved = 0
    for kind in ("budget", "rate"):
        pattern = old.replace("{", "\\{").replace("}", "\\}") + kind + ":*"
        async for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
            name = key.decode() if isinstance(key, bytes) else key
            suffix = name[len(old) :]
            match = BUDGET.fullmatch(suffix) or RATE.fullmatch(suffix)
            if match is None:  # not a key this layout writes: left where it is
                continue
            dumped, ttl_ms = await client.dump(name), await client.pttl(name)
            if dumped is None or ttl_ms == -2:  # expired meanwhile
                continue
            target = spread_tag(prefix, match.group(1), match.group(2)) + suffix
            await client.restore(target, max(ttl_ms, 0), dumped, replace=True)
            await client.delete(name)
            moved += 1
    return moved

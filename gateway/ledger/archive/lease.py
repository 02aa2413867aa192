"""The lease that makes one exporter at a time the owner of a stream's consumer group.

A Redis string holding the owner's token, with a time to live: `claim` takes it when it
is free (SET NX PX) and renews it when the caller already owns it, in one script, and
says which (`Claim`); `release` deletes it only for its owner. An exporter that stops
renewing (killed, partitioned, paused) loses it after `ttl_s`, and a waiting exporter
takes over. A claim that finds the lease free while the caller thought it held it
(`TAKEN`, not `RENEWED`) means it lapsed: another may have held it meanwhile and
claimed the caller's entries, so the caller must drop what it has in hand and take
over afresh.

`valid` is the owner's own conservative view: the lease is good until `ttl_s` after the
moment the last successful claim was *sent*, by this process's monotonic clock, so no
Redis round trip is needed to check it before each file is committed.
"""

from __future__ import annotations

import enum
import time

from gateway.redis_client import RedisClient


class Claim(enum.IntEnum):
    """What `Lease.claim` found; false only when another holds the lease."""

    HELD_BY_ANOTHER = 0
    RENEWED = 1  # the caller held it all along
    TAKEN = 2  # it was free: taken afresh


# KEYS: 1 lease. ARGV: 1 token, 2 ttl ms. Returns a `Claim`.
_CLAIM_LUA = """
local owner = redis.call('GET', KEYS[1])
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Lease:
    """>>> lease = Lease(client, "cg:{ledger}:events:archive:lease", "host:123:ab12", 30)
    >>> if await lease.claim(): ...  # export, calling claim() again within ttl_s
    >>> if await lease.claim() is Claim.TAKEN: ...  # (re)gained: take over afresh"""

    def __init__(self, client: RedisClient, key: str, token: str, ttl_s: float) -> None:
        self.key = key
        self.token = token
        self.ttl_s = ttl_s
        self._claim = client.register_script(_CLAIM_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._client = client
        self._valid_until = 0.0
        self._claimed_at = -float("inf")
        self._ttl_ms = int(ttl_s * 1000)

    async def claim(self) -> Claim:
        """Take or renew the lease; true while this token holds it."""
        sent = time.monotonic()
        found = Claim(int(await self._claim(keys=[self.key], args=[self.token, self._ttl_ms])))
        self._valid_until = sent + self.ttl_s if found else 0.0
        if found:
            self._claimed_at = sent
        return found

    def valid(self, margin_s: float = 0.0) -> bool:
        """Whether the lease is still ours for at least `margin_s` more, as far as this
        process can tell without asking Redis."""
        return time.monotonic() + margin_s < self._valid_until

    def due(self) -> bool:
        """Time to renew: a third of the ttl has passed since the last claim."""
        return time.monotonic() - self._claimed_at > self.ttl_s / 3

    async def release(self) -> None:
        self._valid_until = 0.0
        await self._release(keys=[self.key], args=[self.token])

    async def owner(self) -> str | None:
        found = await self._client.get(self.key)
        return None if found is None else str(found)

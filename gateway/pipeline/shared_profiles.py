"""What `select` routes learned from traffic, shared through Redis by every worker and
replica, so that each learns from all of their answers and a restart keeps what was
learned. The local kind, `selector.TrafficProfiles`, is what runs without Redis.

    P{select}:profile:<deployment>   hash  `offset` (what live verdicts moved its
                                           predicted quality by), `observations`,
                                           `profile` (the quality_profile they were
                                           learned against); expires PROFILE_TTL_S
                                           after the last write

An observation moves the worker's copy at once (the local rule, `selector.stepped`) and
runs `OBSERVE_LUA`, the same rule on the shared offset, whose result the worker then
adopts: observations from any number of workers compose as if one worker had made them
all, in Redis's order. Every `SYNC_S` each worker adopts the shared profiles of the
select routes' deployments (one round trip: the `{select}` tag keeps every key in one
slot of a Redis Cluster). While Redis is down each worker learns on its own, as the
local kind does; when it is back, the shared offsets take over again. A key Redis lost
(a restart without persistence) is seeded by the next observation with what Redis last
showed its worker; one that expired (no verdict for `PROFILE_TTL_S`) starts again from
the predictor. An observation against another `profile` than the stored one (a reload
changed the deployment's `quality_profile`) starts the learning again from 0, as the
local rule does; until then the workers set the stored offset aside. A hash without
`profile` (written before it was kept) counts as learned against the current one. To
reset a deployment's learning, write a zero profile (`HSET <key> offset 0 observations
0`): every worker adopts it at its next poll.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from gateway.pipeline.selector import (
    LEARNING_RATE,
    MAX_SHIFT,
    Profile,
    TrafficProfiles,
    select_deployments,
)
from gateway.redis_client import RedisClient, redis_client
from gateway.runtime import Runtime
from gateway.tasks import stop_tasks

log = logging.getLogger(__name__)

PROFILE_TTL_S = 30 * 86400  # a deployment nobody used for a month starts afresh
SYNC_S = 0.5  # how often workers adopt each other's learning, as the breakers' poll

# ARGV: predicted, observed, learning rate, max shift, seed offset, seed observations,
# TTL (s), quality profile ('': any). The offset goes back as text: Redis truncates a
# Lua number to an integer. Learned against another profile, the offset starts over.
OBSERVE_LUA = """
local stored = redis.call('HMGET', KEYS[1], 'offset', 'observations', 'profile')
local offset = tonumber(stored[1] or ARGV[5])
local seen = tonumber(stored[2] or ARGV[6])
local profile = stored[3]
if ARGV[8] ~= '' then
  if profile and profile ~= ARGV[8] then
    offset, seen = 0, 0
  end
  profile = ARGV[8]
  redis.call('HSET', KEYS[1], 'profile', profile)
end
seen = seen + 1
local moved = offset + tonumber(ARGV[3]) * (tonumber(ARGV[2]) - tonumber(ARGV[1]) - offset)
local bound = tonumber(ARGV[4])
local text = string.format('%.17g', math.min(bound, math.max(-bound, moved)))
redis.call('HSET', KEYS[1], 'offset', text, 'observations', seen)
redis.call('EXPIRE', KEYS[1], ARGV[7])
return {text, seen, profile or ''}
"""
FIELDS = ["offset", "observations", "profile"]


def profile_key(prefix: str, deployment: str) -> str:
    """The Redis hash of what select routes learned of `deployment`."""
    return f"{prefix}{{select}}:profile:{deployment}"


def shared(offset: bytes | str, seen: bytes | str | int, profile: bytes | str | None) -> Profile:
    """A profile as Redis holds it (bytes replies; no or an empty `profile`: any)."""
    name = profile.decode() if isinstance(profile, bytes) else profile
    return Profile(float(offset), int(seen), name or None)


class SharedTrafficProfiles(TrafficProfiles):
    """`TrafficProfiles` shared through Redis (see the module docstring). Redis errors
    are logged, never raised: learning must not fail a request.

    >>> traffic = SharedTrafficProfiles.connect("redis://localhost:6379/0", "cg:")
    >>> traffic.start(lambda: services.runtime)  # in the lifespan; `await traffic.stop()`
    """

    def __init__(
        self,
        client: RedisClient,
        prefix: str = "cg:",
        on_change: Callable[[str, float], None] | None = None,
    ) -> None:
        super().__init__(on_change)
        self._client = client
        self._prefix = prefix
        self._script = client.register_script(OBSERVE_LUA)
        self._pending: set[asyncio.Task[None]] = set()
        self._poll: asyncio.Task[None] | None = None
        self._failing = False  # an outage is warned of once, not on every answer
        self._confirmed: dict[str, Profile] = {}  # what Redis last showed of each
        # When this worker last saw the profile gain a verdict (its own or, through a
        # poll or a reply, anyone's): a key missing a TTL after that expired.
        self._observed_at: dict[str, float] = {}
        self.clock: Callable[[], float] = time.monotonic

    @classmethod
    def connect(
        cls,
        url: str,
        prefix: str,
        *,
        cluster: bool = False,
        on_change: Callable[[str, float], None] | None = None,
    ) -> SharedTrafficProfiles:
        # The breakers' options (gateway.redis_client): a silent Redis must not stall
        # the poll, whose next round is the retry; a failed write is only logged.
        client = redis_client(
            url, socket_timeout=1.0, connect_timeout=1.0, max_connections=32, cluster=cluster
        )
        return cls(client, prefix, on_change)

    def key(self, deployment: str) -> str:
        return profile_key(self._prefix, deployment)

    def observe(
        self,
        deployment: str,
        predicted: float,
        observed: float,
        quality_profile: str | None = None,
    ) -> None:
        self._observed_at[deployment] = self.clock()
        super().observe(deployment, predicted, observed, quality_profile)  # till Redis answers
        # The seed, should Redis have lost the key: what it last showed, not this copy,
        # which counts observations in flight that may have reached it already.
        seed = self._confirmed.get(deployment, Profile())
        if not seed.learned_under(quality_profile):
            seed = Profile()
        publish = self._publish(deployment, predicted, observed, seed, quality_profile)
        task = asyncio.ensure_future(publish)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _publish(
        self,
        deployment: str,
        predicted: float,
        observed: float,
        seed: Profile,
        quality_profile: str | None,
    ) -> None:
        args: list[float | str] = [predicted, observed, LEARNING_RATE, MAX_SHIFT]
        args += [seed.offset, seed.observations, PROFILE_TTL_S, quality_profile or ""]
        try:
            offset, seen, profile = await self._script(keys=[self.key(deployment)], args=args)
        except (RedisError, OSError) as exc:
            self._failed(f"could not share an observation of '{deployment}': {exc}")
            return
        self._failing = False
        self._adopt_shared(deployment, shared(offset, seen, profile))

    def _adopt_shared(self, deployment: str, profile: Profile, polled: bool = False) -> None:
        # Replies to observations in flight together may come back in any order, and a
        # poll may read what a reply already showed: the shared count only grows, but
        # for a new profile's learning. A poll with none of ours in flight is the truth,
        # lower or not (Redis lost the key and another worker seeded it afresh): else
        # this one would stop listening.
        confirmed = self._confirmed.get(deployment)
        settled = polled and not self._pending
        if (
            settled
            or confirmed is None
            or profile.observations >= confirmed.observations
            or profile.quality_profile != confirmed.quality_profile
        ):
            if confirmed is None or profile.observations > confirmed.observations:
                self._observed_at[deployment] = self.clock()  # someone's verdict: alive
            self._confirmed[deployment] = profile
            self.adopt(deployment, profile)

    def _failed(self, message: str) -> None:
        if self._failing:
            log.debug("%s", message)
        else:
            log.warning("%s; learning locally until Redis answers", message)
        self._failing = True

    async def sync(self, deployments: Sequence[str]) -> None:
        """Adopt the shared profiles of `deployments` (one round trip)."""
        if not deployments:
            return
        pipe = self._client.pipeline(transaction=False)
        for deployment in deployments:
            pipe.hmget(self.key(deployment), FIELDS)
        replies = await pipe.execute()
        for deployment, (offset, seen, profile) in zip(deployments, replies, strict=True):
            if offset is not None and seen is not None:
                self._adopt_shared(deployment, shared(offset, seen, profile), polled=True)
            else:  # nothing learned yet, lost, or expired
                self._forget_if_expired(deployment)

    def _forget_if_expired(self, deployment: str) -> None:
        """No key: expired (no verdict of it, this worker's or another's it saw, for
        `PROFILE_TTL_S`) starts again from the predictor; a key lost sooner (a Redis
        restarted without persistence) keeps this copy, to seed it again."""
        if deployment not in self._confirmed or self._pending:
            return
        if self.clock() - self._observed_at.get(deployment, -math.inf) < PROFILE_TTL_S:
            return
        del self._confirmed[deployment]
        self._observed_at.pop(deployment, None)
        self.adopt(deployment, Profile())

    async def run_sync(self, deployments: Callable[[], Sequence[str]], interval_s: float) -> None:
        """Poll the shared profiles until cancelled; Redis errors are logged, not fatal."""
        while True:
            try:
                await self.sync(deployments())
            except (RedisError, OSError, ValueError) as exc:
                log.debug("select profile sync failed: %s", exc)
            except Exception:  # the poll must outlive a bug; learning goes on locally
                log.exception("select profile sync failed")
            await asyncio.sleep(interval_s)

    def start(self, runtime: Callable[[], Runtime]) -> None:
        """Poll for the deployments of the serving `runtime`'s select routes."""

        def deployments() -> list[str]:  # the policy's of the moment: reloads change them
            return select_deployments(runtime())

        self._poll = asyncio.create_task(self.run_sync(deployments, SYNC_S))

    async def stop(self) -> None:
        """Stop polling, let the observations in flight land, close the client."""
        await stop_tasks(self._poll)
        self._poll = None
        await self.flush()
        await self._client.aclose()

    async def flush(self) -> None:
        """Wait for the observations in flight to land (or fail, logged)."""
        await asyncio.gather(*self._pending, return_exceptions=True)


async def read_learning(
    url: str, prefix: str, deployments: Sequence[str], *, cluster: bool = False
) -> TrafficProfiles:
    """What the fleet has learned of `deployments`, read once (`policy explain`): a
    snapshot, whose client is closed. Raises what Redis raised."""
    traffic = SharedTrafficProfiles.connect(url, prefix, cluster=cluster)
    try:
        await traffic.sync(deployments)
    finally:
        await traffic.stop()
    return traffic

"""Limits on Redis (standalone or Cluster): one script call to admit, one to settle
(one per slot on a cluster).

Keys (`P` is the prefix, default `cg:`; `T` the hash tag: `{limits}` on a standalone
Redis, where one script may touch them all; on a Redis Cluster the rule's own
`{limits:<scope>:<name>}`, so different teams, keys and routes spread over the masters
(`gateway.limits.slots`)):

    PT:budget:<scope>:<name>:<period>       hash  `spent`, `reserved` (nano-USD),
                                                         `seeded` once the ledger's spend
                                                         is in, and `h:<request_id>` ->
                                                         its held worst case;
                                                         <period> is YYYY-MM-DD or
                                                         YYYY-MM (UTC); expires a week
                                                         after the period ends
    PT:budget:<scope>:<name>:<period>:held  zset  request ids holding a reservation,
                                                         score = expiry (ms, Redis clock)
    PT:rate:<scope>:<name>                  hash  `w` minute, `r`/`t` requests and
                                                         tokens in it, `pr`/`pt` in the one
                                                         before; expires after 2 idle minutes
    PT:settled:<request_id>                 string  the exactly-once marker of a
                                                         settlement (1 day; on a cluster,
                                                         one per slot the request touched)
    PT:probe                                string  written by outage probes (60 s)

<scope> is `key`, `team` or `route` (`key` or `team` for rates).

On a Redis Cluster (`cluster=True`) an admission whose rules live in several slots runs
one script per slot, together, and releases the others' reservations if one refuses;
a settlement runs one script per slot, each exactly once by its own marker. The
probe key keeps the `{limits}` tag.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, TypeVar, cast

from redis import exceptions as redis_errors

from gateway.limits.rules import BudgetRule, Period
from gateway.limits.scripts import ADMIT_LUA, RELEASE_LUA, SETTLE_LUA, USED_LUA
from gateway.limits.slots import SlotGroup, first_downgrade, merged, slot_groups
from gateway.limits.store import (
    Admitted,
    Ask,
    Balance,
    Balances,
    BudgetRefusal,
    Charge,
    LimitsStoreUnavailable,
    RateRefusal,
    Verdict,
)
from gateway.redis_client import redis_client

# Any Redis failure (unreachable, failing over, out of memory, a script error) makes
# limits unavailable: the outage policy answers, never a 500.
_UNAVAILABLE = (redis_errors.RedisError, OSError)
log = logging.getLogger(__name__)

# Error replies that mean "not now" (memory, loading, failover): the batch is resent.
# redis-py strips the codes it knows into exception classes; the others stay in the text.
TRANSIENT_ERRORS: tuple[type[redis_errors.RedisError], ...] = (
    redis_errors.OutOfMemoryError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
    redis_errors.MasterDownError,
    redis_errors.NoScriptError,
    # On a cluster, a node lost mid-pipeline answers its share of the batch with these
    # (a standalone Redis raises them for the whole batch): the settle script is
    # idempotent, so the batch is resent.
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterError,
)
TRANSIENT_REPLIES = ("BUSY", "NOREPLICAS", "CLUSTERDOWN")
KEEP_AFTER_PERIOD_S = 7 * 86400  # budget counters stay readable a week past their period
SETTLED_MARKER_TTL_S = 86400  # long enough for a retry after any outage a queue survives
PROBE_TTL_S = 60
T = TypeVar("T")
TICK_S = 0.1  # how often a call waiting on Redis checks whether Redis is silent


class RedisLimitStore:
    """A `LimitStore` on Redis via `redis.asyncio`, with short timeouts: an admission
    must fail fast when Redis is gone so the gateway can apply its outage policy. It
    gives up after `socket_timeout` of silence (waiting for a connection included), and
    a timeout is never retried (a hung Redis would cost two, and the timed-out script
    may have run). Silence, not elapsed time: while Redis keeps answering other calls
    (a burst queued on the pool, a busy event loop), a call waits on, up to
    `busy_timeout`; declaring an outage then would serve the burst unchecked (or refuse
    it) while Redis is up.

    >>> store = RedisLimitStore("redis://localhost:6379/0"); verdict = await store.admit(ask)
    """

    def __init__(
        self,
        url: str,
        prefix: str = "cg:",
        *,
        max_connections: int = 64,
        socket_timeout: float = 0.5,
        busy_timeout: float = 5.0,
        cluster: bool = False,
    ) -> None:
        # Redis-py's own timeouts are the outer bound; `_patiently` the usual one.
        self._client = redis_client(
            url,
            socket_timeout=busy_timeout,
            connect_timeout=busy_timeout,
            max_connections=max_connections,
            pool_timeout=busy_timeout,
            # A dropped connection (Redis restarted, an idle one closed) is retried once.
            retry_on=(redis_errors.ConnectionError,),
            decode_responses=True,
            cluster=cluster,
        )
        self._timeout_s = socket_timeout
        self._busy_s = busy_timeout
        self._answered_at = -math.inf  # time.monotonic() of Redis's last reply
        self._admit = self._client.register_script(ADMIT_LUA)
        self._settle = self._client.register_script(SETTLE_LUA)
        self._release = self._client.register_script(RELEASE_LUA)
        self._used = self._client.register_script(USED_LUA)
        self._prefix = prefix
        self._base = f"{prefix}{{limits}}:"
        self._spread = cluster

    def tagged(self, scope: str, name: str) -> str:
        """The prefix of a rule's keys, hash tag included."""
        return spread_tag(self._prefix, scope, name) if self._spread else self._base

    def budget_key(self, scope: str, name: str, period: str) -> str:
        return f"{self.tagged(scope, name)}budget:{scope}:{name}:{period}"

    def rate_key(self, scope: str, name: str) -> str:
        return f"{self.tagged(scope, name)}rate:{scope}:{name}"

    async def admit(self, ask: Ask) -> Verdict:
        groups = slot_groups(ask.rates, ask.budgets) if self._spread else []
        if len(groups) <= 1:  # one slot: one script, as on a single Redis
            everything = _everything(len(ask.rates), len(ask.budgets))
            keys, args = self._admit_call(ask, everything, ask.options, ask.downgrades)
            with self._translate():
                reply = await self._patiently(self._admit(keys, args))
            return _verdict(cast(list[int], reply), len(ask.rates), len(ask.budgets))
        return await self._admit_spread(ask, groups)

    def _admit_call(
        self, ask: Ask, group: SlotGroup, options: Sequence[int], downgrades: Sequence[int]
    ) -> tuple[list[str], list[Any]]:
        """`ADMIT_LUA`'s keys and arguments for the group's rules of `ask`."""
        keys = [self.rate_key(ask.rates[i].scope, ask.rates[i].name) for i in group.rates]
        args: list[Any] = [ask.request_id, ask.hold_ms, len(group.rates), len(group.budgets)]
        args += [len(options), ask.tokens, *options]
        for i in group.rates:
            rate = ask.rates[i]
            args += [rate.requests_per_minute or 0, rate.tokens_per_minute or 0]
        for i in group.budgets:
            budget, period = ask.budgets[i], ask.periods[i]
            key = self.budget_key(budget.scope, budget.name, period.id)
            keys += [key, key + ":held"]
            soft = -1 if budget.soft_nanos is None else budget.soft_nanos
            down = downgrades[i] if downgrades else 0
            seed = ask.seeds[i] if ask.seeds else -1
            args += [budget.limit_nanos, soft, down, _expire_at(period.ends_at), seed]
        return keys, args

    async def _admit_spread(self, ask: Ask, groups: list[SlotGroup]) -> Verdict:
        """One script per slot, together; a refusal (or a failure) releases the rest."""
        forced = await self._plan(ask) if any(ask.downgrades) else None
        options = ask.options if forced is None else (ask.options[forced],)
        downgrades = () if forced is not None else ask.downgrades
        calls = [self._admit_call(ask, group, options, downgrades) for group in groups]
        with self._translate():
            replies = await self._patiently(
                asyncio.gather(*(self._admit(k, a) for k, a in calls), return_exceptions=True)
            )
        verdicts: list[Verdict | None] = [
            None if isinstance(r, BaseException) else _verdict(r, len(g.rates), len(g.budgets))
            for g, r in zip(groups, replies, strict=True)
        ]
        failed = next((r for r in replies if isinstance(r, BaseException)), None)
        done = [v for v in verdicts if v is not None]
        verdict = None if failed else merged(groups, done, len(ask.rates), len(ask.budgets), forced)
        if not isinstance(verdict, Admitted):
            # Shielded: a client that goes away must not leave the other slots' holds.
            await asyncio.shield(self._release_admitted(ask, groups, verdicts))
        if isinstance(failed, asyncio.CancelledError):  # a slot's call, not this task
            raise LimitsStoreUnavailable("redis: an admission call was cancelled")
        if failed is not None:
            with self._translate():
                raise failed
        assert verdict is not None
        return verdict

    async def _plan(self, ask: Ask) -> int:
        """The plan every slot admits: read the budgets that may downgrade, first."""
        readable = [i for i, down in enumerate(ask.downgrades) if down > 0]
        keys = [
            self.budget_key(ask.budgets[i].scope, ask.budgets[i].name, ask.periods[i].id)
            for i in readable
        ]
        with self._translate():
            replies = await self._patiently(
                asyncio.gather(*(self._used([key, key + ":held"]) for key in keys))
            )
        used: list[int | None] = [None] * len(ask.budgets)
        for i, reply in zip(readable, replies, strict=True):
            used[i] = int(reply)
        return first_downgrade(ask.budgets, ask.downgrades, used)

    async def _release_admitted(
        self, ask: Ask, groups: Sequence[SlotGroup], verdicts: Sequence[Verdict | None]
    ) -> None:
        """Undo the groups that admitted, together; one that fails to is logged (its
        holds expire after `hold_ms`, its rate counts with the minute)."""
        calls = []
        for group, verdict in zip(groups, verdicts, strict=True):
            if isinstance(verdict, Admitted):
                keys, _ = self._admit_call(ask, group, ask.options, ())
                n_rate, n_budget = len(group.rates), len(group.budgets)
                args: list[Any] = [ask.request_id, n_rate, n_budget, verdict.window, ask.tokens]
                calls.append(self._release(keys, args))
        try:
            results = await self._patiently(asyncio.gather(*calls, return_exceptions=True))
        except (*_UNAVAILABLE, TimeoutError) as exc:
            results = [exc]
        for result in results:
            if isinstance(result, BaseException):
                log.warning("could not release the holds of %s: %s", ask.request_id, result)

    async def unmoved(self, budgets: Sequence[tuple[BudgetRule, Period]]) -> list[str]:
        """On a cluster: which of `budgets` (in their current periods) still have their
        spend in the one `{limits}` slot (a single Redis's layout, or an earlier
        version's), where this store does not look: `spend reshard` moves them. Raises
        `LimitsStoreUnavailable` when Redis does not answer."""
        if not self._spread or not budgets:
            return []
        keys = [f"{self._base}budget:{b.scope}:{b.name}:{p.id}" for b, p in budgets]

        async def each() -> list[int]:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.exists(key)
                found: list[int] = await pipe.execute()
                return found

        with self._translate():
            found = await self._patiently(each())
        return [budget.label for (budget, _), there in zip(budgets, found, strict=True) if there]

    async def probe(self) -> None:
        """Raise `LimitsStoreUnavailable` unless Redis takes a write now, within one
        timeout. A write, not a PING, which a replica or a Redis out of memory answers."""
        with self._translate():
            await self._patiently(self._client.set(self._base + "probe", "1", ex=PROBE_TTL_S))

    async def settle_many(self, charges: Sequence[Charge]) -> list[Balances | None]:
        """Each charge's script calls (one per slot it touches), pipelined in one round
        trip (each stays atomic and counts once, by its own marker).

        A call Redis refuses for good (a script error, not a passing state such as OOM
        or LOADING, which raise `LimitsStoreUnavailable` so the batch is sent again) is
        logged and dropped alone: one bad charge must not hold the queue behind it."""
        calls = [(n, group) for n, charge in enumerate(charges) for group in self._groups(charge)]
        with self._translate():
            replies = await self._patiently(self._settle_batch(charges, calls))
            missing = [
                i for i, r in enumerate(replies) if isinstance(r, redis_errors.NoScriptError)
            ]
            if missing:  # Redis restarted (or a cluster master never ran it): resend those
                await self._client.script_load(SETTLE_LUA)
                retry = [calls[i] for i in missing]
                again = await self._patiently(self._settle_batch(charges, retry))
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        results: list[list[Balance | None] | None] = [None] * len(charges)
        for (n, group), reply in zip(calls, replies, strict=True):
            charge = charges[n]
            if isinstance(reply, redis_errors.RedisError):
                if isinstance(reply, TRANSIENT_ERRORS) or str(reply).startswith(TRANSIENT_REPLIES):
                    raise LimitsStoreUnavailable(f"redis cannot settle now: {reply}")
                log.error("dropping the budget charge of %s: %s", charge.request_id, reply)
                continue
            balances = _balances(cast(list[int], reply))
            if balances is None:  # settled before
                continue
            if results[n] is None:
                results[n] = [None] * len(charge.budgets)
            for local, rule in enumerate(group.budgets):
                results[n][rule] = balances[local]  # type: ignore[index]
        return [None if r is None else tuple(r) for r in results]

    def _groups(self, charge: Charge) -> list[SlotGroup]:
        """The slots a charge touches: one group of everything off a cluster."""
        if self._spread:
            return slot_groups(charge.rates, charge.budgets)
        return [_everything(len(charge.rates), len(charge.budgets))]

    async def spent(self, budgets: Sequence[tuple[BudgetRule, Period]]) -> list[int]:
        with self._translate():
            replies = await self._patiently(self._spent(budgets))
        return [int(reply or 0) for reply in replies]

    async def _spent(self, budgets: Sequence[tuple[BudgetRule, Period]]) -> list[str | None]:
        async with self._client.pipeline(transaction=False) as pipe:
            for budget, period in budgets:
                pipe.hget(self.budget_key(budget.scope, budget.name, period.id), "spent")
            replies: list[str | None] = await pipe.execute()
            return replies

    async def _patiently(self, call: Awaitable[T]) -> T:
        """`call`'s result, or TimeoutError once Redis has been silent (answered no call
        of this store) for the timeout, or the call has taken `busy_timeout`. Silence is
        counted in ticks: a tick that comes late was the event loop's lag, not Redis's
        silence, and counts once."""
        task = asyncio.ensure_future(call)
        started = last = time.monotonic()
        silence = 0.0
        try:
            while True:
                done, _ = await asyncio.wait((task,), timeout=TICK_S)
                now = time.monotonic()
                if done:
                    result = task.result()
                    self._answered_at = now
                    return result
                silence = 0.0 if self._answered_at > last else silence + min(now - last, TICK_S)
                last = now
                if silence >= self._timeout_s or now - started >= self._busy_s:
                    raise TimeoutError(f"redis answered nothing for {self._timeout_s} s")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, *_UNAVAILABLE):
                    await task

    async def _settle_batch(
        self, charges: Sequence[Charge], calls: Sequence[tuple[int, SlotGroup]]
    ) -> list[Any]:
        """Replies or, per call, the error Redis answered (connection errors raise)."""
        async with self._client.pipeline(transaction=False) as pipe:
            for n, group in calls:
                keys, args = self._settle_call(charges[n], group)
                # The raw command: a cluster pipeline refuses `evalsha()` (each call's
                # keys share one slot).
                pipe.execute_command("EVALSHA", self._settle.sha, len(keys), *keys, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            return replies

    def _settle_call(self, charge: Charge, group: SlotGroup) -> tuple[list[str], list[Any]]:
        tagged = self.tagged(group.scope, group.name) if self._spread else self._base
        keys = [tagged + "settled:" + charge.request_id]
        keys += [self.rate_key(charge.rates[i].scope, charge.rates[i].name) for i in group.rates]
        # The minute this slot counted the request in (one script: one minute per slot).
        window = charge.windows[group.rates[0]] if charge.windows and group.rates else charge.window
        args: list[Any] = [charge.request_id, SETTLED_MARKER_TTL_S, len(group.rates)]
        args += [len(group.budgets), window, charge.token_delta, charge.cost_nanos]
        for i in group.budgets:
            budget, period = charge.budgets[i], charge.periods[i]
            key = self.budget_key(budget.scope, budget.name, period.id)
            keys += [key, key + ":held"]
            args.append(_expire_at(period.ends_at))
        return keys, args

    async def close(self) -> None:
        await self._client.aclose()

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except _UNAVAILABLE as exc:
            raise LimitsStoreUnavailable(f"redis failed for limits: {exc!r}") from exc


@functools.lru_cache(maxsize=64)
def _everything(n_rate: int, n_budget: int) -> SlotGroup:
    """All of a request's rules as one group (its keys share one slot)."""
    return SlotGroup("", "", tuple(range(n_rate)), tuple(range(n_budget)))


def spread_tag(prefix: str, scope: str, name: str) -> str:
    """The prefix of a rule's keys on a cluster: its own slot, by scope and name."""
    return f"{prefix}{{limits:{scope}:{name}}}:"


def _expire_at(period_ends_at: float) -> int:
    return int(period_ends_at) + KEEP_AFTER_PERIOD_S


def _verdict(reply: list[int], n_rate: int, n_budget: int) -> Verdict:
    if reply[0] == 1:
        _, option, window, *rest = reply
        remaining = tuple(
            (_limit_left(rest[2 * i]), _limit_left(rest[2 * i + 1])) for i in range(n_rate)
        )
        past_soft = tuple(bool(flag) for flag in rest[2 * n_rate : 2 * n_rate + n_budget])
        unseeded = tuple(bool(flag) for flag in rest[2 * n_rate + n_budget :])
        return Admitted(option, window, remaining, past_soft, (), unseeded if any(unseeded) else ())
    if reply[1] == 1:
        _, _, rule, kind, previous, current, elapsed = reply
        return RateRefusal(
            rule - 1, "requests" if kind == 1 else "tokens", previous, current, elapsed
        )
    _, _, rule, used, cost, option, spent, limit = reply
    return BudgetRefusal(rule - 1, used, cost, option, spent, limit)


def _limit_left(value: int) -> int | None:
    return None if value < 0 else value


def _balances(reply: list[int]) -> tuple[Balance, ...] | None:
    if reply[0] == 0:
        return None
    pairs = reply[1:]
    return tuple(Balance(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2))

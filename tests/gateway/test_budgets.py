"""Budgets through the running gateway, on real Redis: worst-case reservations before
the upstream call, settlement to the ledger's numbers after it, soft-limit downgrades,
hard-limit 429s, day and month periods, and the outage policy."""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.billing.tokens import count_prompt
from gateway.ledger import RedisStore
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, metric, wait_for_record
from tests.gateway.ledger_fixtures import RedisServer, free_port
from tests.gateway.server import GatewayServer
from tests.support import eventually

MESSAGES = [{"role": "user", "content": "hi there"}]
MAX_TOKENS = 10
REPLY_TOKENS = 5
PREMIUM_NANOS_PER_TOKEN = 10_000  # $10 per million tokens, in and out
CHEAP_NANOS_PER_TOKEN = 1_000
PROMPT = count_prompt("big-model", "chat", {"messages": MESSAGES})  # what admission counts
WORST = (PROMPT + MAX_TOKENS) * PREMIUM_NANOS_PER_TOKEN
ACTUAL = (2 + REPLY_TOKENS) * PREMIUM_NANOS_PER_TOKEN  # the fake bills words: 2 in, 5 out

POLICY = """
deployments:
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 10}
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local
    price: {input_per_mtok: 1, output_per_mtok: 1}
routes:
  auto:
    strategy: fallback
    deployments: [premium, cheap]
  careful:
    strategy: cascade
    deployments: [cheap, premium]
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research}
teams:
  research: {}
gateway:
  limits_when_redis_down: __DOWN__
  request_timeout_s: __TIMEOUT__
budgets:
"""


def policy(*budgets: str, down: str = "open", timeout_s: float = 30) -> str:
    text = POLICY.replace("__DOWN__", down).replace("__TIMEOUT__", str(timeout_s))
    return text + "".join(f"  - {b}\n" for b in budgets)


@pytest.fixture
def cheap() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        fake.tokens = REPLY_TOKENS
        yield fake


@pytest.fixture
def premium(fake_openai: FakeOpenAI) -> FakeOpenAI:
    fake_openai.tokens = REPLY_TOKENS
    return fake_openai


@pytest.fixture
def start(start_gateway: StartGateway, premium: FakeOpenAI, cheap: FakeOpenAI) -> Iterator[Any]:
    def run(text: str, **kwargs: Any) -> GatewayServer:
        return start_gateway(text, PREMIUM_URL=premium.url, CHEAP_URL=cheap.url, **kwargs)

    yield run


@pytest.fixture
def counters(redis_url: str, redis_prefix: str) -> Iterator[Counters]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield Counters(client, redis_prefix)
    client.close()


class Counters:
    """Reads the budget hashes the gateway under test writes."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def key(self, scope: str, name: str, period: str) -> str:
        return f"{self.prefix}{{limits}}:budget:{scope}:{name}:{period}"

    def state(self, scope: str, name: str, period: str | None = None) -> tuple[int, int]:
        """(spent, reserved) in nano-USD for today's period (or `period`)."""
        found = self.client.hmget(self.key(scope, name, period or today()), "spent", "reserved")
        return int(found[0] or 0), int(found[1] or 0)

    def settled(self, scope: str, name: str, spent: int, period: str | None = None) -> None:
        """Wait until nothing is reserved and `spent` is charged (settling is async)."""
        charged = (spent, 0)
        eventually(lambda: self.state(scope, name, period) == charged, 10, f"{charged}")


def today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def ask(base: str, model: str = "auto", **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": MESSAGES, "max_tokens": MAX_TOKENS, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


@pytest.mark.parametrize(
    ("scope", "name", "label"),
    [
        ("key", "k", "key 'k' daily budget"),
        ("team", "research", "team 'research' daily budget"),
        ("route", "auto", "route 'auto' daily budget"),
    ],
)
async def test_a_hard_limit_refuses_once_the_worst_case_no_longer_fits(
    start: Any,
    counters: Counters,
    ledger_store: RedisStore,
    scope: str,
    name: str,
    label: str,
) -> None:
    # Room for two requests' worst case and a bit: 2 settle, the third cannot reserve.
    limit = (2 * ACTUAL + WORST - 1) / 1e9
    base = start(policy(f"{{scope: {scope}, name: {name}, period: day, limit_usd: {limit}}}")).url
    first = ask(base)
    assert first.status_code == 200
    counters.settled(scope, name, ACTUAL)
    record = await wait_for_record(ledger_store, first.headers["x-request-id"])
    assert record.cost_nanos == ACTUAL  # the counter holds the ledger's number
    assert ask(base).status_code == 200
    counters.settled(scope, name, 2 * ACTUAL)

    refused = ask(base)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("budget_exceeded", "insufficient_quota")
    assert label in error["message"] and "resets at" in error["message"]
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    until = (midnight + timedelta(days=1) - datetime.now(UTC)).total_seconds()
    assert abs(int(refused.headers["retry-after"]) - until) <= 2
    assert refused.headers["x-should-retry"] == "false"
    # A smaller max_tokens fits what is left.
    assert ask(base, max_tokens=1).status_code == 200
    assert metric(base, "cascade_budget_rejections_total") == 1


async def test_a_budget_full_only_of_holds_in_flight_is_busy_not_spent(
    start: Any, premium: FakeOpenAI, counters: Counters
) -> None:
    """Room for one worst case: while a slow request holds it, a second is refused,
    but the budget is busy, not spent (what is settled leaves room for it): a 429 to
    retry in seconds, without the `x-should-retry: false` that would keep the SDKs
    away until midnight. Once the first settles, the second's retry goes through."""
    limit = (WORST + ACTUAL) / 1e9  # one worst case fits; two do not
    base = start(policy(f"{{scope: team, name: research, period: day, limit_usd: {limit}}}")).url
    premium.delay_s = 1.0
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
        slow = asyncio.create_task(
            client.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        )
        await asyncio.to_thread(eventually, lambda: premium.requests, 5, "the slow call")
        busy = await client.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        assert (await slow).status_code == 200
    assert busy.status_code == 429
    error = busy.json()["error"]
    assert (error["code"], error["type"]) == ("budget_busy", "rate_limit_error")
    assert "in flight" in error["message"]
    assert busy.headers["retry-after"] == "2" and "x-should-retry" not in busy.headers
    counters.settled("team", "research", ACTUAL)
    premium.delay_s = 0.0
    assert ask(base).status_code == 200


def test_every_budget_of_a_request_is_charged_in_one_settlement(
    start: Any, counters: Counters
) -> None:
    base = start(
        policy(
            "{scope: key, name: k, period: day, limit_usd: 1}",
            "{scope: team, name: research, period: month, limit_usd: 1}",
            "{scope: route, name: auto, period: day, limit_usd: 1}",
        )
    ).url
    for _ in range(3):
        assert ask(base).status_code == 200
    month = datetime.now(UTC).strftime("%Y-%m")
    counters.settled("key", "k", 3 * ACTUAL)
    counters.settled("team", "research", 3 * ACTUAL, period=month)
    counters.settled("route", "auto", 3 * ACTUAL)
    remaining = metric(base, 'cascade_budget_remaining_usd{name="k",period="day",scope="key"}')
    assert remaining == pytest.approx(1 - 3 * ACTUAL / 1e9)


def test_every_gateway_shows_what_a_budget_has_left_from_the_shared_counters(
    start: Any, counters: Counters
) -> None:
    """`cascade_budget_remaining_usd` is read from Redis at each scrape: a gateway (or
    worker) that settled nothing shows the spend of the others, a budget shows its full
    limit before its first request, and a new period starts full without a request."""
    text = policy(
        "{scope: key, name: k, period: day, limit_usd: 1}",
        "{scope: team, name: research, period: month, limit_usd: 2}",
    )
    serving, watching = start(text), start(text)
    day = 'cascade_budget_remaining_usd{name="k",period="day",scope="key"}'
    month = 'cascade_budget_remaining_usd{name="research",period="month",scope="team"}'
    now = datetime(2031, 1, 31, 23, 0, tzinfo=UTC)
    for server in (serving, watching):
        server.services.limits.clock = now.timestamp
    assert (metric(watching.url, day), metric(watching.url, month)) == (1.0, 2.0)

    for _ in range(2):
        assert ask(serving.url).status_code == 200
    counters.settled("key", "k", 2 * ACTUAL, period="2031-01-31")
    assert metric(watching.url, day) == pytest.approx(1 - 2 * ACTUAL / 1e9)
    assert metric(watching.url, month) == pytest.approx(2 - 2 * ACTUAL / 1e9)

    watching.services.limits.clock = (now + timedelta(hours=2)).timestamp  # Feb 1st
    assert (metric(watching.url, day), metric(watching.url, month)) == (1.0, 2.0)


def test_day_and_month_periods_have_their_own_counters(start: Any, counters: Counters) -> None:
    month_limit = (3 * ACTUAL + WORST - 1) / 1e9
    server = start(
        policy(
            "{scope: team, name: research, period: day, limit_usd: 1}",
            f"{{scope: team, name: research, period: month, limit_usd: {month_limit}}}",
        )
    )
    now = datetime(2031, 1, 31, 23, 0, tzinfo=UTC)
    server.services.limits.clock = now.timestamp
    assert ask(server.url).status_code == 200
    counters.settled("team", "research", ACTUAL, period="2031-01-31")
    counters.settled("team", "research", ACTUAL, period="2031-01")

    server.services.limits.clock = (now + timedelta(hours=2)).timestamp  # Feb 1st, 01:00
    for n in range(1, 4):
        assert ask(server.url).status_code == 200
        counters.settled("team", "research", n * ACTUAL, period="2031-02-01")
    counters.settled("team", "research", 3 * ACTUAL, period="2031-02")
    refused = ask(server.url)
    assert refused.status_code == 429
    assert "team 'research' monthly budget" in refused.json()["error"]["message"]
    until_march = datetime(2031, 3, 1, tzinfo=UTC) - (now + timedelta(hours=2))
    assert int(refused.headers["retry-after"]) == math.ceil(until_march.total_seconds())
    assert counters.state("team", "research", "2031-01-31") == (ACTUAL, 0)  # untouched


def test_past_the_soft_limit_requests_go_to_the_downgrade_tier(
    start: Any, counters: Counters, cheap: FakeOpenAI
) -> None:
    budget = (
        "{scope: team, name: research, period: day, limit_usd: 1, "
        f"soft_limit_usd: {1.5 * ACTUAL / 1e9}, downgrade_tier: local}}"
    )
    base = start(policy(budget)).url
    tiers = []
    for _ in range(4):
        response = ask(base)
        assert response.status_code == 200
        tiers.append(response.headers["x-cascade-tier"])
        spent = ACTUAL * tiers.count("premium") + (2 + REPLY_TOKENS) * CHEAP_NANOS_PER_TOKEN * (
            tiers.count("local")
        )
        counters.settled("team", "research", spent)
    assert tiers == ["premium", "premium", "local", "local"]
    assert len(cheap.requests) == 2
    assert metric(base, "cascade_budget_soft_limit_crossings_total") == 1
    assert metric(base, "cascade_budget_downgrades_total") == 2
    # The state the soft-limit alert reads: past it by what was spent beyond it.
    soft_left = metric(base, "cascade_budget_soft_limit_remaining_usd")
    assert soft_left == pytest.approx((1.5 * ACTUAL - spent) / 1e9) and soft_left < 0


def test_a_downgrade_skips_deployments_that_cannot_serve_the_request(
    start: Any, counters: Counters, cheap: FakeOpenAI
) -> None:
    """Past the soft limit, a tools request stays on the tier that serves tools rather
    than being sent to a downgrade tier whose deployment does not (it would refuse)."""
    budget = (
        "{scope: team, name: research, period: day, limit_usd: 1, "
        f"soft_limit_usd: {0.5 * ACTUAL / 1e9}, downgrade_tier: local}}"
    )
    text = policy(budget).replace(
        "    tier: local\n", "    tier: local\n    capabilities: [chat]\n"
    )
    base = start(text).url
    assert ask(base).headers["x-cascade-tier"] == "premium"
    counters.settled("team", "research", ACTUAL)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = ask(base, tools=[tool])
    assert with_tools.status_code == 200
    assert with_tools.headers["x-cascade-tier"] == "premium"  # local serves no tools
    assert ask(base).headers["x-cascade-tier"] == "local"  # plain chat is downgraded
    assert all("tools" not in r["body"] for r in cheap.requests)


def test_a_downgrade_tier_that_is_ejected_releases_its_hold(
    start: Any, counters: Counters, cheap: FakeOpenAI
) -> None:
    """Past the soft limit with the downgrade tier's deployment ejected by its breaker:
    the request is refused (503) and what admission reserved for it is released, so the
    team is not later told its budget is spent."""
    budget = (
        "{scope: team, name: research, period: day, limit_usd: 1, "
        f"soft_limit_usd: {1.5 * ACTUAL / 1e9}, downgrade_tier: local}}"
    )
    text = policy(budget).replace(
        "gateway:\n", "gateway:\n  circuit_breaker: {failure_threshold: 1, cooldown_s: 600}\n"
    )
    base = start(text).url
    assert [ask(base).status_code for _ in range(2)] == [200, 200]  # past the soft limit
    cheap.fail(500, times=None)
    assert ask(base).status_code == 502  # downgraded to cheap, which fails: ejected
    refused = ask(base)
    assert refused.status_code == 503 and "ejected" in refused.json()["error"]["message"]
    counters.settled("team", "research", 2 * ACTUAL)  # nothing left reserved


def test_a_cascade_reserves_one_answer_per_tier(start: Any, counters: Counters) -> None:
    cheap_worst = (PROMPT + MAX_TOKENS) * CHEAP_NANOS_PER_TOKEN
    exact = (WORST + cheap_worst) / 1e9  # both tiers' worst case fits, one nano less does not
    base = start(policy(f"{{scope: route, name: careful, period: day, limit_usd: {exact}}}")).url
    assert ask(base, model="careful").status_code == 200
    base2 = start(
        policy(f"{{scope: route, name: careful, period: day, limit_usd: {exact - 1e-9}}}")
    ).url
    assert ask(base2, model="careful").status_code == 429


def test_a_finished_stream_settles_to_its_ledger_cost(
    start: Any, counters: Counters, ledger_store: RedisStore
) -> None:
    base = start(policy("{scope: key, name: k, period: day, limit_usd: 1}")).url
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.read().endswith(b"data: [DONE]\n\n")
    counters.settled("key", "k", ACTUAL)


async def test_a_stream_cut_by_the_client_settles_what_was_sent(
    start: Any, counters: Counters, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    premium.tokens, premium.itl_s = 50, 0.05
    base = start(policy("{scope: key, name: k, period: day, limit_usd: 1}")).url
    body = {"model": "auto", "messages": MESSAGES, "stream": True}
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", f"{base}/v1/chat/completions", json=body, headers=AUTH) as response,
    ):
        request_id = response.headers["x-request-id"]
        async for line in response.aiter_lines():
            # The client goes away after the first text (the role chunk carries none,
            # so leaving on it could rightly settle zero completion tokens).
            if re.search(r'"content":\s*"[^"]', line):
                break
    record = await wait_for_record(ledger_store, request_id)
    assert record.status == "partial" and 0 < record.completion_tokens < 50
    await asyncio.to_thread(counters.settled, "key", "k", record.cost_nanos)


def test_an_upstream_error_releases_the_reservation(
    start: Any, counters: Counters, premium: FakeOpenAI, cheap: FakeOpenAI
) -> None:
    premium.fail(400, times=None)  # the client's fault: no fallback, nothing priced
    base = start(policy("{scope: key, name: k, period: day, limit_usd: 1}")).url
    assert ask(base).status_code == 400
    counters.settled("key", "k", 0)
    premium.fail_status = None
    assert ask(base).status_code == 200
    counters.settled("key", "k", ACTUAL)


def test_a_request_cancelled_at_its_deadline_releases_the_reservation(
    start: Any, counters: Counters, premium: FakeOpenAI, cheap: FakeOpenAI
) -> None:
    """Nothing is left reserved; the attempt in flight had the prompt, so the budget is
    charged that (premium's price), and nothing more."""
    premium.delay_s = cheap.delay_s = 5.0
    base = start(policy("{scope: key, name: k, period: day, limit_usd: 1}", timeout_s=0.3)).url
    assert ask(base).status_code == 504  # the upstream calls were cancelled
    counters.settled("key", "k", PROMPT * PREMIUM_NANOS_PER_TOKEN)


@pytest.mark.parametrize(("down", "status"), [("open", 200), ("closed", 503)])
def test_redis_down_follows_the_policy(start: Any, down: str, status: int) -> None:
    unreachable = f"redis://127.0.0.1:{free_port()}/3"
    budget = "{scope: key, name: k, period: day, limit_usd: 0.000001}"
    base = start(policy(budget, down=down), redis=unreachable).url
    for _ in range(3):
        response = ask(base)
        assert response.status_code == status
    if status == 503:
        assert response.json()["error"]["code"] == "limits_unavailable"
    action = "served_unchecked" if down == "open" else "refused"
    assert metric(base, f'cascade_limits_unavailable_total{{action="{action}"}}') == 3
    assert metric(base, "cascade_limits_degraded") == 1


def test_no_limits_means_no_limit_keys(start: Any, counters: Counters) -> None:
    base = start(policy("{scope: route, name: careful, period: day, limit_usd: 1}")).url
    response = ask(base)
    assert response.status_code == 200
    assert not [h for h in response.headers if h.startswith("x-ratelimit")]
    keys = counters.client.scan_iter(match=f"{counters.prefix}{{limits}}*")
    # Only the outage watch's probe key: no counters for a request nothing limits.
    assert set(keys) <= {f"{counters.prefix}{{limits}}:probe"}


def test_settlements_made_during_an_outage_reach_the_counters_after_it(
    start: Any, tmp_path: Path, redis_prefix: str
) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        counters = Counters(client, redis_prefix)
        base = start(
            policy("{scope: key, name: k, period: day, limit_usd: 1}"), redis=server.url
        ).url
        assert ask(base).status_code == 200
        counters.settled("key", "k", ACTUAL)
        server.kill()
        assert [ask(base).status_code for _ in range(2)] == [200, 200]  # served unchecked
        assert metric(base, 'cascade_limits_unavailable_total{action="served_unchecked"}') == 2
        server.start()  # the same data (AOF): the queued settlements are written now
        counters.settled("key", "k", 3 * ACTUAL)
        eventually(lambda: metric(base, "cascade_limits_degraded") == 0, 5, "limits back")
        assert ask(base).status_code == 200
        counters.settled("key", "k", 4 * ACTUAL)
    finally:
        client.close()
        server.stop()


async def timed(client: httpx.AsyncClient, base: str) -> tuple[int, float]:
    body = {"model": "auto", "messages": MESSAGES, "max_tokens": MAX_TOKENS}
    started = time.monotonic()
    response = await client.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
    return response.status_code, time.monotonic() - started


async def test_a_hung_redis_costs_one_bounded_wait_then_none(
    start: Any, redis_server: RedisServer
) -> None:
    """SIGSTOP: connections open but nothing answers. Requests in flight when Redis
    stops wait one timeout (no retry); later ones never wait on a probe."""
    budget = "{scope: key, name: k, period: day, limit_usd: 1}"
    base = start(policy(budget), redis=redis_server.url).url
    async with httpx.AsyncClient(timeout=30) as client:
        assert (await timed(client, base))[0] == 200
        redis_server.pause()
        paused_at = time.monotonic()
        try:
            first = await asyncio.gather(*(timed(client, base) for _ in range(10)))
            assert {status for status, _ in first} == {200}
            assert max(took for _, took in first) < 0.9  # one 0.5 s timeout, not two
            later = []
            while time.monotonic() - paused_at < 4:  # several probe intervals
                later.append(await timed(client, base))
            assert {status for status, _ in later} == {200}
            assert max(took for _, took in later) < 0.3, sorted(t for _, t in later)[-5:]
        finally:
            redis_server.resume()


def test_limits_closed_by_a_hung_redis_reopen_when_it_answers(
    start: Any, redis_server: RedisServer
) -> None:
    """Nothing is queued to settle here: the background probe alone ends the outage."""
    budget = "{scope: key, name: k, period: day, limit_usd: 1}"
    base = start(policy(budget, down="closed"), redis=redis_server.url).url
    assert ask(base).status_code == 200
    redis_server.pause()
    try:
        assert ask(base).status_code == 503  # after one timeout
        for _ in range(20):
            started = time.monotonic()
            assert ask(base).status_code == 503
            assert time.monotonic() - started < 0.3
    finally:
        redis_server.resume()

    def answered() -> bool:
        status = ask(base).status_code
        assert status in (200, 503), status
        return status == 200

    eventually(answered, 5, "an answer once Redis is back")
    assert metric(base, "cascade_limits_degraded") == 0

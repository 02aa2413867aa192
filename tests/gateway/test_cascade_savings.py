"""What a request saved: its cost against what it would have cost sent once to its
route's reference model. On a cascade the counterfactual is the answer the client got,
not the first one asked for: a cheap answer rejected for its length says nothing of
what the reference would have written. Embeddings are compared only with an embedding
model. Only the first record waits for the delivered answer: a rejected escalation is
in the ledger while the climb goes on, so a worker killed mid-climb loses no more.
Over loopback HTTP against the fake upstreams, on real Redis; the climbs' timing
in-process, on scripted upstreams."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.billing.pricing import TokenPrice
from gateway.ledger import RedisStore, SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.cascade import Cascade
from gateway.pipeline.executor import Executor
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime
from gateway.upstreams.base import UpstreamConnectFailed, UpstreamReply, UpstreamTarget
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import GOOD, QUESTION, REFUSAL
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.gateway.scripted import Behaviour, ScriptedClient, fails
from tests.support import eventually_async

FINANCE = {"authorization": "Bearer fake-finance-key"}
POLICY = """
deployments:
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    max_output_tokens: 1000  # a longer answer is cut: truncated, so rejected
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
  embedder:
    api_base: ${CHEAP_URL}
    model: text-embedding-3-small
    price: {input_per_mtok: 0.01, output_per_mtok: 0.01}
routes:
  careful:
    strategy: cascade
    deployments: [cheap, premium]
    verify_threshold: 0.5
    max_escalations: 1
    reference_model: premium
  vectors: {strategy: fixed, deployments: [embedder], reference_model: gpt-4o}
  embedding-vectors:
    strategy: fixed
    deployments: [embedder]
    reference_model: text-embedding-3-small
teams:
  research: {}
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research}
finance_keys: ["${FINANCE_KEY}"]
"""
# Nano-dollars a token on premium, the reference (5 and 15 USD per million tokens).
PREMIUM_INPUT, PREMIUM_OUTPUT = 5_000, 15_000
EMBEDDING_INPUT = 20  # text-embedding-3-small in litellm's map: 0.02 USD per million


def on_premium(record: SpendRecord) -> int:
    """The record's own tokens priced on the reference model."""
    return record.prompt_tokens * PREMIUM_INPUT + record.completion_tokens * PREMIUM_OUTPUT


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI) -> str:
    fake_openai.reply_text, premium.reply_text = GOOD, GOOD
    env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url}
    return start_gateway(POLICY, FINANCE_KEY="fake-finance-key", **env).url


def ask(base: str, **extra: Any) -> httpx.Response:
    body = {"model": "careful", "messages": [QUESTION], **extra}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response


def spend(base: str, group_by: str = "", fmt: str = "json") -> httpx.Response:
    params = {"group_by": group_by, "format": fmt}
    reply = httpx.get(f"{base}/v1/spend", params=params, headers=FINANCE, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply


async def test_an_escalated_request_is_compared_on_the_answer_it_delivered(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """The reviewer's case: the cheap tier rambles to its cap (truncated: rejected) and
    premium, the reference, answers in one word. The request cost both answers and would
    have cost premium's alone: it saved minus the cheap answer, not +$0.0096."""
    fake_openai.tokens, premium.reply_text = 2000, "Paris."
    response = ask(base)
    assert response.headers["x-cascade-escalations"] == "1"
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    escalated = await wait_for_record(ledger_store, f"{request_id}:1")
    assert (cheap.completion_tokens, escalated.completion_tokens) == (1000, 1)
    # The first record still counts the request and carries its one reference.
    assert cheap.reference_cost_nanos == escalated.cost_nanos == on_premium(escalated)
    assert escalated.reference_cost_nanos == 0
    saved = cheap.reference_cost_nanos - cheap.cost_nanos - escalated.cost_nanos
    assert saved == -cheap.cost_nanos < 0
    total = spend(base).json()["total"]
    assert (total["requests"], total["calls"]) == (1, 2)
    assert total["savings_nanos"] == -cheap.cost_nanos
    # Premium only answered an escalation: no requests, so no cost per 1,000 of them.
    rows = {row["deployment"]: row for row in spend(base, "deployment").json()["data"]}
    assert (rows["premium"]["requests"], rows["premium"]["calls"]) == (0, 1)
    assert rows["premium"]["cost_per_1k_requests_nanos"] is None
    assert rows["premium"]["cost_per_1k_requests_usd"] is None
    assert rows["cheap"]["cost_per_1k_requests_nanos"] == cheap.cost_nanos * 1000
    table = csv.DictReader(io.StringIO(spend(base, "deployment", "csv").text))
    cells = {row["deployment"]: row["cost_per_1k_requests_usd"] for row in table}
    assert cells["premium"] == "" and cells["cheap"] != ""


async def test_a_kept_cheap_answer_is_compared_on_its_own_tokens(
    base: str, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    response = ask(base)
    assert response.headers["x-cascade-escalations"] == "0" and premium.requests == []
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.reference_cost_nanos == on_premium(record) > record.cost_nanos


async def test_a_failed_escalation_prices_the_first_answer_on_its_own_tokens(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """The escalation failed: the client gets the rejected cheap answer after all, and
    the request's one record is compared on it."""
    fake_openai.reply_text = REFUSAL
    premium.fail(500, times=None)
    response = ask(base)
    assert response.headers["x-cascade-deployment"] == "cheap"
    request_id = response.headers["x-request-id"]
    record = await wait_for_record(ledger_store, request_id)
    assert record.reference_cost_nanos == on_premium(record)
    assert record.sla_met is None and record.verifier_score is not None  # judged, rejected
    assert await ledger_store.get(f"{request_id}:1") is None


async def test_the_ledgers_records_reconcile_with_the_spend_report(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """Kept, escalated, streamed through the cascade: each request's first record
    carries its one reference, and the report sums the records exactly."""
    ids = [ask(base).headers["x-request-id"]]
    fake_openai.tokens, premium.reply_text = 2000, "Paris."
    ids.append(ask(base).headers["x-request-id"])
    body = {"model": "careful", "messages": [QUESTION], "stream": True}
    streamed = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert streamed.headers["x-cascade-escalations"] == "1"
    ids.append(streamed.headers["x-request-id"])
    for request_id in ids:
        await wait_for_record(ledger_store, request_id)
    for request_id in ids[1:]:
        await wait_for_record(ledger_store, f"{request_id}:1")
    records = await ledger_store.events()
    assert sorted(r.request_id for r in records if r.is_request) == sorted(ids)
    total = spend(base).json()["total"]
    assert total["requests"] == 3 and total["calls"] == len(records) == 5
    assert total["cost_nanos"] == sum(r.cost_nanos for r in records)
    assert total["reference_cost_nanos"] == sum(r.reference_cost_nanos for r in records)
    delivered = {r.request_id: r for r in records if r.record_id.endswith(":1")}
    for first in (r for r in records if r.record_id in delivered):
        assert first.reference_cost_nanos == delivered[first.request_id].cost_nanos


# Two more rejected tiers on the cheap fake before premium, the reference.
TALL_POLICY = POLICY.replace(
    "  embedder:\n",
    "  mid: {api_base: '${CHEAP_URL}', model: mid-model, tier: mid,"
    " price: {input_per_mtok: 1, output_per_mtok: 2}}\n"
    "  upper: {api_base: '${CHEAP_URL}', model: upper-model, tier: upper,"
    " price: {input_per_mtok: 2, output_per_mtok: 4}}\n"
    "  embedder:\n",
).replace(
    "routes:\n",
    "routes:\n"
    "  tall:\n"
    "    strategy: cascade\n"
    "    deployments: [cheap, mid, upper, premium]\n"
    "    verify_threshold: 0.5\n"
    "    max_escalations: 3\n"
    "    reference_model: premium\n",
)


async def test_a_rejected_escalation_is_in_the_ledger_while_the_climb_goes_on(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """cheap, mid and upper refuse; premium is slow. While it works, mid's answer
    (`:1`, rejected now that upper's came) is already in Redis; cheap's waits for the
    delivered answer (its record prices the reference) and upper's for premium's outcome
    (it would be the client's, had premium failed). Then each is there once."""
    fake_openai.reply_text, premium.reply_text, premium.delay_s = REFUSAL, GOOD, 2.0
    env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url}
    base = start_gateway(TALL_POLICY, FINANCE_KEY="fake-finance-key", **env).url
    body = {"model": "tall", "messages": [QUESTION]}
    async with httpx.AsyncClient(timeout=30) as client:
        url = f"{base}/v1/chat/completions"
        asking = asyncio.create_task(client.post(url, json=body, headers=AUTH))
        early = await eventually_async(ledger_store.events, 5, "the rejected escalation")
        assert not asking.done() and premium.requests  # premium still at work
        response = await asking
    assert response.status_code == 200 and response.headers["x-cascade-escalations"] == "3"
    request_id = response.headers["x-request-id"]
    assert [r.record_id for r in early] == [f"{request_id}:1"]
    assert early[0].deployment == "mid" and early[0].sla_met is None
    ids = [request_id, *(f"{request_id}:{n}" for n in (1, 2, 3))]
    for record_id in ids:
        await wait_for_record(ledger_store, record_id)
    records = await ledger_store.events()
    assert sorted(r.record_id for r in records) == sorted(ids)  # each exactly once
    by_id = {r.record_id: r for r in records}
    assert [by_id[i].deployment for i in ids] == ["cheap", "mid", "upper", "premium"]
    assert by_id[request_id].reference_cost_nanos == by_id[ids[-1]].cost_nanos
    assert by_id[ids[1]] == early[0]  # written once, as it was first written
    total = spend(base).json()["total"]
    assert (total["requests"], total["calls"]) == (1, 4)


def embed(base: str, route: str) -> httpx.Response:
    body = {"model": route, "input": "three little words"}
    response = httpx.post(f"{base}/v1/embeddings", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response


async def test_embeddings_against_a_chat_reference_are_unreferenced(
    base: str, ledger_store: RedisStore
) -> None:
    """gpt-4o's input price is no counterfactual for a vector: the record carries no
    reference, and its cost is reported as unreferenced, not as 96% savings."""
    response = embed(base, "vectors")
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert (record.reference_model, record.reference_cost_nanos) == (None, 0)
    assert record.cost_nanos > 0 and record.surface == "embeddings"
    [row] = spend(base, "route").json()["data"]
    assert (row["route"], row["reference_coverage"]) == ("vectors", "none")
    assert row["unreferenced_cost_nanos"] == row["cost_nanos"] == record.cost_nanos
    assert (row["reference_cost_nanos"], row["savings_nanos"]) == (None, None)


async def test_embeddings_against_an_embedding_reference_are_compared(
    base: str, ledger_store: RedisStore
) -> None:
    response = embed(base, "embedding-vectors")
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.reference_model == "text-embedding-3-small"
    assert record.reference_cost_nanos == record.prompt_tokens * EMBEDDING_INPUT > 0
    [row] = spend(base, "route").json()["data"]
    assert (row["reference_coverage"], row["unreferenced_cost_nanos"]) == ("full", 0)


# --- in-process: a climb cancelled while it escalates -----------------------------------

USAGE = {"prompt_tokens": 10, "completion_tokens": 400}


class Ledger(list[SpendRecord]):
    def submit(self, record: SpendRecord) -> None:
        self.append(record)


def scripted(name: str, tier: str, price: TokenPrice) -> DeploymentRuntime:
    target = UpstreamTarget(name, "openai", f"{name}-model", "http://unused", None)
    return DeploymentRuntime(name, tier, "openai", target, price, 0, 0.0, None)


CHEAP = scripted("cheap", "a", TokenPrice(1e-7, 1e-7, "policy"))
MID = scripted("mid", "b", TokenPrice(1e-6, 2e-6, "policy"))
UPPER = scripted("upper", "b2", TokenPrice(2e-6, 4e-6, "policy"))
PREMIUM = scripted("premium", "c", TokenPrice(5e-6, 15e-6, "policy"))
TALL = [CHEAP, MID, UPPER, PREMIUM]


def says(usage: dict[str, int], after_s: float = 0.0) -> Behaviour:
    async def reply() -> UpstreamReply:
        await asyncio.sleep(after_s)
        return UpstreamReply({"choices": [{"message": {"content": "x"}}], "usage": usage})

    return reply


def held(gate: asyncio.Event, usage: dict[str, int]) -> Behaviour:
    """Answers once `gate` is set."""

    async def reply() -> UpstreamReply:
        await gate.wait()
        return UpstreamReply({"choices": [{"message": {"content": "x"}}], "usage": usage})

    return reply


DOUBTFUL = 0.3  # below any threshold, above what the verifier calls broken (0.1)


def rejects(*args: Any) -> float:
    return DOUBTFUL


def climb(
    client: ScriptedClient, ledger: Ledger, tiers: list[DeploymentRuntime] | None = None
) -> tuple[Cascade, Call]:
    """A cascade over `tiers` (cheap, mid, premium) whose verifier rejects every
    answer, and its call."""
    names = tuple(d.name for d in tiers or [CHEAP, MID, PREMIUM])
    metrics = Metrics()
    executor, accountant = Executor({"openai": client}, metrics), Accountant(ledger, metrics)
    cascade = Cascade(executor, accountant, rejects, metrics)  # type: ignore[arg-type]
    route = RouteRuntime(
        "careful", "cascade", names, "premium-model", PREMIUM.price,
        max_escalations=len(names) - 1,
    )  # fmt: skip
    call = Call(
        "req_1", "team", "key", route, False, time.perf_counter(),
        endpoint="chat", body={"messages": []}, deadline_s=10.0,
    )  # fmt: skip
    return cascade, call


async def test_only_the_first_of_three_answers_carries_the_delivered_answers_reference() -> None:
    ledger = Ledger()
    short = {"prompt_tokens": 12, "completion_tokens": 2}
    client = ScriptedClient({"cheap": says(USAGE), "mid": says(USAGE), "premium": says(short)})
    cascade, call = climb(client, ledger)
    result = await cascade.run(call, [CHEAP, MID, PREMIUM])
    assert result.final.deployment is PREMIUM
    by_id = {r.record_id: r for r in ledger}
    assert [r.record_id for r in result.records] == ["req_1", "req_1:1", "req_1:2"]
    assert sorted(r.record_id for r in ledger) == ["req_1", "req_1:1", "req_1:2"]
    assert by_id["req_1"].reference_cost_nanos == PREMIUM.price.cost_nanos(12, 2)
    assert by_id["req_1"].reference_cost_nanos == by_id["req_1:2"].cost_nanos
    assert by_id["req_1:1"].reference_cost_nanos == by_id["req_1:2"].reference_cost_nanos == 0
    assert [r.sla_met is None for r in ledger] == [True] * 3  # no SLA on the route


async def test_a_climb_cancelled_while_it_escalates_prices_its_first_answer_once() -> None:
    """Nothing was delivered: the first answer is recorded once, compared on its own
    tokens; the escalation in flight is charged its prompt (`:t1`)."""
    ledger = Ledger()
    client = ScriptedClient({"cheap": says(USAGE), "mid": says(USAGE, after_s=30)})
    cascade, call = climb(client, ledger)
    run = asyncio.create_task(cascade.run(call, [CHEAP, MID, PREMIUM]))
    await eventually_async(lambda: "mid" in client.calls, 5, "the escalation to be asked")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    by_id = {r.record_id: r for r in ledger}
    assert sorted(by_id) == ["req_1", "req_1:t1"] and len(ledger) == 2
    first = by_id["req_1"]
    assert first.reference_cost_nanos == PREMIUM.price.cost_nanos(10, 400)
    assert (by_id["req_1:t1"].status, by_id["req_1:t1"].reference_cost_nanos) == ("partial", 0)


def ids(records: list[SpendRecord] | tuple[SpendRecord, ...]) -> list[str]:
    return sorted(r.record_id for r in records)


async def started_tall_climb(
    ledger: Ledger, premium: Behaviour
) -> tuple[ScriptedClient, asyncio.Task[Any]]:
    """A four-tier climb whose three first answers are rejected, run until premium is
    asked; `premium` says what it does then."""
    upper = {"prompt_tokens": 10, "completion_tokens": 50}
    client = ScriptedClient(
        {"cheap": says(USAGE), "mid": says(USAGE), "upper": says(upper), "premium": premium}
    )
    cascade, call = climb(client, ledger, TALL)
    run = asyncio.create_task(cascade.run(call, TALL))
    await eventually_async(lambda: "premium" in client.calls, 5, "premium to be asked")
    return client, run


async def test_a_rejected_escalation_is_priced_as_soon_as_the_next_answer_comes() -> None:
    """With premium at work, mid's rejected answer is in the ledger, as it was written;
    the first waits for the delivered answer, upper's for premium's outcome."""
    ledger, gate = Ledger(), asyncio.Event()
    short = {"prompt_tokens": 12, "completion_tokens": 2}
    _, run = await started_tall_climb(ledger, held(gate, short))
    [early] = ledger
    assert (early.record_id, early.deployment, early.verifier_score) == (
        "req_1:1",
        "mid",
        DOUBTFUL,
    )
    assert (early.reference_cost_nanos, early.sla_met) == (0, None)
    gate.set()
    result = await run
    every = ["req_1", "req_1:1", "req_1:2", "req_1:3"]
    assert [r.record_id for r in result.records] == every  # in order, for the decisions log
    assert ids(ledger) == every and ledger[0] is early  # each once
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].reference_cost_nanos == by_id["req_1:3"].cost_nanos
    assert by_id["req_1:3"].escalations == 3 and by_id["req_1:3"].verifier_score is None


async def test_a_climb_cancelled_on_its_last_escalation_prices_each_answer_once() -> None:
    ledger = Ledger()
    _, run = await started_tall_climb(ledger, held(asyncio.Event(), USAGE))
    assert ids(ledger) == ["req_1:1"]
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert ids(ledger) == ["req_1", "req_1:1", "req_1:2", "req_1:t1"]
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].reference_cost_nanos == PREMIUM.price.cost_nanos(10, 400)  # its own
    assert by_id["req_1:2"].completion_tokens == 50 and by_id["req_1:2"].sla_met is None


async def test_a_failed_last_escalation_delivers_and_prices_the_answer_before_once() -> None:
    """Premium fails: the client gets upper's rejected answer, written then (not when
    premium was asked), and the request's reference prices its tokens."""
    ledger = Ledger()
    client, run = await started_tall_climb(ledger, fails(UpstreamConnectFailed("refused")))
    result = await run
    assert result.final.deployment is UPPER and client.calls.count("premium") == 1
    assert [r.record_id for r in result.records] == ["req_1", "req_1:1", "req_1:2"]
    assert ids(ledger) == ["req_1", "req_1:1", "req_1:2"]
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].reference_cost_nanos == PREMIUM.price.cost_nanos(10, 50)
    assert by_id["req_1:2"].latency_ms >= by_id["req_1:1"].latency_ms

"""Second opinions on cascade routes: another deployment answers the same question
alongside the cheap tier, the verifier compares final answers, and every opinion that
answered is priced once (`<request_id>:o1`). Through the running gateway over real
sockets, then the cascade in-process where task lifetimes are the subject."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import httpx
import pytest

from gateway.billing.pricing import TokenPrice
from gateway.errors import GatewayError
from gateway.ledger import RedisStore, SpendRecord
from gateway.limits.budgets import Output, worst_case_nanos
from gateway.metrics import Metrics
from gateway.pipeline import opinions as opinions_module
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.cascade import Cascade
from gateway.pipeline.executor import Executor
from gateway.pipeline.scoring import AnswerVerifier
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime, RouteSla, build_runtime
from gateway.upstreams.base import EndpointType, UpstreamReply, UpstreamStatus, UpstreamTarget
from policies import LoadedPolicy, Policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.gateway.ledger_fixtures import free_port
from tests.gateway.multiple_choice import QUESTION
from tests.gateway.scripted import Behaviour, ScriptedClient
from tests.support import eventually_async

POLICY = """
deployments:
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    cascade_logprobs: false     # the verifier's score then rests on the answers alone
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  judge:
    api_base: ${JUDGE_URL}
    model: other-small-model
    tier: local-small
    max_retries: 0
    price: {input_per_mtok: 0.2, output_per_mtok: 0.2}
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
routes:
  careful:
    strategy: cascade
    deployments: [cheap, premium]
    verify_threshold: __THRESHOLD__
    max_escalations: 1
    second_opinions: [judge]
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""


def separating_threshold() -> float:
    """A `verify_threshold` between the shipped verifier's scores of the bare letter "B"
    with a disagreeing opinion and with an agreeing one or none. The verifier is
    retrained now and then; what these tests rely on is only that agreement counts for
    the answer and disagreement against it."""
    verify, body = AnswerVerifier(), {"messages": [QUESTION]}
    reply = {"choices": [{"message": {"content": "B"}, "finish_reason": "stop"}]}
    rejected = verify("chat", body, reply, ["C"])
    kept = min(verify("chat", body, reply, ()), verify("chat", body, reply, ["B"]))
    assert rejected < kept - 0.05, (rejected, kept)
    return round((rejected + kept) / 2, 4)


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        fake.reply_text = "The answer is (B)."
        yield fake


@pytest.fixture
def judge() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def start(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI, judge: FakeOpenAI
) -> Callable[..., str]:
    """start(judge_url=...) -> the base URL of a gateway whose cheap tier answers "B"."""
    fake_openai.reply_text = "B"
    policy = POLICY.replace("__THRESHOLD__", str(separating_threshold()))

    def run(judge_url: str = judge.url) -> str:
        env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url, "JUDGE_URL": judge_url}
        return start_gateway(policy, **env).url

    return run


def ask(base: str, question: dict[str, str] = QUESTION, **extra: Any) -> httpx.Response:
    body = {"model": "careful", "messages": [question], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def opinions_counted(base: str, outcome: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    name = "cascade_second_opinions_total"
    labels = f'deployment="judge",outcome="{outcome}",route="careful"'
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if f"{name}{{{labels}}}" in line
    )


async def records_of(store: RedisStore, request_id: str) -> list[SpendRecord]:
    return [r for r in await store.events() if r.request_id == request_id]


async def all_landed(base: str, store: RedisStore) -> None:
    """Wait until every record of the requests answered so far is in the ledger. A
    request's records are submitted before its reply, and the ledger writes them in
    order: once a later request's record has landed, so have they."""
    haiku = {"role": "user", "content": "Write a haiku about the sea."}  # asks no opinion
    await wait_for_record(store, ask(base, haiku).headers["x-request-id"])


async def test_an_agreeing_opinion_keeps_the_cheap_answer_and_is_priced(
    start: Callable[..., str], premium: FakeOpenAI, judge: FakeOpenAI, ledger_store: RedisStore
) -> None:
    judge.reply_text = "B"
    base = start()
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-escalations"] == "0"
    assert response.headers["x-cascade-second-opinions"] == "1/1"
    assert premium.requests == []
    asked = judge.requests[-1]["body"]
    assert asked["model"] == "other-small-model" and "logprobs" not in asked
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    opinion = await wait_for_record(ledger_store, f"{request_id}:o1")
    assert (cheap.deployment, opinion.deployment) == ("cheap", "judge")
    assert opinion.cost_nanos > 0 and opinion.sla_met is None
    total = cheap.cost_nanos + opinion.cost_nanos
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(total / 1e9)
    assert opinions_counted(base, "agree") == 1


async def test_a_disagreeing_opinion_escalates_and_each_answer_is_priced_once(
    start: Callable[..., str], premium: FakeOpenAI, judge: FakeOpenAI, ledger_store: RedisStore
) -> None:
    judge.reply_text = "C"
    base = start()
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.headers["x-cascade-second-opinions"] == "0/1"  # compared with the cheap "B"
    assert len(judge.requests) == 1  # asked once, whatever the number of verified steps
    request_id = response.headers["x-request-id"]
    await wait_for_record(ledger_store, f"{request_id}:o1")
    records = await records_of(ledger_store, request_id)
    by_id = {r.record_id: r.deployment for r in records}
    assert len(records) == 3
    assert by_id == {request_id: "cheap", f"{request_id}:1": "premium", f"{request_id}:o1": "judge"}
    total = sum(r.cost_nanos for r in records)
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(total / 1e9)
    assert opinions_counted(base, "disagree") == 1


@pytest.mark.parametrize("fault", ["500", "refused"])
async def test_a_failing_opinion_is_ignored(
    start: Callable[..., str],
    premium: FakeOpenAI,
    judge: FakeOpenAI,
    ledger_store: RedisStore,
    fault: str,
) -> None:
    judge.fail(500, times=None)
    base = start() if fault == "500" else start(f"http://127.0.0.1:{free_port()}/v1")
    response = ask(base)
    assert response.status_code == 200
    # Verified without samples: the bare letter alone is kept.
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-second-opinions"] == "0/0"
    assert premium.requests == []
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(cheap.cost_nanos / 1e9)
    await all_landed(base, ledger_store)
    assert await ledger_store.get(f"{request_id}:o1") is None
    assert opinions_counted(base, "failed") == 1


async def test_a_failing_first_tier_escalates_without_waiting_for_opinions(
    start: Callable[..., str],
    fake_openai: FakeOpenAI,
    judge: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """The last tier's answer is not verified, so the opinions it would have been
    judged against are not awaited: the slow one is cut off and charged its prompt."""
    fake_openai.fail(500, times=None)
    judge.delay_s = 5.0
    base = start()
    started = time.monotonic()
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"
    assert time.monotonic() - started < 4.0  # the slow opinion was cancelled, not awaited
    assert response.headers["x-cascade-second-opinions"] == "0/0"
    assert len(judge.requests) == 1
    # Cut off in flight, it is charged its prompt, once, as a losing hedge is.
    opinion = await wait_for_record(ledger_store, f"{response.headers['x-request-id']}:o1")
    assert (opinion.deployment, opinion.status, opinion.completion_tokens) == (
        "judge",
        "partial",
        0,
    )
    await all_landed(base, ledger_store)
    events = await ledger_store.events()
    assert [r.record_id for r in events if r.deployment == "judge"] == [opinion.record_id]


async def test_a_buffered_stream_is_verified_with_second_opinions(
    start: Callable[..., str], judge: FakeOpenAI, ledger_store: RedisStore
) -> None:
    judge.reply_text = "The answer is (B)."
    base = start()
    body = {"model": "careful", "messages": [QUESTION], "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        text = response.read().decode()
    assert response.headers["x-cascade-second-opinions"] == "1/1"
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert text.endswith("data: [DONE]\n\n")
    assert "stream" not in judge.requests[-1]["body"]  # asked whole, as the tiers are
    await wait_for_record(ledger_store, f"{response.headers['x-request-id']}:o1")


def test_a_question_without_a_final_answer_gets_no_opinions(
    start: Callable[..., str], judge: FakeOpenAI
) -> None:
    response = ask(start(), {"role": "user", "content": "Write a haiku about the sea."})
    assert response.status_code == 200
    assert "x-cascade-second-opinions" not in response.headers
    assert judge.requests == []


def test_a_system_prompt_about_code_does_not_make_a_prose_question_comparable(
    start: Callable[..., str], judge: FakeOpenAI
) -> None:
    """The kind is the user's question's: a route's system prompt that asks for fenced
    programs would otherwise buy an opinion on every prose question."""
    system = {"role": "system", "content": "When you write a program, put it in ``` fences."}
    body = {"model": "careful", "messages": [system, {"role": "user", "content": "Hi there!"}]}
    response = httpx.post(f"{start()}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200
    assert "x-cascade-second-opinions" not in response.headers
    assert judge.requests == []


CODE_QUESTION = {"role": "user", "content": "Write a python function to reverse a string."}
CHEAP_CODE = "```python\ndef reverse(text):\n    return text[::-1]\n```"


@pytest.mark.parametrize(
    ("opinion", "outcome"),
    [
        ("Sure:\n```python\ndef reverse(text):\n    return text[::-1]\n```", "agree"),
        ("```python\nclass Stack:\n    def push(self, item):\n        pass\n```", "disagree"),
    ],
)
async def test_a_code_question_is_compared_by_how_alike_the_code_is(
    start: Callable[..., str],
    fake_openai: FakeOpenAI,
    judge: FakeOpenAI,
    ledger_store: RedisStore,
    opinion: str,
    outcome: str,
) -> None:
    judge.reply_text = opinion
    base = start()
    fake_openai.reply_text = CHEAP_CODE
    response = ask(base, CODE_QUESTION)
    assert response.status_code == 200
    agreeing = "1/1" if outcome == "agree" else "0/1"
    assert response.headers["x-cascade-second-opinions"] == agreeing
    assert opinions_counted(base, outcome) == 1
    opinion_record = await wait_for_record(ledger_store, f"{response.headers['x-request-id']}:o1")
    assert opinion_record.deployment == "judge" and opinion_record.cost_nanos > 0


# The cascade in-process, with scripted upstreams: when opinions are cancelled, which
# are priced, and that no task outlives the request.

MC_BODY: dict[str, Any] = {"messages": [QUESTION]}


def says(text: str, after_s: float = 0.0) -> Behaviour:
    async def reply() -> UpstreamReply:
        await asyncio.sleep(after_s)
        return UpstreamReply({"choices": [{"message": {"content": text}}], "usage": USAGE})

    return reply


def fails(after_s: float = 0.0) -> Behaviour:
    async def reply() -> UpstreamReply:
        await asyncio.sleep(after_s)
        raise UpstreamStatus("boom", status=500)

    return reply


USAGE = {"prompt_tokens": 10, "completion_tokens": 1}
DOUBTFUL = 0.3  # below the threshold, above what the cascade calls broken (0.1)


class Verifier:
    """Accepts an answer only when every sample agrees with its text (else doubts it:
    rejected, not broken); records samples."""

    def __init__(self) -> None:
        self.samples: list[tuple[str, ...]] = []

    def __call__(
        self,
        endpoint: EndpointType,
        body: Any,
        reply: Any,
        samples: Sequence[str] = (),
        code_run: Any = None,
    ) -> float:
        self.samples.append(tuple(samples))
        text = reply["choices"][0]["message"]["content"]
        return 1.0 if samples and all(s == text for s in samples) else DOUBTFUL


class Ledger(list[SpendRecord]):
    def submit(self, record: SpendRecord) -> None:
        self.append(record)


def deployment(name: str, tier: str) -> DeploymentRuntime:
    target = UpstreamTarget(name, "openai", f"{name}-model", "http://unused", None)
    price = TokenPrice(1e-6, 2e-6, "policy")
    return DeploymentRuntime(name, tier, "openai", target, price, 0, 0.0, None)


CHEAP, MID, PREMIUM = deployment("cheap", "a"), deployment("mid", "b"), deployment("premium", "c")
JUDGE = deployment("judge", "a")


async def run_cascade(
    behaviours: dict[str, Behaviour],
    deadline_s: float = 10.0,
    max_escalations: int = 1,
    ledger: Ledger | None = None,
    sla: RouteSla | None = None,
) -> tuple[Any, Ledger, Verifier, ScriptedClient]:
    """Run a cascade over CHEAP, MID, PREMIUM (as many as `max_escalations` allows) with
    JUDGE as second opinion, on a route with `sla`; the result (or the error raised)
    and what it left."""
    metrics, verifier = Metrics(), Verifier()
    ledger = Ledger() if ledger is None else ledger
    client = ScriptedClient(behaviours)
    cascade = Cascade(
        Executor({"openai": client}, metrics), Accountant(ledger, metrics), verifier, metrics
    )
    route = RouteRuntime(
        "careful", "cascade", ("cheap", "mid", "premium"), "premium-model", PREMIUM.price,
        verify_threshold=0.5, max_escalations=max_escalations, second_opinions=(JUDGE,),
        sla=sla,
    )  # fmt: skip
    call = Call(
        "req_1", "team", "key", route, False, time.perf_counter(),
        endpoint="chat", body=MC_BODY, deadline_s=deadline_s,
    )  # fmt: skip
    tiers = [CHEAP, MID, PREMIUM]
    try:
        result: Any = await cascade.run(call, tiers, [JUDGE])
    except GatewayError as error:
        result = error
    return result, ledger, verifier, client


def leftover_tasks() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


def slow_close(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Make closing the opinions slow (a long prompt, counted off the loop); the event
    is set when a close begins."""
    closing = asyncio.Event()
    real = opinions_module.count_unreported

    async def slow(*args: Any, **kwargs: Any) -> None:
        closing.set()
        await asyncio.sleep(0.3)
        await real(*args, **kwargs)

    monkeypatch.setattr(opinions_module, "count_unreported", slow)
    return closing


async def test_a_slow_opinion_is_cancelled_when_every_tier_fails() -> None:
    behaviours = {"cheap": fails(), "mid": fails(), "judge": says("B", 5.0)}
    result, ledger, _, client = await run_cascade(behaviours)
    assert isinstance(result, GatewayError)
    assert sorted(client.calls) == ["cheap", "judge", "mid"]
    # Cut off in flight: charged its prompt, as a losing hedge is.
    [opinion] = ledger
    assert (opinion.record_id, opinion.status, opinion.completion_tokens) == (
        "req_1:o1",
        "partial",
        0,
    )
    assert opinion.prompt_tokens > 0
    assert leftover_tasks() == set()


async def test_each_judged_answer_is_priced_with_its_verdict() -> None:
    result, ledger, _, _ = await run_cascade({"cheap": says("B"), "judge": says("B")})
    assert result.escalations == 0
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].verifier_score == 1.0  # the opinion agreed: kept
    assert by_id["req_1:o1"].verifier_score is None  # an opinion is priced, not judged


async def test_an_answer_judged_later_is_timed_when_it_came() -> None:
    """Its verdict waits for a slow opinion, but its record's latency and time are the
    answer's own, not the wait's."""
    before = time.time()
    result, ledger, _, _ = await run_cascade({"cheap": says("B"), "judge": says("B", 0.4)})
    assert result.escalations == 0
    cheap = next(r for r in ledger if r.record_id == "req_1")
    assert cheap.verifier_score == 1.0
    assert cheap.latency_ms < 200
    assert cheap.ts - before < 0.2


async def test_a_verifier_that_breaks_escalates_and_records_no_verdict() -> None:
    metrics, ledger = Metrics(), Ledger()
    client = ScriptedClient({"cheap": says("B"), "mid": says("B")})

    def broken(*args: Any, **kwargs: Any) -> float:
        raise ValueError("odd text")

    cascade = Cascade(
        Executor({"openai": client}, metrics), Accountant(ledger, metrics), broken, metrics
    )  # type: ignore[arg-type]
    route = RouteRuntime(
        "careful", "cascade", ("cheap", "mid"), "mid-model", MID.price, max_escalations=1
    )
    call = Call(
        "req_1", "team", "key", route, False, time.perf_counter(),
        endpoint="chat", body=MC_BODY, deadline_s=10.0,
    )  # fmt: skip
    result = await cascade.run(call, [CHEAP, MID])
    assert result.escalations == 1  # rejected, not failed
    assert [(r.record_id, r.verifier_score) for r in ledger] == [("req_1", None), ("req_1:1", None)]


async def test_a_request_cancelled_while_its_answer_is_judged_is_still_priced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cheap answer is priced after its verdict, so a request cancelled while the
    verdict waits for a slow opinion must still price it (once, without a verdict)."""
    judging = asyncio.Event()
    real = opinions_module.SecondOpinions.samples

    async def samples(self: Any, *args: Any) -> tuple[str, ...]:
        judging.set()
        return await real(self, *args)

    monkeypatch.setattr(opinions_module.SecondOpinions, "samples", samples)
    ledger = Ledger()
    behaviours = {"cheap": says("B"), "judge": says("B", 5.0)}
    run = asyncio.create_task(run_cascade(behaviours, ledger=ledger))
    await judging.wait()  # the cheap answer is in; its opinion is not
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    by_id = {r.record_id: r for r in ledger}
    assert sorted(by_id) == ["req_1", "req_1:o1"] and len(ledger) == 2  # each once
    assert by_id["req_1"].verifier_score is None and by_id["req_1"].status == "ok"
    assert by_id["req_1:o1"].status == "partial"
    assert leftover_tasks() == set()


async def test_past_a_failing_first_tier_the_next_is_judged_against_the_opinions() -> None:
    behaviours = {"cheap": fails(), "mid": says("B"), "premium": says("B"), "judge": says("B")}
    result, ledger, verifier, client = await run_cascade(behaviours, max_escalations=2)
    assert verifier.samples == [("B",)]  # mid's answer, with the opinion asked beside cheap
    assert result.final.deployment is MID and result.escalations == 1
    assert "premium" not in client.calls
    assert sorted(r.record_id for r in ledger) == ["req_1", "req_1:o1"]  # mid's is the first
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].escalations == 1 and by_id["req_1"].reference_cost_nanos > 0
    assert by_id["req_1:o1"].reference_cost_nanos == 0  # an opinion adds cost only


async def test_opinions_stop_when_only_the_unverified_last_tier_is_left() -> None:
    """Past a failing first tier, the last tier's answer is not judged: the opinion
    still running is cut off then (charged its prompt), not paid for in full while
    the last tier answers."""
    behaviours = {"cheap": fails(), "mid": says("B", 0.3), "judge": says("B", 0.15)}
    result, ledger, verifier, _ = await run_cascade(behaviours)
    assert result.final.deployment is MID and verifier.samples == []
    [opinion] = [r for r in ledger if r.deployment == "judge"]
    assert (opinion.status, opinion.completion_tokens) == ("partial", 0)
    assert leftover_tasks() == set()


async def test_a_request_cancelled_while_its_opinions_close_leaves_none_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closed early (only the unverified last tier left), the opinions' close is cut
    short by a cancellation: the cascade's own close must still cancel and await them."""
    closing = slow_close(monkeypatch)
    ledger = Ledger()
    behaviours = {"cheap": fails(), "mid": says("B"), "judge": says("B", 3.0)}
    run = asyncio.create_task(run_cascade(behaviours, ledger=ledger))
    await closing.wait()  # cheap failed; the opinions are being closed
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert leftover_tasks() == set()
    [opinion] = [r for r in ledger if r.deployment == "judge"]
    assert opinion.status == "partial"  # cut off in flight: its prompt, once


async def test_the_last_tier_is_asked_while_the_opinions_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closing the opinions (counting a long prompt to charge them) runs beside the last
    tier's call, not before it: the client does not wait for the two in turn."""
    events: list[str] = []
    real = opinions_module.count_unreported

    async def slow(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.3)
        await real(*args, **kwargs)
        events.append("opinions closed")

    def mid() -> Awaitable[UpstreamReply]:
        events.append("mid asked")
        return says("B")()

    monkeypatch.setattr(opinions_module, "count_unreported", slow)
    behaviours = {"cheap": fails(), "mid": mid, "judge": says("B", 3.0)}
    result, ledger, _, _ = await run_cascade(behaviours)
    assert result.final.deployment is MID
    assert events == ["mid asked", "opinions closed"]
    [opinion] = [r for r in ledger if r.deployment == "judge"]
    assert opinion.status == "partial"
    assert leftover_tasks() == set()


async def test_a_last_answer_in_while_the_opinions_close_is_priced_if_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last tier answered (paid for) and the opinions are still closing when the
    request is cancelled: the answer is priced all the same, and nothing outlives it."""
    closing = slow_close(monkeypatch)
    ledger = Ledger()
    behaviours = {"cheap": fails(), "mid": says("B"), "judge": says("B", 3.0)}
    run = asyncio.create_task(run_cascade(behaviours, ledger=ledger))
    await closing.wait()
    await eventually_async(lambda: any(r.deployment == "mid" for r in ledger), 5, "mid priced")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    by_id = {r.record_id: r for r in ledger}
    assert sorted(by_id) == ["req_1", "req_1:o1"] and len(ledger) == 2
    assert (by_id["req_1"].deployment, by_id["req_1"].status) == ("mid", "ok")
    assert by_id["req_1:o1"].status == "partial"
    assert leftover_tasks() == set()


async def test_a_failing_close_of_the_opinions_loses_no_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The last tier's answer is paid for: a close that breaks beside it is logged, and
    the answer is still the client's and priced."""
    calls = 0

    async def broken_once(self: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("close broke")
        await real_close(self)

    real_close = opinions_module.SecondOpinions.close
    monkeypatch.setattr(opinions_module.SecondOpinions, "close", broken_once)
    behaviours = {"cheap": fails(), "mid": says("B"), "judge": says("B", 3.0)}
    result, ledger, _, _ = await run_cascade(behaviours)
    assert result.final.deployment is MID
    assert "req_1" in {r.record_id for r in ledger}  # mid's answer, priced
    assert "closing second opinions failed" in caplog.text
    assert leftover_tasks() == set()  # the cascade's own close finished the job


TIMED = RouteSla(None, 10.0, False, "degrade", None, 0, None)


async def test_only_the_answer_the_client_gets_is_judged_against_the_sla() -> None:
    """One verdict per request: the rejected cheap answer is priced, not judged; the
    answer kept is judged on the time the client waited for it."""
    behaviours = {"cheap": says("A"), "mid": says("B", 0.1), "judge": says("B")}
    result, ledger, _, _ = await run_cascade(behaviours, sla=TIMED)
    assert result.escalations == 1
    by_id = {r.record_id: r for r in ledger}
    assert by_id["req_1"].sla_met is None and by_id["req_1:o1"].sla_met is None
    assert by_id["req_1:1"].sla_met is True and by_id["req_1:1"].latency_ms >= 100


async def test_an_answer_kept_after_a_failed_escalation_is_judged_when_delivered() -> None:
    """The escalation fails, so the client gets the rejected answer after all: that
    answer carries the verdict, timed when the client got it (after the failure)."""
    sla = RouteSla(None, 0.25, False, "degrade", None, 0, None)
    behaviours = {"cheap": says("A"), "mid": fails(0.3), "judge": says("B")}
    result, ledger, _, _ = await run_cascade(behaviours, sla=sla)
    assert result.final.deployment is CHEAP
    by_id = {r.record_id: r for r in ledger}
    assert sorted(by_id) == ["req_1", "req_1:o1"]
    assert by_id["req_1"].sla_met is False and by_id["req_1"].latency_ms >= 300
    assert by_id["req_1"].verifier_score == DOUBTFUL  # rejected, and still the answer given


async def test_an_opinion_that_answered_before_every_tier_failed_is_priced() -> None:
    behaviours = {"cheap": fails(0.05), "mid": fails(), "judge": says("B")}
    result, ledger, _, _ = await run_cascade(behaviours)
    assert isinstance(result, GatewayError)
    assert [(r.record_id, r.deployment) for r in ledger] == [("req_1:o1", "judge")]
    assert leftover_tasks() == set()


async def test_an_opinion_later_than_half_the_time_left_counts_as_absent() -> None:
    started = time.monotonic()
    behaviours = {"cheap": says("B"), "judge": says("B", 5.0), "mid": says("B")}
    result, ledger, verifier, _ = await run_cascade(behaviours, deadline_s=1.0)
    assert 0.4 < time.monotonic() - started < 2.5  # waited half of the 1 s, not 5 s
    assert verifier.samples == [()]  # judged without it, so rejected and escalated
    assert result.second_opinions == (0, 0) and result.escalations == 1
    assert sorted((r.record_id, r.status) for r in ledger) == [
        ("req_1", "ok"),
        ("req_1:1", "ok"),
        ("req_1:o1", "partial"),  # cut off: charged its prompt
    ]
    assert result.cost_nanos == sum(r.cost_nanos for r in ledger)
    assert leftover_tasks() == set()


async def test_every_verified_step_is_judged_against_the_same_opinions() -> None:
    behaviours = {"cheap": says("A"), "mid": says("B"), "premium": says("B"), "judge": says("B")}
    result, ledger, verifier, client = await run_cascade(behaviours, max_escalations=2)
    assert verifier.samples == [("B",), ("B",)]  # cheap's "A" rejected, mid's "B" kept
    assert client.calls.count("judge") == 1
    assert result.final.deployment is MID and result.second_opinions == (0, 1)
    assert sorted(r.record_id for r in ledger) == ["req_1", "req_1:1", "req_1:o1"]
    assert result.cost_nanos == sum(r.cost_nanos for r in ledger)


async def test_an_opinion_is_asked_once_without_retries() -> None:
    """A deployment that retries (max_retries 2) gives its opinion in one attempt: a
    failed one is absent, not retried past the cheap answer, and not priced."""
    metrics, ledger, verifier = Metrics(), Ledger(), Verifier()
    client = ScriptedClient({"cheap": says("B"), "mid": says("B"), "judge": fails()})
    cascade = Cascade(
        Executor({"openai": client}, metrics), Accountant(ledger, metrics), verifier, metrics
    )
    retrying = dataclasses.replace(JUDGE, max_retries=2, retry_backoff_s=0.01)
    route = RouteRuntime(
        "careful", "cascade", ("cheap", "mid"), "mid-model", MID.price,
        verify_threshold=0.5, max_escalations=1, second_opinions=(retrying,),
    )  # fmt: skip
    call = Call(
        "req_1", "team", "key", route, False, time.perf_counter(),
        endpoint="chat", body=MC_BODY, deadline_s=10.0,
    )  # fmt: skip
    result = await cascade.run(call, [CHEAP, MID], [retrying])
    assert client.calls.count("judge") == 1
    assert result.second_opinions == (0, 0) and verifier.samples[0] == ()
    assert not any(r.deployment == "judge" for r in ledger)
    assert leftover_tasks() == set()


def test_second_opinions_resolve_to_deployments_and_are_reserved_for() -> None:
    policy = Policy.model_validate(
        {
            "deployments": {
                "cheap": {"model": "s", "api_base": "http://x/v1", "tier": "a"},
                "judge": {"model": "j", "api_base": "http://x/v1", "tier": "a"},
                "premium": {"model": "p", "api_base": "http://x/v1", "tier": "b"},
            },
            "routes": {
                "careful": {
                    "strategy": "cascade",
                    "deployments": ["cheap", "premium"],
                    "second_opinions": ["judge"],
                }
            },
        }
    )
    runtime = build_runtime(LoadedPolicy(policy, (), {}, "digest"))
    route = runtime.routes["careful"]
    assert route.second_opinions == (runtime.deployments["judge"],)
    tiers = [runtime.deployments["cheap"], runtime.deployments["premium"]]
    without = dataclasses.replace(route, second_opinions=())
    price = runtime.deployments["judge"].price.cost_nanos(100, 50)
    worst = worst_case_nanos(tiers, "cascade", route, 100, Output(50, 1), 1)
    assert worst == worst_case_nanos(tiers, "cascade", without, 100, Output(50, 1), 1) + price
    # A plan with no second tier verifies nothing, so it asks no opinion.
    assert worst_case_nanos(tiers[:1], "cascade", route, 100, Output(50, 1), 1) == worst_case_nanos(
        tiers[:1], "cascade", without, 100, Output(50, 1), 1
    )

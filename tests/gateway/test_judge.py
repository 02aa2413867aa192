"""The LLM judge on cascade routes: a `judge` deployment grades the cheap answer (from
its token logprobs, or its text), its grade replaces the verifier's score, and every
call is priced once (`<request id>:j1`). Through the running gateway over real sockets
with fake upstreams; a timeout or an error falls back to the learned verifier."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore, SpendRecord
from gateway.limits.budgets import Output, worst_case_nanos
from gateway.pipeline.judge import RUBRIC_VERSION, grade
from gateway.pipeline.scoring import AnswerVerifier
from gateway.runtime import JUDGE_OVERHEAD_TOKENS, build_runtime
from policies import LoadedPolicy, Policy
from policies.errors import PolicyError
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record

QUESTION = "Write two sentences on why the sky is blue."
ANSWER = (
    "Sunlight scatters off air molecules, and blue light scatters far more than red "
    "because of its shorter wavelength (Rayleigh scattering). So the sky looks blue."
)
POLICY = """
deployments:
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    cascade_logprobs: false     # the verifier then scores the text alone
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  grader:
    api_base: ${JUDGE_URL}
    model: grader-model
    tier: mid
    max_retries: 0
    cascade_logprobs: __LOGPROBS__
    price: {input_per_mtok: 0.5, output_per_mtok: 1.5}
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
    judge: grader
    judge_timeout_ms: 300
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""


class GradingOpenAI(FakeOpenAI):
    """A judge upstream: its first token's `top_logprobs` are `grades` (token ->
    logprob) when the request asks for logprobs, as OpenAI sends them."""

    grades: dict[str, float] = {}

    def _chat_body(self, body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
        reply = super()._chat_body(body, behaviour)
        logprobs = reply["choices"][0]["logprobs"]
        if logprobs and body.get("top_logprobs"):
            first = logprobs["content"][0]
            first["logprob"] = self.grades.get(first["token"], first["logprob"])
            first["top_logprobs"] = [
                {"token": t, "logprob": lp, "bytes": list(t.encode())}
                for t, lp in self.grades.items()
            ]
        return reply


def verifier_score() -> float:
    """The shipped verifier's score of the cheap answer, as the gateway computes it."""
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    reply = {"choices": [{"message": {"content": ANSWER}, "finish_reason": "stop"}]}
    return AnswerVerifier()("chat", body, reply)


def threshold(verifier_keeps: bool) -> float:
    """A threshold at which the verifier alone keeps (or rejects) the cheap answer."""
    score = verifier_score()
    assert 0.02 < score < 0.98, score  # room on both sides
    return round(score - 0.01 if verifier_keeps else score + 0.01, 4)


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        fake.reply_text = "Rayleigh scattering: shorter wavelengths scatter more."
        yield fake


@pytest.fixture
def grader() -> Iterator[GradingOpenAI]:
    with GradingOpenAI() as fake:
        yield fake


@pytest.fixture
def start(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    grader: GradingOpenAI,
) -> Callable[..., str]:
    """start(verifier_keeps=..., logprobs=...) -> the base URL of a gateway whose cheap
    tier answers ANSWER."""
    fake_openai.reply_text = ANSWER

    def run(*, verifier_keeps: bool, logprobs: bool = True) -> str:
        policy = POLICY.replace("__THRESHOLD__", str(threshold(verifier_keeps)))
        policy = policy.replace("__LOGPROBS__", "true" if logprobs else "false")
        env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url, "JUDGE_URL": grader.url}
        return start_gateway(policy, **env).url

    return run


def ask(base: str) -> httpx.Response:
    body = {"model": "careful", "messages": [{"role": "user", "content": QUESTION}]}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


def judged(base: str, outcome: str) -> float:
    line = f'cascade_judge_calls_total{{outcome="{outcome}",route="careful"}}'
    text = httpx.get(f"{base}/metrics").text
    return sum(float(row.split()[-1]) for row in text.splitlines() if row.startswith(line))


async def records_of(store: RedisStore, request_id: str) -> dict[str, SpendRecord]:
    return {r.record_id: r for r in await store.events() if r.request_id == request_id}


def assert_priced(response: httpx.Response, records: dict[str, SpendRecord]) -> None:
    total = sum(r.cost_nanos for r in records.values())
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(total / 1e9)


async def test_a_good_answer_graded_high_by_logprobs_stays(
    start: Callable[..., str],
    grader: GradingOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """The verifier alone would escalate; the judge's high grade keeps the answer."""
    grader.reply_text = "8"
    grader.grades = {"8": math.log(0.6), "9": math.log(0.3), "7": math.log(0.1)}
    base = start(verifier_keeps=False)
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-escalations"] == "0"
    assert response.headers["x-cascade-judge"] == f"{(8.2 - 1) / 8:.3f}"
    assert premium.requests == []
    asked = grader.requests[-1]["body"]
    assert asked["model"] == "grader-model" and asked["max_tokens"] == 1
    assert asked["logprobs"] is True and asked["top_logprobs"] == 10
    assert RUBRIC_VERSION and ANSWER in asked["messages"][-1]["content"]
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    judge = await wait_for_record(ledger_store, f"{request_id}:j1")
    assert cheap.verifier_score == pytest.approx((8.2 - 1) / 8)  # E[grade] 8.2, normalised
    assert (judge.deployment, judge.status, judge.sla_met) == ("grader", "ok", None)
    assert judge.cost_nanos > 0
    records = await records_of(ledger_store, request_id)
    assert set(records) == {request_id, f"{request_id}:j1"}
    assert_priced(response, records)
    assert judged(base, "ok") == 1


async def test_a_poor_answer_graded_low_by_text_escalates_and_each_call_is_priced_once(
    start: Callable[..., str],
    grader: GradingOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """The verifier alone would keep it; the judge's grade 2, read from its text (a
    deployment that returns no logprobs), sends it to the premium tier."""
    grader.reply_text = "2"
    base = start(verifier_keeps=True, logprobs=False)
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.headers["x-cascade-judge"] == f"{(2 - 1) / 8:.3f}"
    assert len(grader.requests) == 1  # the last tier's answer is not judged
    asked = grader.requests[-1]["body"]
    assert "logprobs" not in asked and "top_logprobs" not in asked
    request_id = response.headers["x-request-id"]
    await wait_for_record(ledger_store, f"{request_id}:j1")
    await wait_for_record(ledger_store, f"{request_id}:1")
    records = await records_of(ledger_store, request_id)
    by_id = {rid: r.deployment for rid, r in records.items()}
    assert by_id == {
        request_id: "cheap",
        f"{request_id}:1": "premium",
        f"{request_id}:j1": "grader",
    }
    assert records[request_id].verifier_score == pytest.approx(1 / 8)
    assert_priced(response, records)
    assert judged(base, "ok") == 1


def test_an_answer_the_judge_grades_wrong_is_still_delivered_when_escalating_fails(
    start: Callable[..., str], grader: GradingOpenAI, premium: FakeOpenAI
) -> None:
    """Graded 1 ("wrong"): doubtful, not broken (it has text, and no format it
    breaks), so when the premium tier fails the client reads it, marked rejected."""
    grader.reply_text = "1"
    premium.fail(500, times=None)
    response = ask(start(verifier_keeps=True, logprobs=False))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == ANSWER
    assert response.headers["x-cascade-judge"] == f"{0:.3f}"
    assert response.headers["x-cascade-verdict"] == "rejected"


async def test_a_judge_timing_out_falls_back_to_the_verifier_within_the_deadline(
    start: Callable[..., str],
    grader: GradingOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """judge_timeout_ms 300, the judge takes 3 s: the verifier's score decides (it
    keeps the answer), and the judge's prompt, which it had, is priced `partial`."""
    grader.reply_text, grader.delay_s = "1", 3.0
    base = start(verifier_keeps=True)
    started = time.monotonic()
    response = ask(base)
    assert time.monotonic() - started < 2.0
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert premium.requests == []
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    judge = await wait_for_record(ledger_store, f"{request_id}:j1")
    assert cheap.verifier_score == pytest.approx(verifier_score(), abs=1e-6)
    assert judge.status == "partial" and judge.completion_tokens == 0
    assert_priced(response, await records_of(ledger_store, request_id))
    assert judged(base, "fallback_timeout") == 1


@pytest.mark.parametrize(("fault", "outcome"), [("500", "fallback_error"), ("words", "unparsed")])
async def test_a_failing_or_gradeless_judge_falls_back_to_the_verifier(
    start: Callable[..., str],
    grader: GradingOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
    fault: str,
    outcome: str,
) -> None:
    """A 500 is not priced; a reply with no grade is (it was paid for)."""
    if fault == "500":
        grader.fail(500, times=None)
    else:
        grader.reply_text = "Excellent"
    base = start(verifier_keeps=False, logprobs=False)
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"  # as the verifier decides
    request_id = response.headers["x-request-id"]
    await wait_for_record(ledger_store, f"{request_id}:1")
    if fault == "words":
        await wait_for_record(ledger_store, f"{request_id}:j1")
    records = await records_of(ledger_store, request_id)
    assert (f"{request_id}:j1" in records) == (fault == "words")
    assert records[request_id].verifier_score == pytest.approx(verifier_score(), abs=1e-6)
    assert_priced(response, records)
    assert judged(base, outcome) == 1


async def test_a_judge_ejected_by_its_breaker_is_not_called(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    grader: GradingOpenAI,
) -> None:
    """Two failures eject the judge; the third request's answer is left to the
    verifier without a call to it (the cooldown outlasts the test)."""
    fake_openai.reply_text = ANSWER
    grader.fail(500, times=None)
    policy = POLICY.replace("__THRESHOLD__", str(threshold(False))).replace("__LOGPROBS__", "false")
    policy += "gateway:\n  circuit_breaker: {failure_threshold: 2, cooldown_s: 600}\n"
    env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url, "JUDGE_URL": grader.url}
    base = start_gateway(policy, **env).url
    for _ in range(2):
        assert ask(base).headers["x-cascade-deployment"] == "premium"
    assert len(grader.requests) == 2
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"  # as the verifier decides
    assert len(grader.requests) == 2  # ejected: not asked
    assert judged(base, "fallback_error") == 3


def test_grades_from_logprobs_and_text() -> None:
    def reply(text: str, first: dict[str, Any] | None = None) -> dict[str, Any]:
        logprobs = {"content": [first]} if first else None
        return {"choices": [{"message": {"content": text}, "logprobs": logprobs}]}

    alternatives = [{"token": "9", "logprob": math.log(0.5)}, {"token": "No", "logprob": -1}]
    first = {"token": "1", "logprob": math.log(0.5), "top_logprobs": alternatives}
    score, source = grade(reply("1", first)) or (None, None)
    assert score == pytest.approx(0.5) and source == "logprobs"  # E[grade] = 5
    assert grade(reply("Grade: 7")) == (0.75, "text")
    assert grade(reply("10")) is None and grade(reply("fine")) is None
    no_grade = {"token": "Good", "logprob": -0.1, "top_logprobs": []}
    assert grade(reply("Good 3", no_grade)) == (0.25, "text")  # logprobs without a grade
    # Words first, a little mass on digits among the alternatives: no grade from them.
    stray = [{"token": "2", "logprob": math.log(0.02)}, {"token": "9", "logprob": math.log(0.01)}]
    words = {"token": "Excellent", "logprob": math.log(0.97), "top_logprobs": stray}
    assert grade(reply("Excellent", words)) is None


def policy(**route: Any) -> Policy:
    return Policy.model_validate(
        {
            "deployments": {
                "cheap": {"model": "s", "api_base": "http://x/v1", "tier": "a"},
                "grader": {"model": "j", "api_base": "http://x/v1", "tier": "b"},
                "premium": {"model": "p", "api_base": "http://x/v1", "tier": "c"},
            },
            "routes": {"careful": {"deployments": ["cheap", "grader", "premium"], **route}},
        }
    )


def test_the_judge_resolves_and_is_reserved_for_each_verified_answer() -> None:
    runtime = build_runtime(LoadedPolicy(policy(strategy="cascade", judge="grader"), (), {}, "d"))
    route = runtime.routes["careful"]
    grader = runtime.deployments["grader"]
    assert route.judge == grader and route.judge_timeout_s == 3.0
    tiers = [runtime.deployments[name] for name in ("cheap", "grader", "premium")]
    without = dataclasses.replace(route, judge=None)
    out = Output(50, 1)
    grade_cost = grader.price.cost_nanos(100 + 50 + JUDGE_OVERHEAD_TOKENS, 1)
    worst = worst_case_nanos(tiers, "cascade", route, 100, out, 1)
    # Three tiers: two verified answers, each graded.
    assert worst == worst_case_nanos(tiers, "cascade", without, 100, out, 1) + 2 * grade_cost
    one_tier = worst_case_nanos(tiers[:1], "cascade", route, 100, out, 1)
    assert one_tier == worst_case_nanos(tiers[:1], "cascade", without, 100, out, 1)


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"strategy": "fallback", "judge": "grader"}, "judge applies to strategy 'cascade'"),
        ({"strategy": "cascade", "judge": "gradr"}, "judge of route 'careful'"),
        ({"strategy": "cascade", "judge": "grader", "judge_timeout_ms": 0}, "judge_timeout_ms"),
    ],
)
def test_the_judge_is_validated(route: dict[str, Any], message: str) -> None:
    with pytest.raises((PolicyError, ValueError), match=message):
        policy(**route)

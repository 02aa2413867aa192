"""A long prompt is counted once per request and encoding, off the event loop, when an
upstream reports no usage: a reply or a stream without usage, a losing hedge, a cascade
tier, a second opinion cut off. Through the real gateway over loopback (a spy on the
tokenizer tells where each count ran), then the cascade in-process, cancelled while its
count runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.billing import tokens
from gateway.billing.pricing import TokenPrice
from gateway.ledger import RedisStore, SpendRecord
from gateway.metrics import Metrics
from gateway.pipeline.accounting import Accountant
from gateway.pipeline.cascade import Cascade
from gateway.pipeline.executor import Executor
from gateway.request import Call
from gateway.runtime import DeploymentRuntime, RouteRuntime
from gateway.upstreams.base import UpstreamReply, UpstreamTarget
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, CLIENT_KEY, StartGateway, wait_for_record
from tests.gateway.multiple_choice import QUESTION
from tests.gateway.scripted import ScriptedClient
from tests.support import eventually_async

LIMITED_KEY = "fake-limited-key"
REPORT = "a long pasted report. " * 5_000  # over THREADED_PROMPT_CHARS
LONG = [{"role": "user", "content": REPORT}]
# A multiple-choice question (so second opinions are asked) after a long system prompt.
LONG_QUESTION = [{"role": "system", "content": REPORT}, QUESTION]
COUNT = tokens.count_prompt  # the real one, before the spy replaces it

POLICY = """
deployments:
  a:
    api_base: ${FIRST_URL}
    model: first-model
    tier: gpu
    max_retries: 0
    price: {input_per_mtok: 1, output_per_mtok: 2}
  b:
    api_base: ${SECOND_URL}
    model: ${SECOND_MODEL:-second-model}
    tier: gpu
    max_retries: 0
    price: {input_per_mtok: 1, output_per_mtok: 2}
  premium:
    api_base: ${SECOND_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
routes:
  plain: {strategy: fixed, deployments: [a]}
  hedged:
    strategy: fallback
    deployments: [a, b]
    sla: {ttft_ms: 400, p99_ms: 2000, hedge_after_ms: 150, load_aware: false}
  careful:
    strategy: cascade
    deployments: [a, premium]
    verify_threshold: 0     # the first answer is kept, once its opinion is in or cut off
    max_escalations: 1
    second_opinions: [b]
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
  limited: {secret: "${LIMITED_KEY}", rate_limit: {tokens_per_minute: 100000000}}
gateway:
  request_timeout_s: 2      # an opinion gets half of it
"""


@dataclass(frozen=True)
class Counted:
    chars: int
    on_loop: bool  # counted on a thread running an event loop


def on_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[Counted]:
    """Every count of a long prompt from now on, and where it ran."""
    seen: list[Counted] = []

    def spy(model: str, endpoint: str, body: Any) -> int:
        chars = tokens._prompt_chars(endpoint, body)
        if chars > tokens.THREADED_PROMPT_CHARS:
            seen.append(Counted(chars, on_a_loop()))
        return COUNT(model, endpoint, body)

    monkeypatch.setattr(tokens, "count_prompt", spy)
    return seen


@pytest.fixture
def second() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def start(start_gateway: StartGateway, fake_openai: FakeOpenAI, second: FakeOpenAI) -> Any:
    def run(**env: str) -> str:
        urls = {"FIRST_URL": fake_openai.url, "SECOND_URL": second.url}
        return start_gateway(POLICY, LIMITED_KEY=LIMITED_KEY, **urls, **env).url

    return run


def post(base: str, route: str, messages: Any, key: str = CLIENT_KEY) -> httpx.Response:
    body = {"model": route, "messages": messages}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=30)


def assert_counted_exactly(record: SpendRecord, model: str, messages: Any) -> None:
    assert record.usage_source == "counted"
    assert record.prompt_tokens == COUNT(model, "chat", {"messages": messages})


@pytest.mark.parametrize("key", [CLIENT_KEY, LIMITED_KEY], ids=["unlimited", "limited"])
async def test_a_reply_without_usage_has_its_long_prompt_counted_off_the_loop(
    start: Any,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    counted: list[Counted],
    key: str,
) -> None:
    """Limited, the admission's count is the one priced: still one count."""
    base = start()
    fake_openai.omit_usage = True
    response = post(base, "plain", LONG, key)
    assert response.status_code == 200
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert_counted_exactly(record, "first-model", LONG)
    assert record.completion_tokens > 0
    assert counted == [Counted(len(REPORT), on_loop=False)]


async def test_a_stream_without_usage_has_its_long_prompt_counted_off_the_loop(
    start: Any, fake_openai: FakeOpenAI, ledger_store: RedisStore, counted: list[Counted]
) -> None:
    base = start()
    fake_openai.omit_usage = True
    body = {"model": "plain", "messages": LONG, "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.read().endswith(b"data: [DONE]\n\n")
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert_counted_exactly(record, "first-model", LONG)
    assert record.status == "ok" and record.completion_tokens > 0
    assert counted == [Counted(len(REPORT), on_loop=False)]


async def test_a_losing_hedge_is_charged_its_long_prompt_counted_off_the_loop(
    start: Any,
    fake_openai: FakeOpenAI,
    second: FakeOpenAI,
    ledger_store: RedisStore,
    counted: list[Counted],
) -> None:
    """The loser and the winner (no usage either) share one count: one encoding."""
    base = start()
    fake_openai.delay_s = 2.0  # a is late: the hedge on b wins
    second.omit_usage = True
    response = post(base, "hedged", LONG)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "b"
    request_id = response.headers["x-request-id"]
    loser = await wait_for_record(ledger_store, f"{request_id}:h1")
    winner = await wait_for_record(ledger_store, request_id)
    assert (loser.deployment, loser.status, loser.completion_tokens) == ("a", "partial", 0)
    assert_counted_exactly(loser, "first-model", LONG)
    assert_counted_exactly(winner, "second-model", LONG)
    assert counted == [Counted(len(REPORT), on_loop=False)]


@pytest.mark.parametrize(
    ("judge_model", "counts"),
    [("second-model", 1), ("gpt-4o-mini", 2)],
    ids=["same-encoding", "other-encoding"],
)
async def test_a_cascade_tier_and_a_cut_off_opinion_are_counted_off_the_loop(
    start: Any,
    fake_openai: FakeOpenAI,
    second: FakeOpenAI,
    ledger_store: RedisStore,
    counted: list[Counted],
    judge_model: str,
    counts: int,
) -> None:
    """The cheap tier answers without usage; its opinion is cut off and charged its
    prompt, counted again only when its model uses another encoding (o200k_base)."""
    base = start(SECOND_MODEL=judge_model)
    fake_openai.omit_usage = True
    fake_openai.reply_text = "B"
    second.delay_s = 5.0  # later than the second it may take
    response = post(base, "careful", LONG_QUESTION)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "a"
    assert response.headers["x-cascade-second-opinions"] == "0/0"
    request_id = response.headers["x-request-id"]
    tier = await wait_for_record(ledger_store, request_id)
    opinion = await wait_for_record(ledger_store, f"{request_id}:o1")
    assert_counted_exactly(tier, "first-model", LONG_QUESTION)
    assert (opinion.status, opinion.completion_tokens) == ("partial", 0)
    assert_counted_exactly(opinion, judge_model, LONG_QUESTION)
    chars = tokens._prompt_chars("chat", {"messages": LONG_QUESTION})
    assert counted == [Counted(chars, on_loop=False)] * counts


# The cascade in-process: cancelled while the prompt is counted off the loop, its
# answer is still priced once, exactly (counted then on the loop).


class Ledger(list[SpendRecord]):
    def submit(self, record: SpendRecord) -> None:
        self.append(record)


def cheap_deployment() -> DeploymentRuntime:
    target = UpstreamTarget("cheap", "openai", "cheap-model", "http://unused", None)
    price = TokenPrice(1e-6, 2e-6, "policy")
    return DeploymentRuntime("cheap", "a", "openai", target, price, 0, 0.0, None)


async def answers_without_usage() -> UpstreamReply:
    return UpstreamReply({"choices": [{"message": {"content": "B"}}]})


async def test_a_cascade_cancelled_while_counting_prices_its_answer_once(
    monkeypatch: pytest.MonkeyPatch, counted: list[Counted]
) -> None:
    spy = tokens.count_prompt
    counting = threading.Event()

    def slow_off_the_loop(model: str, endpoint: str, body: Any) -> int:
        if not on_a_loop():
            counting.set()
            time.sleep(0.5)
        return spy(model, endpoint, body)

    monkeypatch.setattr(tokens, "count_prompt", slow_off_the_loop)
    metrics, ledger, cheap = Metrics(), Ledger(), cheap_deployment()
    client = ScriptedClient({"cheap": answers_without_usage})
    cascade = Cascade(
        Executor({"openai": client}, metrics), Accountant(ledger, metrics), None, metrics
    )  # type: ignore[arg-type]  # one tier: nothing is verified
    route = RouteRuntime("careful", "cascade", ("cheap",), "cheap-model", cheap.price)
    call = Call(
        "req_1", "team", "key", route, False, time.perf_counter(),
        endpoint="chat", body={"messages": LONG}, deadline_s=10.0,
    )  # fmt: skip
    run = asyncio.create_task(cascade.run(call, [cheap]))
    await eventually_async(counting.is_set, 5, "the prompt counted in a worker thread")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    [record] = ledger
    assert record.record_id == "req_1"
    assert_counted_exactly(record, "cheap-model", LONG)
    await eventually_async(lambda: len(counted) == 2, 5, "the abandoned count to end")
    assert sorted(counted, key=lambda c: c.on_loop) == [
        Counted(len(REPORT), on_loop=False),
        Counted(len(REPORT), on_loop=True),  # the fallback, once cancelled
    ]


async def test_a_prompt_is_counted_once_per_encoding() -> None:
    prompt, body = tokens.PromptCounts(), {"messages": LONG}
    assert await prompt.count("gpt-4o", "chat", body) == COUNT("gpt-4o", "chat", body)
    await prompt.prepare(["gpt-4o-mini", "gpt-4.1", "big-model"], "chat", body)
    assert prompt.get("gpt-4.1", "chat", {}) == COUNT("gpt-4o", "chat", body)  # known
    assert prompt.get("other-model", "chat", {}) == COUNT("big-model", "chat", body)

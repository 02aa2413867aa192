"""A cascade does not escalate an answer that the request's own token limit cut: with
`max_tokens: 1` (classification) every tier is sent the same limit and would answer as
short, billed twice. An answer cut sooner by a deployment's own `max_output_tokens`
(lower than the client's) still counts as truncated, and escalates. The rest of the
verifier's judgement stands either way.

Through the real gateway over loopback, the OpenAI-style fakes as the tiers, the
shipped verifier judging; the ledger on real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.scoring import AnswerVerifier, reached_request_limit
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record

POLICY = """
deployments:
  cheap:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  cheap-capped:
    api_base: ${CHEAP_URL}
    model: small-model
    tier: local-small
    max_output_tokens: 1
    price: {input_per_mtok: 0.1, output_per_mtok: 0.1}
  premium:
    api_base: ${PREMIUM_URL}
    model: big-model
    tier: premium
    price: {input_per_mtok: 5, output_per_mtok: 15}
routes:
  careful:
    strategy: cascade
    deployments: [cheap, premium]
    verify_threshold: 0.5
    max_escalations: 1
  capped:
    strategy: cascade
    deployments: [cheap-capped, premium]
    verify_threshold: 0.5
    max_escalations: 1
keys:
  k: {secret: "${GATEWAY_TEST_KEY}"}
"""
QUESTION = (
    "Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nC) nitrogen\nD) helium\n"
    "Answer with the letter."
)
ANSWER = "B) carbon dioxide"  # cut to its first word, "B)", by a limit of 1 token


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI) -> str:
    fake_openai.reply_text = premium.reply_text = ANSWER
    return start_gateway(POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url


def ask(base: str, route: str, **extra: Any) -> httpx.Response:
    body = {"model": route, "messages": [{"role": "user", "content": QUESTION}], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_an_answer_cut_by_the_clients_own_limit_is_kept(
    base: str, premium: FakeOpenAI, ledger_store: RedisStore, field: str
) -> None:
    response = ask(base, "careful", **{field: 1})
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("B)", "length")
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-escalations"] == "0"
    assert premium.requests == []  # not billed twice for the same one-token answer
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.verifier_score is not None and record.verifier_score >= 0.5


def test_an_answer_cut_by_the_deployments_lower_cap_escalates(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """The client allowed 20 tokens; the cheap deployment's `max_output_tokens: 1` cut
    its answer: the premium tier, without that cap, may answer in full."""
    response = ask(base, "capped", max_tokens=20)
    assert response.status_code == 200
    assert fake_openai.requests[-1]["body"]["max_tokens"] == 1  # the deployment's cap
    assert response.headers["x-cascade-deployment"] == "premium"
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.json()["choices"][0]["message"]["content"] == ANSWER


def test_the_rest_of_the_verdict_stands(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """A refusal cut by the client's limit is still a refusal."""
    fake_openai.reply_text = "I am sorry, I cannot help with that request."
    response = ask(base, "careful", max_tokens=6)
    assert response.headers["x-cascade-escalations"] == "1"
    assert len(premium.requests) == 1


def cut_reply(completion_tokens: int | None) -> dict[str, Any]:
    reply: dict[str, Any] = {
        "choices": [{"message": {"role": "assistant", "content": "B)"}, "finish_reason": "length"}]
    }
    if completion_tokens is not None:
        reply["usage"] = {"prompt_tokens": 30, "completion_tokens": completion_tokens}
    return reply


@pytest.mark.parametrize(
    ("body", "completion_tokens", "reached"),
    [
        ({"max_tokens": 1}, 1, True),
        ({"max_completion_tokens": 4, "max_tokens": 9}, 4, True),  # OpenAI reads the first
        ({"max_tokens": 20}, 1, False),  # cut sooner: a deployment's cap, the context
        ({}, 4096, False),  # no limit of the request's
        ({"max_tokens": 1}, None, False),  # no usage: not known, judged as before
        ({"max_tokens": 2, "n": 2}, 3, False),  # not every answer reached it
        ({"max_tokens": 2, "n": 2}, 4, True),
    ],
)
def test_reached_request_limit(
    body: dict[str, Any], completion_tokens: int | None, reached: bool
) -> None:
    assert reached_request_limit("chat", body, cut_reply(completion_tokens)) is reached


def test_only_the_length_cap_is_lifted() -> None:
    """The answer is judged as one that stopped: the verifier's other signals apply."""
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 1}
    stopped = cut_reply(1)
    stopped["choices"][0]["finish_reason"] = "stop"
    verifier = AnswerVerifier()
    assert verifier("chat", body, cut_reply(1)) == verifier("chat", body, stopped) > 0.5
    assert verifier("chat", {**body, "max_tokens": 20}, cut_reply(1)) <= 0.3

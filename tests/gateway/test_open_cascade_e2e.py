"""Open-ended chat through the running gateway, judged by the shipped verifier's
open-ended model: a good cheap answer stays on the cheap tier; a refusal, a truncated
answer or one that barely answers escalates to the premium fake; every call is priced
in the ledger (Redis)."""

from __future__ import annotations

import httpx
import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.scoring import AnswerVerifier
from router import sandbox, verifier_code
from router.open_verifier import judges
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import route_policy
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.support import requires

QUESTION = {
    "role": "user",
    "content": "Explain the difference between a process and a thread in an operating "
    "system, with an example of when to use each.",
}
GOOD = """A **process** is an independent program in execution: it has its own address \
space, file handles and resources, and the operating system isolates it from other \
processes. A **thread** is a unit of execution inside a process: threads of one process \
share its memory and resources, but each has its own stack and registers.

Key differences:

1. **Memory**: processes do not share memory by default; threads do.
2. **Cost**: creating and switching processes costs more than threads.
3. **Isolation**: a crash in one process does not bring down another; a crashing thread \
can take down its whole process.
4. **Communication**: processes talk through pipes, sockets or shared memory; threads \
read and write shared variables (with locks).

When to use each:

- Use **processes** when you need isolation or several CPU cores from a language with \
a global interpreter lock, e.g. a web server that runs each worker as a separate process \
so one crash does not affect the others.
- Use **threads** for concurrent work that shares a lot of state and mostly waits on \
I/O, e.g. a desktop application that downloads files in a background thread while the \
user interface stays responsive.

In short, processes give isolation at a higher cost, and threads give cheap concurrency \
with shared memory."""
POOR = {
    "refusal": "I'm sorry, but I can't help with that.",
    "truncated": GOOD[:700],
    "curt": "They are different.",
}
PREMIUM = "A process owns its memory; threads share their process's memory. " + GOOD


def score(answer: str) -> float:
    body = {"messages": [QUESTION]}
    return AnswerVerifier()("chat", body, {"choices": [{"message": {"content": answer}}]})


def threshold() -> float:
    """Halfway between the good answer's score and the best poor one's."""
    good, poor = score(GOOD), max(map(score, POOR.values()))
    assert good > poor + 0.05, (good, poor)
    return (good + poor) / 2


def test_the_open_ended_model_judges_this_question() -> None:
    assert judges(QUESTION["content"])


@pytest.mark.parametrize("kind", ["good", *POOR])
async def test_chat_answers_stay_or_escalate_and_each_is_priced(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore, kind: str
) -> None:
    with FakeOpenAI() as premium:
        fake_openai.reply_text = GOOD if kind == "good" else POOR[kind]
        premium.reply_text = PREMIUM
        policy = route_policy(threshold(), run_code=False)
        base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
        body = {"model": "careful", "messages": [QUESTION]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        cheap = await wait_for_record(ledger_store, request_id)
        assert cheap.deployment == "cheap" and cheap.cost_nanos > 0
        assert cheap.verifier_score is not None
        if kind == "good":
            assert response.headers["x-cascade-deployment"] == "cheap"
            assert response.headers["x-cascade-escalations"] == "0"
            assert premium.requests == []
            assert await ledger_store.get(f"{request_id}:1") is None
            total = cheap.cost_nanos
        else:
            assert response.headers["x-cascade-deployment"] == "premium"
            assert response.headers["x-cascade-escalations"] == "1"
            assert response.json()["choices"][0]["message"]["content"] == PREMIUM
            escalated = await wait_for_record(ledger_store, f"{request_id}:1")
            assert escalated.deployment == "premium" and escalated.cost_nanos > cheap.cost_nanos
            total = cheap.cost_nanos + escalated.cost_nanos
        assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(total / 1e9)


CODE_QUESTION = {
    "role": "user",
    "content": "Write a python function to check whether a string is a palindrome.\n"
    "Your code should pass these tests:\n"
    "assert is_palindrome('abba') == True\n"
    "assert is_palindrome('abc') == False\n"
    "assert is_palindrome('') == True",
}
# Alike to the eye; the second drops the last character before comparing: 'abc' fails.
PASSES = "```python\ndef is_palindrome(s):\n    return s == s[::-1]\n```"
FAILS = "```python\ndef is_palindrome(s):\n    return s[:-1] == s[-2::-1]\n```"


@requires(sandbox.available(), "the sandbox")
@pytest.mark.parametrize("passes", [True, False], ids=["passes", "fails"])
async def test_code_answers_run_against_the_prompts_tests(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, ledger_store: RedisStore, passes: bool
) -> None:
    with FakeOpenAI() as premium:
        fake_openai.reply_text, premium.reply_text = (PASSES if passes else FAILS), PASSES
        policy = route_policy(0.5, run_code=True)
        base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
        body = {"model": "careful", "messages": [CODE_QUESTION]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        cheap = await wait_for_record(ledger_store, request_id)
        assert cheap.deployment == "cheap" and cheap.verifier_score is not None
        if passes:
            assert response.headers["x-cascade-escalations"] == "0"
            assert cheap.verifier_score >= verifier_code.TESTS_HELD_FLOOR
            assert premium.requests == []
        else:
            assert response.headers["x-cascade-escalations"] == "1"
            assert cheap.verifier_score <= verifier_code.TESTS_FAILED_CAP
            escalated = await wait_for_record(ledger_store, f"{request_id}:1")
            assert escalated.deployment == "premium" and escalated.cost_nanos > 0

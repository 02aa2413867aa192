"""Cascades through the running gateway: the cheap tier answers first, the shipped
verifier judges the answer, and a rejected answer escalates to the next tier. Every
answer is priced in the ledger, the rejected ones too."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import date
from typing import Any

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.scoring import AnswerVerifier
from gateway.runtime import build_runtime, returns_logprobs
from policies import DEFAULT_POLICY_PATH, load_policy
from policies.schema import Deployment
from tests.fakes.anthropic_upstream import FakeAnthropic
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import GOOD, POLICY, QUESTION, REFUSAL
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def base(start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI) -> str:
    fake_openai.reply_text, premium.reply_text = GOOD, GOOD
    return start_gateway(POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url


def ask(base: str, **extra: Any) -> httpx.Response:
    body = {"model": "careful", "messages": [QUESTION], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)


async def test_a_good_cheap_answer_is_kept(
    base: str, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-escalations"] == "0"
    assert response.headers["x-cascade-attempts"] == "1"
    assert response.headers["x-cascade-verdict"] == "accepted"
    assert premium.requests == []
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.tier == "local-small"
    assert record.verifier_score is not None and record.verifier_score >= 0.5  # kept


async def test_a_rejected_answer_escalates_and_both_are_priced(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    fake_openai.reply_text = REFUSAL
    response = ask(base)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == GOOD
    assert response.headers["x-cascade-deployment"] == "premium"
    assert response.headers["x-cascade-tier"] == "premium"
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.headers["x-cascade-attempts"] == "2"  # both tiers' calls
    assert response.headers["x-cascade-verdict"] == "unjudged"  # the last tier's
    assert len(fake_openai.requests) == len(premium.requests) == 1
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    escalated = await wait_for_record(ledger_store, f"{request_id}:1")
    assert (cheap.deployment, escalated.deployment) == ("cheap", "premium")
    assert escalated.escalations == 1
    # One request, priced once on the reference model (its first answer's tokens):
    # the escalation adds cost, not another counterfactual.
    assert cheap.reference_cost_nanos > 0 and escalated.reference_cost_nanos == 0
    total = cheap.cost_nanos + escalated.cost_nanos
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(total / 1e9)
    # The verifier judged one answer (the refusal, capped at 0.2): counted under 0.2.
    metrics = httpx.get(f"{base}/metrics").text
    assert 'cascade_verifier_score_count{route="careful"} 1.0' in metrics
    assert 'cascade_verifier_score_bucket{le="0.2",route="careful"} 1.0' in metrics
    # The ledger keeps each answer's verdict: the refusal's, none for the last tier's.
    assert cheap.verifier_score is not None and cheap.verifier_score <= 0.2
    assert escalated.verifier_score is None
    # By deployment: the request counts at its first answer; both were called once.
    day = date.fromisoformat(cheap.day)
    rows = await ledger_store.aggregate(day, day, ["deployment"])
    assert [(r.group["deployment"], r.requests, r.calls) for r in rows] == [
        ("cheap", 1, 1),
        ("premium", 0, 1),
    ]


def test_invalid_json_in_json_mode_escalates(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    fake_openai.reply_text = "Sure! The name is Bob and he is 30."
    premium.reply_text = '{"name": "Bob", "age": 30}'
    response = ask(base, response_format={"type": "json_object"})
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.json()["choices"][0]["message"]["content"] == premium.reply_text


def test_streams_are_verified_whole_then_sent(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    fake_openai.reply_text = REFUSAL
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={
            "model": "careful",
            "messages": [QUESTION],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        headers=AUTH,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-cascade-escalations"] == "1"
        assert response.headers["x-cascade-attempts"] == "2"
        body = response.read().decode()
    assert body.endswith("data: [DONE]\n\n")
    assert GOOD in body and REFUSAL not in body
    assert '"usage"' in body
    assert "stream" not in fake_openai.requests[-1]["body"]  # asked whole, to verify it


def test_escalation_failure_answers_with_the_cheap_answer(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    fake_openai.reply_text = REFUSAL
    premium.fail(500, times=None)
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert response.headers["x-cascade-verdict"] == "rejected"  # and the client is told
    calls = len(fake_openai.requests) + len(premium.requests)
    assert int(response.headers["x-cascade-attempts"]) == calls >= 2
    assert response.json()["choices"][0]["message"]["content"] == REFUSAL


@pytest.mark.parametrize("text", ["", "Sure! The name is Bob."], ids=["empty", "not-json"])
async def test_an_unusable_answer_is_not_delivered_when_its_escalation_fails(
    base: str,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
    text: str,
) -> None:
    """Broken, not doubtful (empty; JSON mode answered in prose): the client gets the
    escalation's error, which its SDK can retry, rather than an answer that breaks its
    parser. The request is recorded as the error it got; the broken answer is priced
    all the same, apart (`:r0`), with no reference to count as savings."""
    fake_openai.reply_text = text
    premium.fail(503, times=None)
    response = ask(base, response_format={"type": "json_object"})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"]
    calls = len(fake_openai.requests) + len(premium.requests)
    assert response.headers["x-cascade-attempts"] == str(calls)  # both tiers' calls
    request_id = response.headers["x-request-id"]
    request = await wait_for_record(ledger_store, request_id)
    assert (request.status, request.cost_nanos, request.reference_cost_nanos) == ("error", 0, 0)
    broken = await wait_for_record(ledger_store, f"{request_id}:r0")
    assert (broken.deployment, broken.status, broken.reference_cost_nanos) == ("cheap", "ok", 0)
    assert broken.cost_nanos > 0 and broken.verifier_score is not None


def test_a_refusal_kept_after_a_failed_escalation_is_delivered_whatever_its_score(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """Doubtful, however low the verifier scores it (a refusal, under 0.1 without
    logprobs): a text the client can read beats an error."""
    fake_openai.reply_text = REFUSAL
    premium.fail(503, times=None)
    response = ask(base, logprobs=False)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == REFUSAL
    assert response.headers["x-cascade-verdict"] == "rejected"


async def test_a_cheap_tier_that_fails_escalates_to_the_next(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI, ledger_store: RedisStore
) -> None:
    """A tier that cannot answer (its deployments fail) counts as rejected: the next
    tier answers, and only that answer is priced (the failed tier sent none), as the
    request's first answer (`<request id>`: it counts the request and its reference)."""
    fake_openai.fail(503, times=None)
    response = ask(base)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "premium"
    assert response.headers["x-cascade-escalations"] == "1"
    # Every call counts, the failed tier's (and its retries) too.
    calls = len(fake_openai.requests) + len(premium.requests)
    assert int(response.headers["x-cascade-attempts"]) == calls >= 2
    assert response.json()["choices"][0]["message"]["content"] == GOOD
    request_id = response.headers["x-request-id"]
    answer = await wait_for_record(ledger_store, request_id)
    assert (answer.deployment, answer.escalations) == ("premium", 1)
    assert answer.reference_cost_nanos == answer.cost_nanos  # premium is the reference
    assert await ledger_store.get(f"{request_id}:1") is None
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(answer.cost_nanos / 1e9)


def test_an_error_after_every_tier_failed_counts_every_tiers_calls(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """Both tiers fail: the error names every call made (not the last tier's alone), so
    the SDKs are told not to retry a climb that already asked both tiers."""
    policy = POLICY.replace("tier: local-small", "tier: local-small\n    max_retries: 0")
    policy = policy.replace("tier: premium", "tier: premium\n    max_retries: 0")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    fake_openai.fail(500, times=None)
    premium.fail(500, times=None)
    response = ask(base)
    assert response.status_code == 502
    assert response.headers["x-cascade-attempts"] == "2"
    assert len(fake_openai.requests) == len(premium.requests) == 1
    assert response.headers["x-should-retry"] == "false"


def test_a_request_the_cheap_tier_rejects_is_not_escalated(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """An upstream 400 is the request's fault, which every tier would answer alike."""
    fake_openai.fail(400, times=None)
    response = ask(base)
    assert response.status_code == 400
    assert premium.requests == []


# A buffered cascade answer is streamed as OpenAI would have streamed it: the SDK's
# stream readers work on it unchanged.
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def sdk(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=AUTH["authorization"][7:], max_retries=0)


def test_a_streamed_cascade_tool_call_is_numbered_as_streams_are(base: str) -> None:
    with sdk(base).chat.completions.stream(
        model="careful", messages=[QUESTION], tools=[TOOL], tool_choice="required"
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments), dict)


def test_a_streamed_cascade_text_completion_carries_its_text(base: str) -> None:
    chunks = list(sdk(base).completions.create(model="careful", prompt="2 + 2 =", stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == GOOD
    assert {c.object for c in chunks} == {"text_completion"}
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_embeddings_on_a_cascade_route_ask_the_cheapest_tier_only(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """A vector has nothing to verify: the tiers are tried in order, as a fallback."""
    raw = sdk(base).embeddings.with_raw_response.create(model="careful", input="hello")
    assert raw.parse().data[0].embedding
    assert raw.headers["x-cascade-deployment"] == "cheap"
    assert raw.headers["x-cascade-escalations"] == "0"
    assert premium.requests == [] and len(fake_openai.requests) == 1


# Cascades ask the cheap tier for token logprobs (the verifier reads them) and hand the
# client its answer as if they had never been asked for.
UNSURE = -6.0  # every token under 1% likely: the verifier rejects even GOOD over it


def test_the_cheap_tier_is_asked_for_logprobs_and_the_verifier_reads_them(
    base: str, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    fake_openai.logprob = UNSURE
    response = ask(base)
    assert fake_openai.requests[-1]["body"]["logprobs"] is True
    assert "logprobs" not in premium.requests[-1]["body"]  # the last tier is not verified
    assert response.headers["x-cascade-escalations"] == "1"  # GOOD alone would be kept


async def test_logprobs_the_client_did_not_ask_for_are_not_returned(
    base: str, fake_openai: FakeOpenAI, ledger_store: RedisStore
) -> None:
    response = ask(base)
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert fake_openai.requests[-1]["body"]["logprobs"] is True
    reply = response.json()
    assert reply["choices"][0]["logprobs"] is None
    assert reply["choices"][0]["message"]["content"] == GOOD
    # Priced as without logprobs: the upstream's usage, at the cheap tier's price.
    assert reply["usage"]["completion_tokens"] == len(GOOD.split())
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.completion_tokens == len(GOOD.split())


def test_a_streamed_cascade_answer_carries_no_unasked_logprobs(
    base: str, fake_openai: FakeOpenAI
) -> None:
    body = {"model": "careful", "messages": [QUESTION], "stream": True}
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        text = response.read().decode()
    assert fake_openai.requests[-1]["body"]["logprobs"] is True
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert GOOD in text and "logprob" not in text


def test_logprobs_the_client_asked_for_pass_through(base: str, fake_openai: FakeOpenAI) -> None:
    reply = ask(base, logprobs=True, top_logprobs=2).json()
    sent = fake_openai.requests[-1]["body"]
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    tokens = reply["choices"][0]["logprobs"]["content"]
    assert "".join(t["token"] for t in tokens) == GOOD
    with httpx.stream(
        "POST",
        f"{base}/v1/chat/completions",
        json={"model": "careful", "messages": [QUESTION], "stream": True, "logprobs": True},
        headers=AUTH,
        timeout=30,
    ) as response:
        assert '"logprob":-0.25' in response.read().decode()


def test_an_anthropic_tier_is_not_asked_for_logprobs(
    start_gateway: StartGateway, fake_anthropic: FakeAnthropic, premium: FakeOpenAI
) -> None:
    policy = POLICY.replace(
        "    api_base: ${CHEAP_URL}\n    model: small-model",
        "    provider: anthropic\n    api_base: ${CHEAP_URL}\n    api_key: ${CHEAP_KEY}\n"
        "    model: claude-haiku-4-5",
    )
    fake_anthropic.reply_text = GOOD
    server = start_gateway(
        policy,
        CHEAP_URL=fake_anthropic.url,
        CHEAP_KEY=fake_anthropic.api_key,
        PREMIUM_URL=premium.url,
    )
    # litellm refuses parameters the provider lacks: asked for logprobs, this would fail.
    response = ask(server.url)
    assert response.status_code == 200
    assert response.headers["x-cascade-deployment"] == "cheap"
    assert "logprobs" not in fake_anthropic.requests[-1]["body"]
    assert response.json()["choices"][0]["logprobs"] is None


def test_only_openai_compatible_upstreams_return_logprobs() -> None:
    deployments = build_runtime(load_policy(DEFAULT_POLICY_PATH, env={})).deployments
    returns = {name: d.returns_logprobs for name, d in deployments.items()}
    assert returns == {
        "local-cpu": False,  # the embedded CPU engine refuses `logprobs`
        "openai-gpt-4o-mini": True,
        "openai-gpt-4o": True,
        "anthropic-claude-sonnet": False,
    }
    # OpenAI's reasoning models answer `logprobs` with a 400: never asked.
    assert not returns_logprobs(Deployment(model="o3-mini"), {})
    assert returns_logprobs(Deployment(model="meta-llama/Llama-3.1-8B-Instruct"), {})
    # The policy overrides the guess both ways (a server that rejects the field).
    llama = "meta-llama/Llama-3.1-8B-Instruct"
    assert not returns_logprobs(Deployment(model=llama, cascade_logprobs=False), {})
    assert returns_logprobs(Deployment(model="o3-mini", cascade_logprobs=True), {})


def test_decisions_are_logged_when_asked(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CASCADE_LOG_DECISIONS=true: one line for the plan and one for the cascade's
    verdict, under the request's id; off (the default), nothing."""
    fake_openai.reply_text, premium.reply_text = REFUSAL, GOOD
    env = {"CHEAP_URL": fake_openai.url, "PREMIUM_URL": premium.url}
    base = start_gateway(POLICY, CASCADE_LOG_DECISIONS="true", **env).url
    with caplog.at_level(logging.INFO, logger="gateway.decisions"):
        response = ask(base)
    request_id = response.headers["x-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.decisions"]
    assert len(lines) == 2 and all(line.startswith(request_id) for line in lines)
    assert "route 'careful' uses strategy 'cascade'" in lines[0]
    assert "try 'cheap' (tier local-small)" in lines[0]
    assert re.search(r"verifier scores 0\.\d{3} against 0\.5; 1 escalation\(s\)", lines[1])
    assert "answered by 'premium' (tier premium)" in lines[1]

    logging.getLogger("gateway.decisions").setLevel(logging.WARNING)  # as by default
    caplog.clear()
    ask(base)
    assert not [r for r in caplog.records if r.name == "gateway.decisions"]


# A question, then a right and a wrong answer to it that only the verifier's checks of the
# answer tell apart (the weights are retrained now and then: the order is what counts).
PAIRS = {
    # "15 floors * 8 units/floor = 130" is checked as the step 15 * 8 = 130.
    "units": (
        "A building has 15 floors with 8 units on each floor. How many units does it have?",
        "15 floors * 8 units/floor = 120 units.\n#### 120",
        "15 floors * 8 units/floor = 130 units.\n#### 130",
    ),
    # "4 feet + 3 inches = 51 inches" is no wrong step (its sum is in two units): before,
    # it was flagged and scored below the real wrong step.
    "two units": (
        "Xavier is 4 feet tall and grows 3 inches this year. How many inches tall is he?",
        "4 feet + 3 inches = 51 inches.\n#### 51",
        "4 * 12 = 46 inches, 46 + 3 = 49 inches.\n#### 49",
    ),
    # Asked for a function, no language named: JavaScript in an untagged fence writes no
    # Python function.
    "no function": (
        "Write a function to reverse the words of a sentence.",
        "```python\ndef reverse_words(sentence):\n    return ' '.join(sentence.split()[::-1])\n```",
        "```\nfunction reverseWords(sentence) {\n"
        "  return sentence.split(' ').reverse().join(' ');\n}\n```",
    ),
    # A placeholder where the function should be (capped, `code_stub`).
    "stub": (
        "Write a python function to reverse the words of a sentence.",
        "```python\ndef reverse_words(sentence):\n    return ' '.join(sentence.split()[::-1])\n```",
        "```python\ndef reverse_words(sentence):\n    # split, reverse, join\n    pass\n```",
    ),
    # A constant returned under a TODO: it type-checks and is still no answer.
    "todo stub": (
        "Write a python function to reverse the words of a sentence.",
        "```python\ndef reverse_words(sentence):\n    return ' '.join(sentence.split()[::-1])\n```",
        "```python\ndef reverse_words(sentence):\n    # TODO: split, reverse, join\n"
        "    return ''\n```",
    ),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
@pytest.mark.parametrize("wrong", [False, True], ids=["right", "wrong"])
async def test_the_right_answer_is_kept_and_the_wrong_one_escalates(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
    case: str,
    wrong: bool,
) -> None:
    """The cheap tier answers right or wrong, the route's threshold lies between the
    shipped verifier's scores of the two, and only the wrong answer goes on to the
    premium tier (which answers right); the ledger prices each answer."""
    text, right_answer, wrong_answer = PAIRS[case]
    question = {"role": "user", "content": text}
    verify, body = AnswerVerifier(), {"messages": [question]}
    right, low = (
        verify("chat", body, {"choices": [{"message": {"content": answer}}]})
        for answer in (right_answer, wrong_answer)
    )
    assert low < right - 0.05, (low, right)
    policy = POLICY.replace(
        "verify_threshold: 0.5", f"verify_threshold: {(right + low) / 2:.4f}"
    ).replace(  # judged on the text alone, as the pair was (the fake's logprobs move both)
        "tier: local-small", "tier: local-small\n    cascade_logprobs: false", 1
    )
    fake_openai.reply_text = wrong_answer if wrong else right_answer
    premium.reply_text = right_answer
    url = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    body = {"model": "careful", "messages": [question]}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200
    assert response.headers["x-cascade-escalations"] == ("1" if wrong else "0")
    assert response.json()["choices"][0]["message"]["content"] == right_answer
    request_id = response.headers["x-request-id"]
    first = await wait_for_record(ledger_store, request_id)
    assert first.deployment == "cheap" and first.verifier_score is not None
    if wrong:
        assert (await wait_for_record(ledger_store, f"{request_id}:1")).deployment == "premium"


def test_code_in_the_language_asked_for_is_kept(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """ "Write a C function" names a language: C code is no "function asked for and none
    written in Python" (before that was heard, this right answer scored 0.10 and went on)."""
    fake_openai.reply_text = (
        "```c\nvoid reverse(char *s) {\n  int n = strlen(s);\n"
        "  for (int i = 0; i < n / 2; i++) {\n"
        "    char t = s[i]; s[i] = s[n - 1 - i]; s[n - 1 - i] = t;\n  }\n}\n```"
    )
    base = start_gateway(POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    question = {"role": "user", "content": "Write a C function to reverse a string in place."}
    body = {"model": "careful", "messages": [question]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200
    assert response.headers["x-cascade-escalations"] == "0"
    assert response.json()["choices"][0]["message"]["content"] == fake_openai.reply_text
    assert premium.requests == []


async def test_a_cascaded_request_is_judged_against_its_sla_once(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """SLA attainment counts requests: the rejected cheap answer is priced but not
    judged; the answer the client got is."""
    timed = POLICY.replace("max_escalations: 1", "max_escalations: 1\n    sla: {timeout_ms: 30000}")
    fake_openai.reply_text, premium.reply_text = REFUSAL, GOOD
    base = start_gateway(timed, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    response = ask(base)
    assert response.headers["x-cascade-escalations"] == "1"
    request_id = response.headers["x-request-id"]
    cheap = await wait_for_record(ledger_store, request_id)
    escalated = await wait_for_record(ledger_store, f"{request_id}:1")
    assert (cheap.sla_met, escalated.sla_met) == (None, True)
    metrics = httpx.get(f"{base}/metrics").text
    assert 'cascade_sla_requests_total{outcome="met",route="careful"} 1.0' in metrics

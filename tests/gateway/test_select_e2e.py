"""The `select` strategy through the running gateway, over real sockets, with five fake
upstreams at different prices standing in for five models: each request goes to the
cheapest candidate whose predicted quality meets the route's target, priced, with the
prediction and the target in its ledger record; a verified selection escalates a
rejected answer to the next candidate predicted to do better, and what it learns from
the rejections moves later requests off the deployment that failed them, on every
gateway sharing its Redis."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from gateway.cli import select_choice
from gateway.ledger import RedisStore
from gateway.pipeline.scoring import AnswerVerifier
from gateway.pipeline.selector import MAX_SHIFT
from gateway.pipeline.shared_profiles import profile_key
from gateway.runtime import build_runtime
from policies import load_policy
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record
from tests.gateway.select_fleet import PICK, PRICES, policy
from tests.support import eventually

PROMPTS = [
    "hi",
    "Which of these is a mammal? A) shark B) dolphin C) trout D) eel. Answer with the letter.",
    "Write a python function to find the longest palindromic substring of a string.",
    "Prove rigorously that there are infinitely many primes p such that p + 2 is prime.",
    "Translate 'good morning' into French.",
]
GREETING = "Hello! How can I help you today?"
REFUSAL = "I'm sorry, but I can't help with that."


@pytest.fixture
def fakes() -> Iterator[dict[str, FakeOpenAI]]:
    with contextlib.ExitStack() as stack:
        started = {name: stack.enter_context(FakeOpenAI()) for name in PRICES}
        for name, fake in started.items():
            fake.reply_text = f"An answer from {name}."
        yield started


def start(start_gateway: StartGateway, fakes: dict[str, FakeOpenAI], route: str) -> str:
    env = {f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    return start_gateway(policy(route), **env).url


def ask(base: str, route: str, prompt: str) -> httpx.Response:
    body = {"model": route, "messages": [{"role": "user", "content": prompt}]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response


async def test_each_request_goes_to_the_cheapest_candidate_predicted_good_enough(
    start_gateway: StartGateway,
    fakes: dict[str, FakeOpenAI],
    ledger_store: RedisStore,
    tmp_path: Path,
) -> None:
    base = start(start_gateway, fakes, PICK)
    (tmp_path / "explain.yaml").write_text(policy(PICK))
    runtime = build_runtime(load_policy(tmp_path / "explain.yaml"))
    route = runtime.routes["pick"]
    chosen = []
    for prompt in PROMPTS:
        choice = select_choice(runtime, route, {"messages": [{"role": "user", "content": prompt}]})
        assert choice.meets(choice.chosen)  # the reference itself always qualifies
        cheaper = [n for n, e in choice.estimates.items() if PRICES[n] < PRICES[choice.chosen]]
        assert not any(choice.meets(n) for n in cheaper)  # nothing cheaper is good enough
        response = ask(base, "pick", prompt)
        assert response.headers["x-cascade-deployment"] == choice.chosen
        assert response.json()["choices"][0]["message"]["content"] == (
            f"An answer from {choice.chosen}."
        )
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        estimate = choice.estimates[choice.chosen]
        assert record.predicted_quality == pytest.approx(estimate.quality, abs=1e-4)
        assert record.quality_target == pytest.approx(choice.target, abs=1e-4)
        inp, out = PRICES[choice.chosen]
        usage = response.json()["usage"]
        expected = usage["prompt_tokens"] * inp + usage["completion_tokens"] * out
        assert record.cost_nanos == round(expected * 1e3)  # per Mtok -> nanos per token
        assert record.reference_cost_nanos > record.cost_nanos or choice.chosen == "gpt4"
        chosen.append(choice.chosen)
    # The fleet is used, not one model: different prompts, different choices.
    assert len(set(chosen)) >= 2, chosen
    assert sum(len(f.requests) for f in fakes.values()) == len(PROMPTS)
    metrics = httpx.get(f"{base}/metrics").text
    for name in set(chosen):
        line = f'cascade_select_choices_total{{deployment="{name}",met="true",route="pick"}}'
        assert f"{line} {float(chosen.count(name))}" in metrics


def verified_route(threshold: float) -> str:
    return f"""  careful:
    strategy: select
    deployments: [gpt4, gpt35, yi, mixtral, mistral]
    reference_model: gpt4
    quality_target: 0.5
    verify: true
    verify_threshold: {threshold}
    max_escalations: 1
    explore: 0"""


def verifier_score(answer: str) -> float:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    reply = {"choices": [{"message": {"content": answer}, "finish_reason": "stop"}]}
    return AnswerVerifier()("chat", body, reply)


async def test_a_verified_selection_escalates_and_learns_from_rejections(
    start_gateway: StartGateway, fakes: dict[str, FakeOpenAI], ledger_store: RedisStore
) -> None:
    """The cheapest candidate refuses: each refusal is rejected and escalated to the
    next candidate predicted to do better (both priced), and the rejections lower its
    predicted quality until requests no longer start there."""
    good, poor = verifier_score(GREETING), verifier_score(REFUSAL)
    assert good > poor, (good, poor)
    for fake in fakes.values():
        fake.reply_text = GREETING
    fakes["mistral"].reply_text = REFUSAL
    server = start_gateway(
        policy(verified_route(round((good + poor) / 2, 4))),
        **{f"{name.upper()}_URL": fake.url for name, fake in fakes.items()},
    )
    traffic = server.services.proxy.selector.traffic
    first = ask(server.url, "careful", "hi")
    request_id = first.headers["x-request-id"]
    assert first.headers["x-cascade-escalations"] == "1"
    climbed_to = first.headers["x-cascade-deployment"]
    assert climbed_to != "mistral" and first.json()["choices"][0]["message"]["content"] == GREETING
    rejected = await wait_for_record(ledger_store, request_id)
    answered = await wait_for_record(ledger_store, f"{request_id}:1")
    assert (rejected.deployment, answered.deployment) == ("mistral", climbed_to)
    assert rejected.cost_nanos > 0 and answered.cost_nanos > 0
    assert rejected.verifier_score == pytest.approx(poor, abs=1e-4)
    assert answered.predicted_quality is not None and rejected.predicted_quality is not None
    assert answered.predicted_quality > rejected.predicted_quality  # a higher bar
    assert float(first.headers["x-cascade-cost-usd"]) == pytest.approx(
        (rejected.cost_nanos + answered.cost_nanos) / 1e9
    )
    assert traffic.offset("mistral") < 0
    # Each refusal lowers mistral's prediction; within the bound it stops being chosen.
    asked_mistral = len(fakes["mistral"].requests)
    for _ in range(12):
        if ask(server.url, "careful", "hi").headers["x-cascade-escalations"] == "0":
            break
        asked_mistral = len(fakes["mistral"].requests)
    else:
        pytest.fail(f"still starting at mistral after 12 refusals ({traffic.offset('mistral')})")
    assert -MAX_SHIFT <= traffic.offset("mistral") < 0
    gauge = f'cascade_select_quality_offset{{deployment="mistral"}} {traffic.offset("mistral")}'
    assert gauge in httpx.get(f"{server.url}/metrics").text
    assert traffic.observations("mistral") == asked_mistral
    ask(server.url, "careful", "hi")
    assert len(fakes["mistral"].requests) == asked_mistral  # no longer asked


async def test_the_candidate_predicted_best_is_judged_and_learned_down_when_it_fails(
    start_gateway: StartGateway, fakes: dict[str, FakeOpenAI], ledger_store: RedisStore
) -> None:
    """With a target only gpt4 meets, nothing is predicted better to escalate to: its
    answer is delivered, but judged all the same, so its refusals lower its offset
    (a review found a model gone bad at the top of the chain was never caught)."""
    good, poor = verifier_score(GREETING), verifier_score(REFUSAL)
    for fake in fakes.values():
        fake.reply_text = GREETING
    fakes["gpt4"].reply_text = REFUSAL
    route = verified_route(round((good + poor) / 2, 4)).replace(
        "quality_target: 0.5", "quality_target: 1.0"
    )
    server = start_gateway(
        policy(route), **{f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    )
    traffic = server.services.proxy.selector.traffic
    response = ask(server.url, "careful", "hi")
    assert response.headers["x-cascade-deployment"] == "gpt4"
    assert response.headers["x-cascade-escalations"] == "0"  # delivered: nowhere to go
    assert response.headers["x-cascade-verdict"] == "rejected"  # and the client is told
    record = await wait_for_record(ledger_store, response.headers["x-request-id"])
    assert record.verifier_score == pytest.approx(poor, abs=1e-4)
    assert traffic.offset("gpt4") < 0 and traffic.observations("gpt4") == 1


async def test_a_candidate_lowered_by_traffic_earns_its_place_back_by_exploring(
    start_gateway: StartGateway, fakes: dict[str, FakeOpenAI]
) -> None:
    """mistral refuses and is learned under the target; fixed, it is tried first again
    on the route's `explore` share (every request here), passes, and climbs back."""
    good, poor = verifier_score(GREETING), verifier_score(REFUSAL)
    for fake in fakes.values():
        fake.reply_text = GREETING
    fakes["mistral"].reply_text = REFUSAL
    route = verified_route(round((good + poor) / 2, 4)).replace("explore: 0", "explore: 1.0")
    server = start_gateway(
        policy(route), **{f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    )
    traffic = server.services.proxy.selector.traffic
    for _ in range(4):
        refused = ask(server.url, "careful", "hi")
        assert refused.headers["x-cascade-deployment"] != "mistral"  # rejected: climbed
    lowered = traffic.offset("mistral")
    assert lowered < 0
    fakes["mistral"].reply_text = GREETING
    answered = ask(server.url, "careful", "hi")
    assert answered.headers["x-cascade-deployment"] == "mistral"  # explored, accepted
    assert answered.headers["x-cascade-escalations"] == "0"
    assert traffic.offset("mistral") > lowered


def test_what_one_gateway_learned_moves_the_others_through_redis(
    start_gateway: StartGateway, fakes: dict[str, FakeOpenAI]
) -> None:
    """Two replicas on one Redis: the first learns that mistral refuses; the second,
    which never asked mistral, adopts the offset at its next poll and starts elsewhere,
    as does a replica started afterwards (a restart keeps what was learned)."""
    good, poor = verifier_score(GREETING), verifier_score(REFUSAL)
    for fake in fakes.values():
        fake.reply_text = GREETING
    fakes["mistral"].reply_text = REFUSAL
    careful = policy(verified_route(round((good + poor) / 2, 4)))
    env = {f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    first, second = start_gateway(careful, **env), start_gateway(careful, **env)
    learned, pupil = first.services.proxy.selector.traffic, second.services.proxy.selector.traffic
    for _ in range(12):
        if ask(first.url, "careful", "hi").headers["x-cascade-escalations"] == "0":
            break
    else:
        pytest.fail(f"the first gateway still starts at mistral ({learned.offset('mistral')})")
    asked_mistral = len(fakes["mistral"].requests)
    eventually(
        lambda: pupil.observations("mistral") == learned.observations("mistral") == asked_mistral,
        3,
        "the second gateway's poll",
    )
    offset = learned.offset("mistral")
    assert -MAX_SHIFT <= offset < 0 and pupil.offset("mistral") == offset
    gauge = f'cascade_select_quality_offset{{deployment="mistral"}} {offset}'
    assert gauge in httpx.get(f"{second.url}/metrics").text
    third = start_gateway(careful, **env)
    restarted = third.services.proxy.selector.traffic
    eventually(lambda: restarted.offset("mistral") == offset, 3, "a new gateway's first poll")
    for base in (second.url, third.url):
        response = ask(base, "careful", "hi")
        assert response.headers["x-cascade-escalations"] == "0"
        assert response.headers["x-cascade-deployment"] != "mistral"
    assert len(fakes["mistral"].requests) == asked_mistral  # neither asked it


MIXTRAL = "mistralai/mixtral-8x7b-chat"


async def lift(client: aioredis.Redis, prefix: str, deployment: str, profile: str) -> None:
    """What 30 accepted answers would have taught the fleet of `deployment`: the bound."""
    key = profile_key(prefix, deployment)
    await client.hset(key, mapping={"offset": MAX_SHIFT, "observations": 30, "profile": profile})


async def test_a_cheap_model_learned_above_the_rest_still_escalates_its_rejections(
    start_gateway: StartGateway,
    fakes: dict[str, FakeOpenAI],
    ledger_store: RedisStore,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """mixtral's learned offset puts it above gpt4 on "hi" (0.675 + 0.25 > 0.731): no
    candidate is predicted better, yet its refusal is rejected and climbs to gpt4, the
    predictor's best and the reference (a review found it delivered, 0 escalations)."""
    good, poor = verifier_score(GREETING), verifier_score(REFUSAL)
    for fake in fakes.values():
        fake.reply_text = GREETING
    fakes["mixtral"].reply_text = REFUSAL
    await lift(ledger_store.client, redis_prefix, "mixtral", MIXTRAL)
    route = verified_route(round((good + poor) / 2, 4)).replace("0.5\n", "0.95\n", 1)
    env = {f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    server = start_gateway(policy(route), CASCADE_LOG_DECISIONS="true", **env)
    traffic = server.services.proxy.selector.traffic
    eventually(lambda: traffic.offset("mixtral") == MAX_SHIFT, 3, "the gateway's poll")
    with caplog.at_level(logging.INFO, logger="gateway.decisions"):
        response = ask(server.url, "careful", "hi")
    assert response.headers["x-cascade-escalations"] == "1"
    assert response.headers["x-cascade-deployment"] == "gpt4"
    assert response.json()["choices"][0]["message"]["content"] == GREETING
    request_id = response.headers["x-request-id"]
    rejected = await wait_for_record(ledger_store, request_id)
    assert rejected.deployment == "mixtral"
    assert rejected.verifier_score == pytest.approx(poor, abs=1e-4)
    assert rejected.predicted_quality == pytest.approx(1.0, abs=0.1)  # lifted over gpt4's
    # The decisions log shows the score of each answer of the climb, the last one too.
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.decisions"]
    verdict = next(line for line in lines if "verifier scores" in line)
    assert re.search(r"select: verifier scores 'mixtral' 0\.\d{3}, 'gpt4' [01]\.\d{3} ", verdict)


async def test_the_decisions_log_says_why_an_ejected_choice_was_skipped(
    start_gateway: StartGateway,
    fakes: dict[str, FakeOpenAI],
    ledger_store: RedisStore,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {f"{name.upper()}_URL": fake.url for name, fake in fakes.items()}
    server = start_gateway(policy(PICK), CASCADE_LOG_DECISIONS="true", **env)
    first = ask(server.url, "pick", PROMPTS[1]).headers["x-cascade-deployment"]
    until = time.time() + 60
    client = ledger_store.client
    await client.set(f"{redis_prefix}{{breaker}}:{first}", f"{until:.3f}", px=60_000)
    breakers = server.services.guard.breakers
    eventually(lambda: breakers.is_ejected(first), 3, "the breakers' poll")
    with caplog.at_level(logging.INFO, logger="gateway.decisions"):
        response = ask(server.url, "pick", PROMPTS[1])
    assert response.headers["x-cascade-deployment"] != first
    request_id = response.headers["x-request-id"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(request_id)]
    assert f"candidate '{first}'" in lines[0]  # the plan's choice, before the breakers
    assert f"skip '{first}': ejected by its circuit breaker" in lines[1]
    assert f"left: '{response.headers['x-cascade-deployment']}'" in lines[1]

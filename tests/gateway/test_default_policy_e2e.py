"""The embedded default policy end to end: `auto` is a cascade across the local tier,
gpt-4o-mini and the premium tier. Without keys it serves locally; with keys, answers the
verifier rejects climb, each priced, and the savings show in `/v1/spend`. Embeddings go
to the engine's MiniLM.

The local engine and OpenAI are fakes speaking the wire protocol (LOCAL_ENGINE_URL,
OPENAI_BASE_URL), or the real CPU engine for embeddings. Answers are scripted to be
clearly good or clearly bad (a refusal, which the verifier caps), so these tests hold
whatever the verifier's exact scores are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.ledger import RedisStore
from policies import DEFAULT_POLICY_PATH
from router.embeddings import missing
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI
from tests.gateway.conftest import ADMIN_KEY, StartGateway, wait_for_record
from tests.support import requires

HARD = {
    "role": "user",
    "content": "Prove that there are infinitely many primes p with p = 3 (mod 4), step by step.",
}
REFUSAL = "I am sorry, I cannot help with that."
PROOF = (
    "Suppose only finitely many exist: p1, ..., pk. Let N = 4 p1 ... pk - 1. N is 3 mod 4, "
    "so some prime factor q of N is 3 mod 4, yet no pi divides N. Contradiction."
)


@pytest.fixture
def paid() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def start(start_gateway: StartGateway, local: FakeOpenAI, **env: str) -> str:
    local.reply_text = REFUSAL  # the tiny demo model's fluent nonsense, at its clearest
    return start_gateway(
        DEFAULT_POLICY_PATH,
        LOCAL_ENGINE_URL=local.url,
        LOCAL_ENGINE_AUTOSTART="false",
        **env,
    ).url


def chat(base: str, **extra: Any) -> httpx.Response:
    body = {"model": "auto", "messages": [HARD], **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)


def test_without_keys_the_local_tier_answers(
    start_gateway: StartGateway, fake_openai: FakeOpenAI
) -> None:
    response = chat(start(start_gateway, fake_openai))
    assert response.status_code == 200, response.text
    assert response.headers["x-cascade-deployment"] == "local-cpu"
    assert response.headers["x-cascade-escalations"] == "0"  # nothing to climb to
    assert response.json()["choices"][0]["message"]["content"] == REFUSAL


async def test_with_keys_a_rejected_answer_climbs_to_the_premium_tier_and_is_priced(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    paid: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    # First, keyless: a long local answer, kept (one tier, nothing to verify it against).
    keyless = start(start_gateway, fake_openai)
    fake_openai.reply_text = " ".join([PROOF] * 8)
    local = chat(keyless)
    assert local.headers["x-cascade-deployment"] == "local-cpu"
    await wait_for_record(ledger_store, local.headers["x-request-id"])

    # Then with OPENAI_API_KEY: the local nonsense and the mini's refusal are rejected.
    base = start(
        start_gateway, fake_openai, OPENAI_API_KEY="fake-openai-key", OPENAI_BASE_URL=paid.url
    )
    paid.script(Behaviour(reply_text=REFUSAL), Behaviour(reply_text=PROOF))
    response = chat(base)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == PROOF
    assert response.headers["x-cascade-deployment"] == "openai-gpt-4o"
    assert response.headers["x-cascade-tier"] == "premium"
    assert response.headers["x-cascade-escalations"] == "2"
    assert [r["body"]["model"] for r in paid.requests] == ["gpt-4o-mini", "gpt-4o"]
    request_id = response.headers["x-request-id"]
    records = [
        await wait_for_record(ledger_store, rid)
        for rid in (request_id, f"{request_id}:1", f"{request_id}:2")
    ]
    assert [r.deployment for r in records] == ["local-cpu", "openai-gpt-4o-mini", "openai-gpt-4o"]
    assert all(r.cost_nanos > 0 for r in records)  # every answer priced, the rejected ones too
    assert records[2].cost_nanos > records[1].cost_nanos  # gpt-4o costs more than its mini
    cost = sum(r.cost_nanos for r in records)
    assert float(response.headers["x-cascade-cost-usd"]) == pytest.approx(cost / 1e9)

    # The spend API: each request's reference cost (gpt-4o) beside what was paid.
    spend = httpx.get(
        f"{base}/v1/spend",
        params={"group_by": "route"},
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )
    assert spend.status_code == 200, spend.text
    [row] = spend.json()["data"]
    assert row["route"] == "auto" and row["requests"] == 2
    assert row["reference_cost_usd"] > row["cost_usd"] > 0
    assert row["savings_usd"] == pytest.approx(row["reference_cost_usd"] - row["cost_usd"])
    assert row["savings_pct"] > 0 and row["calls"] == 4  # 2 requests, 4 answers paid for


def test_with_a_key_embeddings_skip_the_paid_chat_models(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, paid: FakeOpenAI
) -> None:
    base = start(
        start_gateway, fake_openai, OPENAI_API_KEY="fake-openai-key", OPENAI_BASE_URL=paid.url
    )
    fake_openai.fail(503, times=None)  # the local tier down: nothing else serves embeddings
    body = {"model": "auto", "input": "hello"}
    response = httpx.post(f"{base}/v1/embeddings", json=body, timeout=30)
    assert response.status_code >= 500
    assert paid.requests == []  # gpt-4o and its mini are chat models


@requires(missing(), "prompt embeddings")
def test_embeddings_on_the_defaults_come_from_the_engines_minilm(
    start_gateway: StartGateway,
) -> None:
    from local_engine.cpu.app import EngineService, create_app
    from local_engine.cpu.engine import Engine, EngineOptions
    from local_engine.cpu.metrics import EngineMetrics
    from local_engine.cpu.runner import EngineRunner
    from tests.local_engine.loopback_server import Server
    from tests.local_engine.tiny_models import TOKENIZER, target

    options = EngineOptions(max_num_seqs=2, max_model_len=128, num_speculative_tokens=0)
    metrics = EngineMetrics("local-tiny")
    engine = Engine(target(), TOKENIZER, options=options, metrics=metrics)
    service = EngineService(EngineRunner(engine), TOKENIZER, metrics, "local-tiny")
    with Server(create_app(service)) as server:
        base = start_gateway(
            DEFAULT_POLICY_PATH,
            LOCAL_ENGINE_URL=f"{server.url}/v1",
            LOCAL_ENGINE_AUTOSTART="false",
        ).url
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        reply = client.embeddings.create(model="auto", input=["one sentence", "another"])
        assert [len(item.embedding) for item in reply.data] == [384, 384]
        assert reply.model == "all-MiniLM-L6-v2"

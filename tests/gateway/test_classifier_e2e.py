"""Classifier routing through the running gateway with the shipped classifier: easy
prompts stay on the cheap tier, hard ones go to the premium tier, and the ledger
records the tier each was priced at."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.scoring import RequestScorer
from router import embedding_classifier, embeddings
from router.errors import RoutingError
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.classifier_policy import POLICY
from tests.gateway.conftest import AUTH, StartGateway, wait_for_record

EASY = "hi, what is the capital of France?"
HARD = (
    "Prove that for every prime p > 3, p^2 - 1 is divisible by 24. Then solve step by "
    "step: a train leaves at 3pm at 60 km/h and another at 4pm at 80 km/h; when does the "
    "second catch up? Show all reasoning and compute exact values."
)


def score(text: str) -> float:
    return RequestScorer()("chat", {"messages": [{"role": "user", "content": text}]})


@pytest.fixture
def premium() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


async def test_easy_stays_cheap_and_hard_goes_premium(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    easy, hard = score(EASY), score(HARD)
    assert easy < hard  # the shipped classifier ranks them the way anyone would
    policy = POLICY.replace("THRESHOLD", f"{(easy + hard) / 2:.4f}")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    tiers = {}
    for text in (EASY, HARD):
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        assert float(response.headers["x-cascade-score"]) == pytest.approx(score(text), abs=1e-4)
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert record.score == pytest.approx(score(text), abs=1e-6)  # kept for calibration
        tiers[text] = (response.headers["x-cascade-deployment"], record.tier)
    assert tiers == {EASY: ("cheap", "local-small"), HARD: ("premium", "premium")}
    metrics = httpx.get(f"{base}/metrics").text
    assert 'cascade_router_score_count{route="auto"} 2.0' in metrics
    assert 'cascade_tier_requests_total{route="auto",tier="local-small"} 1.0' in metrics
    assert 'cascade_tier_requests_total{route="auto",tier="premium"} 1.0' in metrics


def test_request_options_move_the_score_through_the_gateway(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """Tools, JSON output and max_tokens reach the classifier (their prior weights):
    the same prompt scores higher with tools or JSON mode, lower with a small budget."""
    policy = POLICY.replace("THRESHOLD", "0.5")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}

    def scored(**extra: Any) -> float:
        body = {"model": "auto", "messages": [{"role": "user", "content": EASY}], **extra}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        return float(response.headers["x-cascade-score"])

    plain = scored()
    assert scored(tools=[tool]) > plain
    assert scored(response_format={"type": "json_object"}) > plain
    assert scored(max_tokens=16) < plain < scored(max_tokens=4096)


# A pasted document of about 1 MB, then the question.
DOCUMENT = " ".join(f"Clause {i}: the supplier delivers lot {i * 7 % 1000}." for i in range(22_000))


def test_a_long_conversation_is_routed_by_the_question_at_its_end(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    """A 1 MB conversation is scored (its head and tail read, its length whole) and the
    question after the document still decides the tier."""
    texts = {
        name: f"{DOCUMENT}\n\n{question}" for name, question in (("easy", EASY), ("hard", HARD))
    }
    scores = {name: score(text) for name, text in texts.items()}
    assert scores["easy"] < scores["hard"]
    policy = POLICY.replace("THRESHOLD", f"{(scores['easy'] + scores['hard']) / 2:.6f}")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    for name, text in texts.items():
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
        assert response.status_code == 200
        assert float(response.headers["x-cascade-score"]) == pytest.approx(scores[name], abs=1e-4)
        assert response.headers["x-cascade-deployment"] == (
            "cheap" if name == "easy" else "premium"
        )


def test_a_failing_cheap_tier_escalates_not_the_other_way(
    start_gateway: StartGateway, fake_openai: FakeOpenAI, premium: FakeOpenAI
) -> None:
    easy, hard = score(EASY), score(HARD)
    policy = POLICY.replace("THRESHOLD", f"{(easy + hard) / 2:.4f}")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    fake_openai.fail(503, times=None)
    body = {"model": "auto", "messages": [{"role": "user", "content": EASY}]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
    assert response.headers["x-cascade-deployment"] == "premium"  # fell back upwards
    premium.fail(503, times=None)
    fake_openai.fail_status = None  # the cheap tier is healthy again
    cheap_calls = len(fake_openai.requests)
    body["messages"][0]["content"] = HARD
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 503  # a hard request never drops to the cheap tier
    assert len(fake_openai.requests) == cheap_calls


async def test_a_route_with_the_embedding_classifier_routes_by_its_score(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    ledger_store: RedisStore,
) -> None:
    """`classifier: minilm`: the route's requests are scored by the embedding classifier
    (in its worker thread), the tiers follow that score, and the ledger keeps it."""

    def minilm(text: str) -> float:
        body = {"messages": [{"role": "user", "content": text}]}
        return RequestScorer()("chat", body, "minilm")

    scores = {text: minilm(text) for text in (EASY, HARD)}
    assert scores[EASY] != pytest.approx(score(EASY), abs=1e-3)  # not the default's score
    low, high = sorted(scores, key=scores.__getitem__)
    policy = POLICY.replace("THRESHOLD", f"{(scores[low] + scores[high]) / 2:.6f}").replace(
        "strategy: classifier", "strategy: classifier\n    classifier: minilm"
    )
    base = start_gateway(policy, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    for text, deployment in ((low, "cheap"), (high, "premium")):
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        assert response.headers["x-cascade-deployment"] == deployment
        assert float(response.headers["x-cascade-score"]) == pytest.approx(scores[text], abs=1e-4)
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert record.score == pytest.approx(scores[text], abs=1e-6)
        assert record.deployment == deployment and record.cost_nanos > 0


MINILM_POLICY = POLICY.replace("THRESHOLD", "0.5").replace(
    "strategy: classifier", "strategy: classifier\n    classifier: minilm"
)


def test_the_embedding_classifier_runs_in_its_own_thread(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Never on the event loop: the sentence model runs in the `minilm` worker thread."""
    threads: list[str] = []
    real_embed = embeddings.embed

    def spied(texts: Sequence[str], batch_size: int = 32) -> Any:
        threads.append(threading.current_thread().name)
        return real_embed(texts, batch_size)

    monkeypatch.setattr(embeddings, "embed", spied)
    base = start_gateway(MINILM_POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url
    body = {"model": "auto", "messages": [{"role": "user", "content": EASY}]}
    assert httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH).status_code == 200
    assert threads and all(name.startswith("minilm") for name in threads)


def test_a_classifier_that_fails_at_request_time_is_a_clean_503(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    premium: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = start_gateway(MINILM_POLICY, CHEAP_URL=fake_openai.url, PREMIUM_URL=premium.url).url

    def broken() -> None:
        raise RoutingError("cannot load the embedding model: OSError('disk gone')")

    monkeypatch.setattr(embedding_classifier, "shipped", broken)
    body = {"model": "auto", "messages": [{"role": "user", "content": EASY}]}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "classifier_unavailable" and "disk gone" in error["message"]
    assert fake_openai.requests == [] and premium.requests == []  # nothing was sent

"""Tier thresholds from the gateway's own traffic: `cascade-gateway router calibrate
--from-ledger ROUTE` reads the scores the route's requests got from the Redis ledger
(`gateway.traffic`). Through the running gateway and the real CLI, on real Redis."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.scoring import RequestScorer
from gateway.traffic import recent_scores
from router.training.calibration import calibrate, tiers_yaml, verify_threshold
from tests.fakes.openai_upstream import FakeOpenAI
from tests.gateway.cascade_scenario import POLICY as CASCADE_POLICY
from tests.gateway.cascade_scenario import QUESTION as CASCADE_QUESTION
from tests.gateway.classifier_policy import POLICY
from tests.gateway.conftest import AUTH, EXE, StartGateway, wait_for_record
from tests.gateway.ledger_fixtures import make_record

PROMPTS = [
    "hi there",
    "What is the capital of France?",
    "Summarise the plot of Hamlet in two sentences.",
    "Prove that the square root of 2 is irrational.",
    "Write a Python function that merges two sorted lists, with tests.",
    "Solve step by step: 3x + 7 = 22, then compute x squared minus 4.",
]


def calibrate_cli(
    *args: str, redis_url: str | None, prefix: str, command: str = "calibrate"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CASCADE_REDIS_URL")}
    if redis_url is not None:
        env["REDIS_URL"] = redis_url
    env["CASCADE_REDIS_PREFIX"] = prefix
    return subprocess.run(
        [EXE, "router", command, *args], capture_output=True, text=True, timeout=60, env=env
    )


async def test_thresholds_come_from_the_scores_of_the_routes_own_requests(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    redis_url: str,
    redis_prefix: str,
) -> None:
    policy = POLICY.replace("THRESHOLD", "0.5").replace("${PREMIUM_URL}", "${CHEAP_URL}")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url).url
    for prompt in PROMPTS:
        body = {"model": "auto", "messages": [{"role": "user", "content": prompt}]}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        await wait_for_record(ledger_store, response.headers["x-request-id"])
    result = calibrate_cli(
        "--from-ledger",
        "auto",
        "--shares",
        "local-small=0.5,premium=0.5",
        redis_url=redis_url,
        prefix=redis_prefix,
    )
    assert result.returncode == 0, result.stderr
    scorer = RequestScorer()
    scores = [scorer("chat", {"messages": [{"role": "user", "content": p}]}) for p in PROMPTS]
    expected = calibrate(scores, {"local-small": 0.5, "premium": 0.5})
    assert result.stdout == tiers_yaml(expected)
    below = expected[0].below
    assert below is not None and sum(s < below for s in scores) == len(PROMPTS) // 2


async def test_one_score_per_request_of_that_route(ledger_store: RedisStore) -> None:
    """Escalations and retries repeat a request's score; other routes and unscored
    requests are not in the sample."""
    records = [
        make_record(1, route="auto", score=0.2),
        make_record(2, route="auto", score=0.6),
        make_record(2, route="auto", score=0.6, record_id="req-2:1"),  # its escalation
        make_record(3, route="code", score=0.9),
        make_record(4, route="auto", score=None),
    ]
    for record in records:
        await ledger_store.record(record)
    assert await recent_scores(ledger_store, "auto", 100) == [0.2, 0.6]
    assert await recent_scores(ledger_store, "auto", 1) == []  # only the latest record read
    # Verdicts: only first answers; a middle tier's verdict (escalation 1) is left out.
    verdicts = [
        make_record(5, route="careful", verifier_score=0.3),
        make_record(5, route="careful", verifier_score=0.8, record_id="req-5:1"),
        make_record(6, route="careful", verifier_score=0.9),
        # A broken first answer the cascade refused (its request's record is the error
        # the client got): still a first answer, or the sample would leave them all out.
        make_record(7, route="careful", verifier_score=0.05, record_id="req-7:r0"),
        make_record(7, route="careful", verifier_score=None, status="error"),
    ]
    for record in verdicts:
        await ledger_store.record(record)
    scores = await recent_scores(ledger_store, "careful", 100, "verifier_score")
    assert scores == [0.3, 0.9, 0.05]


@pytest.mark.parametrize(
    ("args", "redis", "message"),
    [
        (["--from-ledger", "nowhere"], True, "no scored requests of route 'nowhere'"),
        (["--from-ledger", "auto"], False, "set REDIS_URL"),
        ([], True, "give IN.jsonl or --from-ledger ROUTE"),
        (["--from-ledger", "auto", "--last", "0"], True, "--last must be positive"),
        (["x.jsonl", "--last", "5"], True, "--last applies to --from-ledger"),
    ],
)
@pytest.mark.parametrize("command", ["calibrate", "calibrate-verify"])
def test_a_sample_that_cannot_be_read_is_a_clear_error(
    args: list[str], redis: bool, message: str, command: str, redis_url: str, redis_prefix: str
) -> None:
    if command == "calibrate-verify":
        message = message.replace("scored requests", "verified cascade answers")
    option = ["--shares", "a=0.5,b=0.5"] if command == "calibrate" else ["--escalate", "0.2"]
    result = calibrate_cli(
        *args, *option, redis_url=redis_url if redis else None, prefix=redis_prefix,
        command=command,
    )  # fmt: skip
    assert result.returncode == 1
    assert message in result.stderr and result.stdout == ""


def test_the_routes_own_classifier_scored_its_requests(redis_url: str, redis_prefix: str) -> None:
    result = calibrate_cli(
        "--from-ledger", "auto", "--classifier", "minilm", "--shares", "a=0.5,b=0.5",
        redis_url=redis_url, prefix=redis_prefix,
    )  # fmt: skip
    assert result.returncode == 1 and "--classifier applies to IN.jsonl" in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [("redis://127.0.0.1:1/0", "the ledger is unreachable"), ("foo://bad", "not a Redis URL")],
)
def test_an_unreachable_ledger_is_a_clear_error(url: str, message: str, redis_prefix: str) -> None:
    result = calibrate_cli(
        "--from-ledger", "auto", "--shares", "a=0.5,b=0.5", redis_url=url, prefix=redis_prefix
    )
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_bad_share_is_named_before_the_ledger_is_read(redis_prefix: str) -> None:
    result = calibrate_cli(
        "--from-ledger", "nowhere", "--escalate", "2", redis_url=None, prefix=redis_prefix,
        command="calibrate-verify",
    )  # fmt: skip
    assert result.returncode == 1 and "--escalate must be a share" in result.stderr


async def test_the_verify_threshold_comes_from_the_verdicts_on_the_routes_answers(
    start_gateway: StartGateway,
    fake_openai: FakeOpenAI,
    ledger_store: RedisStore,
    redis_url: str,
    redis_prefix: str,
) -> None:
    """`router calibrate-verify --from-ledger`: the verifier's scores of a cascade
    route's first answers, as the ledger kept them, give the threshold that escalates
    the asked share of them."""
    policy = CASCADE_POLICY.replace("${PREMIUM_URL}", "${CHEAP_URL}")
    base = start_gateway(policy, CHEAP_URL=fake_openai.url).url
    answers = ["17 * 23 = 391. The answer is 391.", "I am sorry, I cannot help with that.",
               "391", "It is 17 * 23 = 390.", "The answer is 391.", "Maybe 400?"]  # fmt: skip
    verdicts = []
    for answer in answers:
        fake_openai.reply_text = answer
        response = httpx.post(
            f"{base}/v1/chat/completions",
            json={"model": "careful", "messages": [CASCADE_QUESTION]},
            headers=AUTH,
        )
        assert response.status_code == 200
        record = await wait_for_record(ledger_store, response.headers["x-request-id"])
        assert record.verifier_score is not None
        verdicts.append(record.verifier_score)
    result = calibrate_cli(
        "--from-ledger", "careful", "--escalate", "0.5",
        redis_url=redis_url, prefix=redis_prefix, command="calibrate-verify",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    threshold = verify_threshold(verdicts, 0.5)
    assert result.stdout.startswith(f"verify_threshold: {threshold}  # escalates ")
    assert f"of {len(answers)} answers" in result.stdout
    assert len(set(verdicts)) > 1  # the answers were judged apart

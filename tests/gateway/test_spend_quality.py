"""`spend quality`: a select route's deployments from the Redis ledger, predicted quality
against the share the verifier accepted, with the offset the fleet learned."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.ledger import RedisStore
from gateway.pipeline.shared_profiles import profile_key
from gateway.spend.report import usd_text
from tests.gateway.archive_support import REPO
from tests.gateway.ledger_fixtures import delete_prefix, make_record

# cheap: 4 answers predicted 0.6, 3 verified, 1 accepted at 0.5; dear: 2, all accepted.
RECORDS = [
    make_record(
        0, route="pick", deployment="cheap", predicted_quality=0.6, verifier_score=0.2, status="ok"
    ),
    make_record(1, route="pick", deployment="cheap", predicted_quality=0.6, verifier_score=0.7),
    make_record(2, route="pick", deployment="cheap", predicted_quality=0.6, verifier_score=0.4),
    make_record(3, route="pick", deployment="cheap", predicted_quality=0.6),  # not verified
    make_record(4, route="pick", deployment="dear", predicted_quality=0.9, verifier_score=0.8),
    make_record(5, route="pick", deployment="dear", predicted_quality=0.9, verifier_score=0.95),
    make_record(6, route="other", deployment="cheap", predicted_quality=0.1),  # another route
    make_record(7, route="pick", deployment="cheap"),  # not a select choice's record
    # A request that got no answer (its error record carries the choice): no answer.
    make_record(8, route="pick", deployment="cheap", predicted_quality=0.6, status="error"),
]
POLICY = """deployments:
  cheap:
    api_base: "http://127.0.0.1:9/v1"
    model: m
    price: {input_per_mtok: 1, output_per_mtok: 1}
routes:
  pick: {strategy: select, deployments: [cheap], verify: true, verify_threshold: 0.3}
"""


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"

    async def setup() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        await store.record_many(RECORDS)
        await store.client.hset(
            profile_key(prefix, "cheap"), mapping={"offset": -0.2, "observations": 9}
        )
        await store.close()

    asyncio.run(setup())
    yield prefix
    asyncio.run(delete_prefix(redis_url, prefix))


def run(redis_url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": redis_url, "CASCADE_REDIS_PREFIX": prefix}
    command = [sys.executable, "-m", "gateway.cli", "spend", "quality", "--route", "pick", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)


def test_each_deployment_s_prediction_against_what_was_accepted(
    redis_url: str, prefix: str
) -> None:
    done = run(redis_url, prefix, "--threshold", "0.5")
    assert done.returncode == 0, done.stderr
    rows = {row["deployment"]: row for row in csv.DictReader(io.StringIO(done.stdout))}
    cheap, dear = rows["cheap"], rows["dear"]
    assert (cheap["answers"], cheap["verified"], cheap["accepted_share"]) == ("4", "3", "0.3333")
    assert (cheap["predicted_quality"], cheap["gap"]) == ("0.6", "-0.2667")
    assert (cheap["learned_offset"], cheap["learned_from"]) == ("-0.2", "9")
    assert (dear["answers"], dear["accepted_share"], dear["gap"]) == ("2", "1.0", "0.1")
    assert dear["learned_offset"] == ""  # nothing learned of it yet
    assert cheap["cost_usd"] == usd_text(sum(r.cost_nanos for r in RECORDS[:4]))  # exact


def test_the_threshold_comes_from_the_route_and_json_is_offered(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    done = run(redis_url, prefix, "--policy", str(tmp_path / "policy.yaml"), "--format", "json")
    assert done.returncode == 0, done.stderr
    cheap = next(row for row in json.loads(done.stdout) if row["deployment"] == "cheap")
    assert cheap["accepted_share"] == round(2 / 3, 4)  # 0.7 and 0.4 pass 0.3


def test_a_route_with_no_select_answers_says_so(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    missing = run(redis_url, prefix, "--policy", str(tmp_path / "policy.yaml"), "--last", "1")
    assert missing.returncode == 1
    assert "no answer of a select choice on route 'pick'" in missing.stderr
    unknown = run(redis_url, prefix, "--policy", str(tmp_path / "nowhere.yaml"))
    assert unknown.returncode == 1 and unknown.stderr

"""`policy explain` on a `select` route says what the proxy does: the escalation chain
is shown when the answer will be verified, and not for a tool request, which the proxy
sends to its choice without climbing (`gateway.runtime.climbs`); with the gateway's
Redis settings it chooses with what the fleet learned, and says where that came from."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis

from gateway.cli import choice_summary, select_choice
from gateway.pipeline.selector import MAX_SHIFT
from gateway.pipeline.shared_profiles import profile_key
from gateway.runtime import build_runtime, climbs
from policies import load_policy
from router.target_selection import prior_profile
from tests.gateway.conftest import EXE
from tests.gateway.select_fleet import PICK, PRICES, PROFILES, policy

VERIFIED = PICK + "\n    verify: true"
PROMPT = "hi"  # a cheap choice, with a better candidate above it


@pytest.mark.parametrize(
    ("route", "needs", "chain"),
    [
        (VERIFIED, {"chat"}, True),
        (VERIFIED, {"chat", "tools"}, False),  # a tool call is not text to verify
        (PICK, {"chat"}, False),  # the route does not verify
    ],
)
def test_explain_shows_the_climb_exactly_when_the_proxy_climbs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str, needs: set[str], chain: bool
) -> None:
    for name in PRICES:  # every deployment configured (never called here)
        monkeypatch.setenv(f"{name.upper()}_URL", "http://127.0.0.1:9/v1")
    (tmp_path / "policy.yaml").write_text(policy(route))
    runtime = build_runtime(load_policy(tmp_path / "policy.yaml"))
    pick = runtime.routes["pick"]
    choice = select_choice(runtime, pick, {"messages": [{"role": "user", "content": PROMPT}]})
    plan = runtime.plan(pick, None, needs=frozenset(needs), choice=choice)
    summary = choice_summary(pick, choice, plan, needs)
    assert climbs(pick, "select", needs) is chain
    assert ("escalation_chain" in summary) is chain
    if chain:
        assert summary["escalation_chain"] == list(choice.chain())
        assert len(choice.chain()) > 1  # this prompt's choice has someone better above it


def test_explain_names_the_candidate_an_exploring_request_tries_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PRICES:
        monkeypatch.setenv(f"{name.upper()}_URL", "http://127.0.0.1:9/v1")
    (tmp_path / "policy.yaml").write_text(policy(VERIFIED.replace("0.95", "0.99")))
    runtime = build_runtime(load_policy(tmp_path / "policy.yaml"))
    pick = runtime.routes["pick"]
    body = {"messages": [{"role": "user", "content": PROMPT}]}
    choice = select_choice(runtime, pick, body)
    plan = runtime.plan(pick, None, needs=frozenset({"chat"}), choice=choice)
    summary = choice_summary(pick, choice, plan, {"chat"})
    explorer = choice.explorer()
    assert explorer is not None and not choice.meets(explorer)
    assert summary["explores"] == {"deployment": explorer, "share": 0.05}


def explain(path: Path, **env: str) -> dict[str, Any]:
    """`cascade-gateway policy explain` of route `pick` for PROMPT, run as installed."""
    urls = {f"{name.upper()}_URL": "http://127.0.0.1:9/v1" for name in PRICES}
    result = subprocess.run(
        [EXE, "policy", "explain", str(path), "--model", "pick", "--prompt", PROMPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **urls, **env},
    )
    assert result.returncode == 0, result.stderr
    decision: dict[str, Any] = json.loads(result.stdout)
    return decision


def test_explain_reads_what_the_fleet_learned_from_redis(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """With the gateway's Redis settings explain chooses as the live gateway does: with
    the learned offsets (each shown), those learned against another profile set aside."""
    (tmp_path / "policy.yaml").write_text(policy(VERIFIED))
    client = redis.Redis.from_url(redis_url)
    lifted = {"offset": MAX_SHIFT, "observations": 30, "profile": "mistralai/mixtral-8x7b-chat"}
    client.hset(profile_key(redis_prefix, "mixtral"), mapping=lifted)
    stale = {"offset": -0.2, "observations": 9, "profile": "claude-v1"}  # before a reload
    client.hset(profile_key(redis_prefix, "gpt35"), mapping=stale)
    client.close()
    live = explain(tmp_path / "policy.yaml", REDIS_URL=redis_url, CASCADE_REDIS_PREFIX=redis_prefix)
    assert live["learned_offsets"].startswith("from Redis")
    mixtral, gpt35 = live["candidates"]["mixtral"], live["candidates"]["gpt35"]
    assert mixtral["learned_offset"] == MAX_SHIFT
    assert mixtral["predicted_quality"] == pytest.approx(mixtral["prior_quality"] + MAX_SHIFT)
    assert gpt35["learned_offset"] == 0.0  # learned against claude-v1, not its profile now
    assert gpt35["predicted_quality"] == gpt35["prior_quality"]
    assert live["deployment"] == "mixtral"  # learned above gpt4 on this prompt: the choice
    assert live["escalation_chain"] == ["mixtral", "gpt4"]  # and its refusal still climbs
    fresh = explain(tmp_path / "policy.yaml")  # no REDIS_URL: the predictor alone, said so
    assert "REDIS_URL is not set" in fresh["learned_offsets"]
    assert fresh["candidates"]["mixtral"]["learned_offset"] == 0.0
    assert fresh["deployment"] != "mixtral"
    down = explain(tmp_path / "policy.yaml", REDIS_URL="redis://127.0.0.1:1/0")
    assert "Redis cannot be read" in down["learned_offsets"]


def test_explain_names_the_model_a_deployment_without_a_profile_is_rated_as(
    tmp_path: Path,
) -> None:
    (tmp_path / "policy.yaml").write_text(policy(PICK))
    candidates = explain(tmp_path / "policy.yaml")["candidates"]
    assert candidates["yi"]["quality_profile"] == prior_profile(*PRICES["yi"])
    assert candidates["yi"]["profile_from"].startswith("price")
    assert candidates["gpt4"]["quality_profile"] == PROFILES["gpt4"]
    assert candidates["gpt4"]["profile_from"] == "policy"

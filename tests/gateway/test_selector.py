"""What a `select` route knows per request: qualities moved by traffic (bounded, with
the documented speed), the typical answer length, the reference's profile; and the
policy fields that configure it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.pipeline.accounting import OutputLengths
from gateway.pipeline.scoring import install_problems
from gateway.pipeline.selector import (
    DEFAULT_OUTPUT_TOKENS,
    LEARNING_RATE,
    MAX_SHIFT,
    QualitySelector,
    TrafficProfiles,
)
from policies import PolicyError, load_policy
from router.quality import STRONG_MODEL
from tests.gateway.select_runtime import runtime, select_route

HI = {"messages": [{"role": "user", "content": "hi"}]}


def test_traffic_moves_a_profile_at_the_documented_speed_within_its_bound() -> None:
    traffic = TrafficProfiles()
    for _ in range(6):
        traffic.observe("d", predicted=0.5, observed=1.0)  # residual +0.5: bound at 0.25
    assert traffic.offset("d") == pytest.approx(0.5 * (1 - 0.9**6))  # 0.234, not there yet
    for _ in range(200):
        traffic.observe("d", predicted=0.5, observed=1.0)
    assert traffic.offset("d") == pytest.approx(MAX_SHIFT)  # and never past it
    fresh = TrafficProfiles()
    for _ in range(7):
        fresh.observe("e", predicted=0.6, observed=0.5)  # residual -0.1, inside the bound
    assert fresh.offset("e") == pytest.approx(-0.1 * (1 - (1 - LEARNING_RATE) ** 7))
    assert fresh.offset("e") == pytest.approx(-0.05, abs=0.005)  # about halfway
    assert fresh.observations("e") == 7 and fresh.offset("unseen") == 0.0


def test_the_typical_answer_length_comes_from_priced_answers() -> None:
    lengths = OutputLengths()
    selector = QualitySelector(lengths)
    assert selector.output_tokens("r", {}) == DEFAULT_OUTPUT_TOKENS
    lengths.add("r", 100)
    assert selector.output_tokens("r", {}) == 100
    lengths.add("r", 200)
    assert selector.output_tokens("r", {}) == 110  # each answer weighs 10%
    assert selector.output_tokens("r", {"max_tokens": 20}) == 20


def test_a_deployment_without_a_profile_gets_its_price_prior() -> None:
    rt = runtime(select_route(), price={"input_per_mtok": 0.6, "output_per_mtok": 0.6})
    assert rt.deployments["cheap"].quality_profile == "mistralai/mixtral-8x7b-chat"


def test_the_choice_uses_the_reference_and_learned_offsets() -> None:
    rt = runtime(select_route(reference_model="dear", quality_target=0.5))
    route = rt.routes["r"]
    selector = QualitySelector(OutputLengths())
    named = {n: rt.deployments[n] for n in route.deployments}
    before = selector.choose(route, named, "chat", HI)
    assert before.chosen == "cheap"  # the cheapest known model meets half of GPT-4's
    assert before.estimates["cheap"].cost_usd < before.estimates["dear"].cost_usd
    for _ in range(30):  # it keeps failing: its prediction drops until it no longer meets
        selector.learn(before, "cheap", accepted=False)
    after = selector.choose(route, named, "chat", HI)
    drop = before.estimates["cheap"].quality - after.estimates["cheap"].quality
    assert drop == pytest.approx(min(MAX_SHIFT, before.estimates["cheap"].quality), abs=0.01)
    assert after.target == pytest.approx(before.target)


def test_an_unknown_reference_counts_as_the_strongest_known_model() -> None:
    rt = runtime(select_route(reference_model="gpt-4o"))
    assert QualitySelector(OutputLengths()).reference_profile(rt.routes["r"]) == STRONG_MODEL
    none = runtime(select_route())
    assert QualitySelector(OutputLengths()).reference_profile(none.routes["r"]) is None


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"strategy": "fallback", "quality_target": 0.9}, "quality_target applies to strategy"),
        ({"strategy": "fallback", "verify": True}, "verify applies to strategy 'select'"),
        ({"strategy": "select", "judge": "dear"}, "judge applies to strategy 'cascade' or"),
        ({"strategy": "select", "quality_target": 0}, "greater than 0"),
    ],
)
def test_select_fields_are_validated(route: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runtime({"deployments": ["cheap", "dear"], **route})


def test_a_verified_selection_may_have_a_judge() -> None:
    rt = runtime(select_route(verify=True, judge="dear"))
    assert rt.routes["r"].verify and rt.routes["r"].judge is not None


def test_an_unknown_quality_profile_is_a_located_policy_problem(tmp_path: Path) -> None:
    """Refused at load (serve, reload, `policy check`), naming the known profiles."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        "deployments:\n"
        "  a: {model: m, api_base: 'http://127.0.0.1:9/v1', quality_profile: gpt-5-turbo}\n"
        "routes:\n"
        "  r: {strategy: select, deployments: [a]}\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={}, install_check=install_problems)
    [problem] = caught.value.problems
    assert problem.field == "deployments.a.quality_profile" and problem.line == 2
    assert "unknown model 'gpt-5-turbo'" in problem.message
    assert "gpt-3.5-turbo-1106" in problem.message  # the known ones are listed
    assert load_policy(path, env={}).policy.deployments["a"].quality_profile == "gpt-5-turbo"

"""What a `select` route knows per request: qualities moved by traffic (bounded, with
the documented speed), the typical answer length, the reference's profile; and the
policy fields that configure it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.pipeline.accounting import OutputLengths
from gateway.pipeline.scoring import install_problems
from gateway.pipeline.selector import (
    DEFAULT_OUTPUT_TOKENS,
    LEARNING_RATE,
    MAX_SHIFT,
    Profile,
    QualitySelector,
    TrafficProfiles,
    select_deployments,
    stepped,
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
    before = selector.choose(rt, route, "chat", HI)
    assert before.chosen == "cheap"  # the cheapest known model meets half of GPT-4's
    assert before.estimates["cheap"].cost_usd < before.estimates["dear"].cost_usd
    for _ in range(30):  # it keeps failing: its prediction drops until it no longer meets
        selector.learn(before, "cheap", accepted=False)
    after = selector.choose(rt, route, "chat", HI)
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
        "  a: {model: m, api_base: 'http://127.0.0.1:9/v1', quality_profile: gpt-5-turbo,\n"
        "      price: {input_per_mtok: 1, output_per_mtok: 1}}\n"
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


GPT4 = "gpt-4-1106-preview"


def test_the_reference_meets_its_own_target_whatever_it_learned() -> None:
    """The target is the reference's quality moved by its learned offset, as every
    candidate's is (a review found it held to its unlearned figure, and failing it)."""
    rt = runtime(select_route(reference_model="dear", quality_target=1.0))
    route = rt.routes["r"]
    selector = QualitySelector(OutputLengths())
    for offset in (-MAX_SHIFT, MAX_SHIFT):
        selector.traffic.adopt("dear", Profile(offset, 30, GPT4))
        choice = selector.choose(rt, route, "chat", HI)
        assert choice.reference == "dear" and choice.meets("dear")
        assert choice.target == pytest.approx(choice.estimates["dear"].quality)
        assert choice.estimates["dear"].quality != choice.estimates["dear"].predicted


def test_a_reference_outside_the_candidates_moves_the_target_by_its_offset() -> None:
    rt = runtime({"strategy": "select", "deployments": ["cheap"], "reference_model": "dear"})
    route = rt.routes["r"]
    assert select_deployments(rt) == ["cheap", "dear"]  # its learning is polled too
    selector = QualitySelector(OutputLengths())
    before = selector.choose(rt, route, "chat", HI)
    selector.traffic.adopt("dear", Profile(-0.2, 30, GPT4))
    after = selector.choose(rt, route, "chat", HI)
    assert before.reference is None  # no candidate to climb to
    assert after.target == pytest.approx(before.target - 0.95 * 0.2)


def test_an_offset_belongs_to_the_profile_it_was_learned_against(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reload that gives 'cheap' another quality_profile sets aside what was learned
    against the old one (said once in the log); its next verdict starts afresh."""
    old = runtime(select_route(), quality_profile="mistralai/mistral-7b-chat")
    new = runtime(select_route(), quality_profile="mistralai/mixtral-8x7b-chat")
    selector = QualitySelector(OutputLengths())
    choice = selector.choose(old, old.routes["r"], "chat", HI)
    for _ in range(10):
        selector.learn(choice, "cheap", accepted=False)
    learned = selector.traffic.offset("cheap", "mistralai/mistral-7b-chat")
    assert learned < 0
    with caplog.at_level(logging.INFO, logger="gateway.pipeline.selector"):
        reloaded = selector.choose(new, new.routes["r"], "chat", HI)
        selector.choose(new, new.routes["r"], "chat", HI)
    assert reloaded.estimates["cheap"].quality == reloaded.estimates["cheap"].predicted
    [line] = [r.getMessage() for r in caplog.records]
    assert "'mistralai/mixtral-8x7b-chat'" in line and "'mistralai/mistral-7b-chat'" in line
    selector.learn(reloaded, "cheap", accepted=True)
    assert selector.traffic.observations("cheap") == 1  # started again
    assert selector.traffic.offset("cheap", "mistralai/mixtral-8x7b-chat") > 0
    assert selector.traffic.offset("cheap", "mistralai/mistral-7b-chat") == 0.0  # gone


def test_a_profile_learned_before_profiles_were_kept_counts_as_the_current_one() -> None:
    held = Profile(-0.1, 5)  # None: from before the profile was recorded
    assert held.learned_under("anything") and Profile(0.1, 1, "a").learned_under(None)
    assert stepped(held, 0.5, 1.0, "a") == Profile(pytest.approx(-0.04), 6, "a")
    assert stepped(Profile(-0.1, 5, "a"), 0.5, 1.0, "b") == Profile(pytest.approx(0.05), 1, "b")

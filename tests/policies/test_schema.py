"""The schema's models, cross-references and the shipped JSON schema."""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policies import Policy, hash_key
from policies.access import Key
from policies.schema import Deployment, Route, schema_json

SCHEMA_FILE = Path(__file__).parents[2] / "policies" / "schema.json"


def minimal(**sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "deployments": {"a": {"model": "m", "api_base": "http://127.0.0.1:9/v1"}},
        "routes": {"auto": {"deployments": ["a"]}},
    }
    data.update(sections)
    return data


def test_schema_json_is_in_sync() -> None:
    # regenerate with: python -m policies.schema > policies/schema.json
    assert json.loads(SCHEMA_FILE.read_text()) == json.loads(schema_json())


def test_defaults() -> None:
    policy = Policy.model_validate(minimal())
    deployment = policy.deployments["a"]
    assert (deployment.provider, deployment.tier, deployment.timeout_s) == ("openai", "default", 60)
    assert policy.routes["auto"].strategy == "fallback"
    assert policy.gateway.max_body_bytes == 20 * 1024 * 1024
    assert policy.auth.anonymous_team is None
    assert (policy.teams, policy.keys, policy.admin_keys, policy.budgets) == ({}, {}, [], [])


def test_hash_key() -> None:
    secret = "fake-" + secrets.token_hex(8)
    assert hash_key(secret) == "sha256:" + hashlib.sha256(secret.encode()).hexdigest()


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"model": "m", "api_base": "http://x/v1"}, None),
        ({"model": "m"}, "api_base is not set"),
        ({"model": "m", "api_base": "http://x/v1", "requires_key": True}, "api_key is not set"),
        ({"model": "m", "provider": "anthropic"}, "api_key is not set"),
        ({"model": "m", "provider": "anthropic", "api_key": "k"}, None),
    ],
)
def test_unavailable_reason(fields: dict[str, Any], reason: str | None) -> None:
    assert Deployment.model_validate(fields).unavailable_reason() == reason


def test_unavailable_reason_names_unset_env() -> None:
    data = minimal(deployments={"a": {"model": "m", "api_base": None}})
    context = {"unset_env": {"deployments.a.api_base": ["UPSTREAM_BASE_URL"]}}
    policy = Policy.model_validate(data, context=context)
    reason = policy.deployments["a"].unavailable_reason()
    assert reason == "api_base is not set (UPSTREAM_BASE_URL unset)"
    empty = {**context, "empty_env": {"UPSTREAM_BASE_URL"}}  # set, but to ""
    policy = Policy.model_validate(data, context=empty)
    reason = policy.deployments["a"].unavailable_reason()
    assert reason == "api_base is not set (UPSTREAM_BASE_URL empty)"


def test_fixed_route_takes_one_deployment() -> None:
    with pytest.raises(ValidationError, match="exactly one deployment"):
        Route.model_validate({"strategy": "fixed", "deployments": ["a", "b"]})


def test_route_needs_a_deployment() -> None:
    with pytest.raises(ValidationError):
        Route.model_validate({"deployments": []})


def test_key_takes_secret_or_hash_not_both() -> None:
    with pytest.raises(ValidationError, match="not both"):
        Key.model_validate({"secret": "s", "hash": hash_key("s")})
    with pytest.raises(ValidationError, match="pattern"):
        Key.model_validate({"hash": "md5:abc"})


def test_key_without_secret_is_an_error_unless_its_env_var_was_unset() -> None:
    data = minimal(keys={"ci": {}})
    with pytest.raises(ValidationError, match="needs a secret"):
        Policy.model_validate(data)
    context = {"unset_env": {"keys.ci.secret": ["CI_KEY"]}}
    key = Policy.model_validate(data, context=context).keys["ci"]
    assert key.disabled_reason == "secret is not set (CI_KEY unset)"


def test_undeclared_deployment_message() -> None:
    data = minimal(routes={"auto": {"deployments": ["a", "gpt-x"]}})
    with pytest.raises(ValidationError) as caught:
        Policy.model_validate(data)
    assert "route 'auto' names deployment 'gpt-x', which is not declared; declared: a" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"keys": {"k": {"hash": hash_key("s"), "team": "ops"}}}, "names team 'ops'"),
        ({"keys": {"k": {"hash": hash_key("s"), "allowed_routes": ["x"]}}}, "route 'x'"),
        ({"teams": {"t": {"allowed_routes": ["auto", "nope"]}}}, "route 'nope'"),
        ({"auth": {"anonymous_team": "ghost"}}, "team 'ghost'"),
        ({"gateway": {"default_route": "fast"}}, "route 'fast'"),
        (
            {"budgets": [{"scope": "route", "name": "x", "period": "day", "limit_usd": 1}]},
            "route 'x'",
        ),
        (
            {"budgets": [{"scope": "team", "name": "x", "period": "day", "limit_usd": 1}]},
            "team 'x'",
        ),
    ],
)
def test_cross_references(sections: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected):
        Policy.model_validate(minimal(**sections))


def test_default_team_is_implicit_and_star_allowed() -> None:
    sections = {
        "keys": {"k": {"hash": hash_key("s"), "allowed_routes": ["*", "auto"]}},
        "auth": {"anonymous_team": "default"},
        "budgets": [{"scope": "team", "name": "default", "period": "month", "limit_usd": 5}],
    }
    policy = Policy.model_validate(minimal(**sections))
    assert policy.keys["k"].team == "default"


def test_soft_limit_above_limit() -> None:
    budget = {"scope": "key", "name": "k", "period": "day", "limit_usd": 1, "soft_limit_usd": 2}
    with pytest.raises(ValidationError, match="soft_limit_usd"):
        Policy.model_validate(minimal(budgets=[budget]))


CLASSIFIER_POLICY = {
    "deployments": {
        "small": {"model": "s", "api_base": "http://127.0.0.1:1/v1", "tier": "cheap"},
        "big": {"model": "b", "api_base": "http://127.0.0.1:2/v1", "tier": "premium"},
    },
    "routes": {
        "smart": {
            "strategy": "classifier",
            "deployments": ["small", "big"],
            "tiers": [{"tier": "cheap", "below": 0.4}, {"tier": "premium"}],
        }
    },
}


def test_classifier_route_with_tiers_is_valid() -> None:
    policy = Policy.model_validate(CLASSIFIER_POLICY)
    assert [t.tier for t in policy.routes["smart"].tiers] == ["cheap", "premium"]


@pytest.mark.parametrize(
    ("tiers", "message"),
    [
        ([], "needs tiers"),
        ([{"tier": "cheap", "below": 0.4}, {"tier": "premium", "below": 0.9}], "last takes"),
        (
            [{"tier": "cheap", "below": 0.8}, {"tier": "cheap", "below": 0.4}, {"tier": "premium"}],
            "must increase",
        ),
        ([{"tier": "cheap", "below": 0.4}, {"tier": "gold"}], "none of its deployments"),
    ],
)
def test_bad_classifier_tiers_are_refused(tiers: list[dict[str, object]], message: str) -> None:
    data = copy.deepcopy(CLASSIFIER_POLICY)
    data["routes"]["smart"]["tiers"] = tiers  # type: ignore[index]
    with pytest.raises(ValueError, match=message):
        Policy.model_validate(data)


def cascade_with(second_opinions: list[str], strategy: str = "cascade") -> dict[str, Any]:
    deployments = {"a": {"model": "m", "api_base": "http://127.0.0.1:9/v1"}}
    deployments["b"] = {**deployments["a"], "model": "big", "tier": "premium"}
    deployments["c"] = {**deployments["a"], "api_base": "http://127.0.0.1:8/v1"}
    route = {"strategy": strategy, "deployments": ["a", "b"], "second_opinions": second_opinions}
    return minimal(deployments=deployments, routes={"careful": route})


def test_no_verified_tier_may_give_its_own_model_a_second_opinion() -> None:
    """A middle tier's answer is verified too (and answers first when the cheap tier is
    down): its model may not be an opinion; the last tier's, never verified, may."""
    data = cascade_with([])
    data["deployments"]["mid"] = {**data["deployments"]["a"], "model": "mid", "tier": "mid"}
    data["deployments"]["mid-2"] = {**data["deployments"]["mid"], "tier": "other"}
    data["routes"]["careful"]["deployments"] = ["a", "mid", "b"]
    data["routes"]["careful"]["second_opinions"] = ["mid-2"]
    with pytest.raises(ValidationError, match="'mid-2' serves mid, the model of a tier"):
        Policy.model_validate(data)
    data["routes"]["careful"]["second_opinions"] = ["b"]
    assert Policy.model_validate(data).routes["careful"].second_opinions == ["b"]


def test_a_cascade_takes_second_opinions_from_its_deployments_or_others() -> None:
    route = Policy.model_validate(cascade_with(["b"])).routes["careful"]
    assert route.second_opinions == ["b"]
    assert Policy.model_validate(cascade_with([])).routes["careful"].second_opinions == []


def test_code_runs_are_a_cascade_option_off_by_default() -> None:
    assert not Policy.model_validate(cascade_with([])).routes["careful"].run_code_examples
    data = cascade_with([])
    data["routes"]["careful"]["run_code_examples"] = True
    assert Policy.model_validate(data).routes["careful"].run_code_examples
    data["routes"]["careful"]["strategy"] = "fallback"
    with pytest.raises(ValidationError, match="run_code_examples applies to strategy 'cascade'"):
        Policy.model_validate(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            cascade_with(["b"], strategy="fallback"),
            "second_opinions apply to strategy 'cascade' or 'select' with verify: true "
            "(routes whose answers are judged), not 'fallback'",
        ),
        (
            cascade_with(["b", "a", "b"]),
            "second_opinions name 'b' more than once; each deployment gives one opinion",
        ),
        (
            cascade_with(["b", "gpt-x"]),
            "second_opinions of route 'careful' names deployment 'gpt-x', which is not "
            "declared; declared: a, b, c",
        ),
        (  # another replica of the cheap model: it would agree with itself
            cascade_with(["c"]),
            "second_opinions of route 'careful': 'c' serves m, the model of a tier whose "
            "answers the cascade verifies, and a model agrees with itself; ask another model",
        ),
    ],
)
def test_bad_second_opinions_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Policy.model_validate(data)
    assert message in str(caught.value)


def test_a_classifier_route_may_choose_the_embedding_classifier() -> None:
    data = copy.deepcopy(CLASSIFIER_POLICY)
    assert Policy.model_validate(data).routes["smart"].classifier == "features"  # default
    data["routes"]["smart"]["classifier"] = "minilm"  # type: ignore[index]
    assert Policy.model_validate(data).routes["smart"].classifier == "minilm"
    data["routes"]["smart"]["classifier"] = "bert"  # type: ignore[index]
    with pytest.raises(ValueError, match="'features' or 'minilm'"):
        Policy.model_validate(data)


def test_a_route_that_scores_nothing_takes_no_classifier() -> None:
    data = minimal(routes={"r": {"deployments": ["a"], "classifier": "minilm"}})
    with pytest.raises(ValueError, match="classifier applies to strategy 'classifier'"):
        Policy.model_validate(data)


def test_explore_applies_to_a_verified_select_only() -> None:
    data = cascade_with([])
    route = data["routes"]["careful"]
    route.update(strategy="select", verify=True, explore=0.2)
    assert Policy.model_validate(data).routes["careful"].explore == 0.2
    route["verify"] = False
    with pytest.raises(ValidationError, match="explore applies to strategy 'select' with verify"):
        Policy.model_validate(data)


def test_a_select_route_names_each_candidate_once() -> None:
    data = cascade_with([], strategy="select")
    data["routes"]["careful"]["deployments"] = ["a", "b", "a"]
    with pytest.raises(ValidationError, match="deployments name 'a' more than once"):
        Policy.model_validate(data)
    data["routes"]["careful"]["strategy"] = "fallback"  # a chain may come back to one
    assert Policy.model_validate(data).routes["careful"].deployments == ["a", "b", "a"]

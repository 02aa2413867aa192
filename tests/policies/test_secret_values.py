"""Secrets in a policy: a literal deployment key is refused unless it is a short
placeholder, and an empty one (`${VAR:-}`, VAR unset) is unset, as `${VAR}` is."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.runtime import build_runtime
from policies import PolicyError, load_policy
from policies.unserved import unserved_notes

KEYLESS = """\
deployments:
  local:
    provider: ollama
    model: llama3
    api_base: http://127.0.0.1:11434
    api_key: {key}
routes:
  auto: {{deployments: [local]}}
"""
PLAINTEXT = "secrets come from the environment: write ${VAR_NAME}, not the secret"
HINT = " (a server that checks no key: `api_key: unused`, or ${VAR:-unused})"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "key", ["ollama", "EMPTY", "unused", "fifteen-chars-x", "llama-no-key-required", "not-needed"]
)
def test_a_short_literal_deployment_key_is_a_placeholder(tmp_path: Path, key: str) -> None:
    """A keyless server behind litellm still needs an `api_key`: a placeholder loads."""
    policy = load_policy(write(tmp_path, KEYLESS.format(key=key)), env={}).policy
    local = policy.deployments["local"]
    assert (local.api_key, local.unavailable_reason()) == (key, None)


def test_a_literal_deployment_key_of_sixteen_or_more_is_refused_with_a_hint(
    tmp_path: Path,
) -> None:
    text = KEYLESS.format(key="fake-sixteen-key")  # exactly 16: what a real key looks like
    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, text), env={})
    [problem] = caught.value.problems
    assert (problem.line, problem.field) == (6, "deployments.local.api_key")
    assert problem.message == PLAINTEXT + HINT
    assert "fake-sixteen-key" not in str(caught.value)


def test_keys_engines_and_admin_keys_refuse_even_a_short_literal(tmp_path: Path) -> None:
    text = KEYLESS.format(key="'${K}'") + (
        "keys:\n  k: {secret: short}\n"
        "engines:\n  e: {model: m, port: 8100, api_key: short}\n"
        "admin_keys: [short]\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, text), env={})
    found = {(p.field, p.message) for p in caught.value.problems}
    assert found == {
        ("keys.k.secret", PLAINTEXT),
        ("engines.e.api_key", PLAINTEXT),
        ("admin_keys.0", PLAINTEXT),
    }


def test_an_empty_secret_disables_its_key_and_check_notes_it(tmp_path: Path) -> None:
    """`secret: ${K:-}` with K unset is no empty secret: the key is disabled, as with
    `${K}`, and `policy check` (and the gateway's log) say so."""
    text = KEYLESS.format(key="unused") + (
        "keys:\n  k: {secret: '${K:-}'}\n  h: {hash: '${H:-}'}\n  ok: {secret: '${OK}'}\n"
    )
    loaded = load_policy(write(tmp_path, text), env={"OK": "fake-client-key"})
    keys = loaded.policy.keys
    assert (keys["k"].secret, keys["h"].hash) == (None, None)
    assert keys["k"].disabled_reason == "secret is not set (K unset)"
    assert keys["h"].disabled_reason == "hash is not set (H unset)"
    notes = unserved_notes(loaded.policy)
    assert (
        "key 'k' is disabled, its requests are refused (401): secret is not set (K unset)" in notes
    )
    assert [p.key_id for p in build_runtime(loaded).keys.principals.values()] == ["ok"]


def test_an_empty_required_key_leaves_its_deployment_unavailable(tmp_path: Path) -> None:
    """`api_key: ${OPENAI_API_KEY:-}` with `requires_key: true` and the variable unset:
    routing skips the deployment, as for `${OPENAI_API_KEY}`."""
    text = (
        "deployments:\n"
        "  paid: {model: gpt-4o, api_base: 'https://api.openai.com/v1', requires_key: true,"
        " api_key: '${OPENAI_API_KEY:-}'}\n"
        "  local: {model: m, api_base: 'http://127.0.0.1:9/v1'}\n"
        "routes:\n  auto: {deployments: [paid, local]}\n"
    )
    loaded = load_policy(write(tmp_path, text), env={})
    paid = loaded.policy.deployments["paid"]
    assert paid.api_key is None
    reason = "api_key is not set (OPENAI_API_KEY unset)"
    assert paid.unavailable_reason() == reason
    assert f"deployment 'paid' is unavailable until configured: {reason}" in unserved_notes(
        loaded.policy
    )
    runtime = build_runtime(loaded)
    plan = runtime.plan(runtime.routes["auto"])
    assert [step.deployment for step in plan.steps] == ["local"]
    assert dict(plan.skipped)["paid"].endswith(reason)
    # `engine up` refuses only a `${VAR}` left unset; `${VAR:-}` is its optional key.
    assert loaded.unset_env == {}


def test_an_empty_optional_key_is_no_key(tmp_path: Path) -> None:
    """A server that checks no key (`requires_key` false) serves with `${K:-}` unset."""
    text = (
        "deployments:\n"
        "  local: {model: m, api_base: 'http://127.0.0.1:9/v1', api_key: '${K:-}'}\n"
        "routes:\n  auto: {deployments: [local]}\n"
    )
    local = load_policy(write(tmp_path, text), env={}).policy.deployments["local"]
    assert (local.api_key, local.unavailable_reason()) == (None, None)


def test_an_empty_api_base_is_unset_not_a_bad_url(tmp_path: Path) -> None:
    """`${URL:-}` with URL unset: the deployment waits to be configured, as with an unset
    `${URL}`, instead of the policy failing on a URL without a scheme."""
    path = write(
        tmp_path,
        "deployments:\n  a: {model: m, api_base: '${EMPTY_TEST_URL:-}'}\n"
        "routes:\n  auto: {deployments: [a]}\n",
    )
    deployment = load_policy(path, env={}).policy.deployments["a"]
    assert deployment.api_base is None
    assert deployment.unavailable_reason() == "api_base is not set (EMPTY_TEST_URL unset)"


def test_a_variable_set_but_empty_is_said_to_be_empty(tmp_path: Path) -> None:
    """Set to "" a variable disables what needs it, as an unset one does, but the
    messages say which it is: an empty one is no typo in its name."""
    text = (
        "deployments:\n"
        "  a: {model: m, api_base: '${URL}', price: {input_per_mtok: 1, output_per_mtok: 1}}\n"
        "  b: {model: m, api_base: 'http://127.0.0.1:9/v1', requires_key: true,"
        " api_key: '${UNSET_B:-}${EMPTY_B:-}', price: {input_per_mtok: 1, output_per_mtok: 1}}\n"
        "routes:\n  auto: {deployments: [a, b]}\n"
        "keys:\n  k: {secret: '${K}'}\n  h: {hash: '${H:-}'}\n"
    )
    path = write(tmp_path, text)
    loaded = load_policy(path, env={"URL": "", "EMPTY_B": "", "K": "", "H": ""})
    deployments, keys = loaded.policy.deployments, loaded.policy.keys
    assert deployments["a"].unavailable_reason() == "api_base is not set (URL empty)"
    assert (
        deployments["b"].unavailable_reason() == "api_key is not set (UNSET_B unset, EMPTY_B empty)"
    )
    assert keys["k"].disabled_reason == "secret is not set (K empty)"
    assert keys["h"].disabled_reason == "hash is not set (H empty)"
    notes = unserved_notes(loaded.policy)
    assert (
        "deployment 'a' is unavailable until configured: api_base is not set (URL empty)" in notes
    )
    assert (
        "key 'k' is disabled, its requests are refused (401): secret is not set (K empty)" in notes
    )
    unset = load_policy(path, env={}).policy
    assert unset.deployments["a"].unavailable_reason() == "api_base is not set (URL unset)"
    assert unset.keys["k"].disabled_reason == "secret is not set (K unset)"


def test_a_problem_with_an_empty_variable_says_it_is_empty(tmp_path: Path) -> None:
    """A required field left null by `${VAR}`: the problem names VAR, empty or unset."""
    path = write(tmp_path, KEYLESS.format(key="unused").replace("model: llama3", "model: ${M}"))
    for env, state in [({"M": ""}, "empty"), ({}, "unset")]:
        with pytest.raises(PolicyError) as caught:
            load_policy(path, env=env)
        [problem] = caught.value.problems
        assert problem.field == "deployments.local.model"
        assert problem.message == f"Input should be a valid string (M is {state})"

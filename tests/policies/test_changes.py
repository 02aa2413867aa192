"""policy_changes: a reload's log names what changed, once, and never a secret."""

from __future__ import annotations

from pathlib import Path

from policies import Policy, load_policy
from policies.changes import policy_changes

POLICY = """\
deployments:
  local:
    model: m1
    api_base: http://127.0.0.1:9/v1
  paid:
    provider: anthropic
    model: claude-sonnet-4-5
    api_key: ${PAID_KEY}
routes:
  auto:
    deployments: [local, paid]
keys:
  ci: {secret: "${CI_KEY}"}
  app: {secret: "${APP_KEY}"}
admin_keys: ["${ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
budgets:
  - {scope: team, name: default, period: month, limit_usd: 10}
"""
ENV = {"CI_KEY": "fake-ci-secret", "APP_KEY": "fake-app-secret", "ADMIN_KEY": "fake-admin"}
ENV["FINANCE_KEY"] = "fake-finance"


def load(tmp_path: Path, text: str = POLICY, **env: str) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return load_policy(path, env={**ENV, **env}).policy


def test_the_same_policy_changes_nothing(tmp_path: Path) -> None:
    changes = policy_changes(load(tmp_path), load(tmp_path))
    assert not changes
    assert changes.changed == changes.warnings == ()


def test_an_env_var_set_makes_a_deployment_available_in_one_line(tmp_path: Path) -> None:
    changes = policy_changes(load(tmp_path), load(tmp_path, PAID_KEY="fake-paid-secret"))
    assert changes.changed == ("deployment 'paid' became available (api_key changed)",)
    assert changes.warnings == ()


def test_an_env_var_unset_makes_it_unavailable_and_says_why(tmp_path: Path) -> None:
    changes = policy_changes(load(tmp_path, PAID_KEY="fake-paid-secret"), load(tmp_path))
    assert changes.changed == ()
    assert changes.warnings == (
        "deployment 'paid' became unavailable: api_key is not set (PAID_KEY unset) "
        "(api_key changed)",
    )


def test_added_removed_and_changed_are_named(tmp_path: Path) -> None:
    edited = (
        POLICY.replace("model: m1", "model: m2")
        .replace('  ci: {secret: "${CI_KEY}"}\n', "")
        .replace(
            "    deployments: [local, paid]\n",
            "    deployments: [local, paid]\n  fast:\n    deployments: [local]\n",
        )
        .replace("limit_usd: 10", "limit_usd: 20")
    )
    changes = policy_changes(load(tmp_path), load(tmp_path, edited))
    assert changes.changed == (
        "route 'fast' added",
        "key 'ci' removed",
        "deployment 'local' changed: model",
        "budget 'team:default/month' changed: limit_usd",
    )
    assert changes.warnings == ()


def test_a_new_warning_is_reported_and_a_standing_one_is_not(tmp_path: Path) -> None:
    # paid stays unavailable (a standing warning); the admin key goes unset (a new one)
    changes = policy_changes(load(tmp_path), load(tmp_path, ADMIN_KEY=""))
    assert changes.changed == ("admin_keys changed (0 set of 1)",)
    assert changes.warnings == ("no admin key is set: /admin answers 401",)
    back = policy_changes(load(tmp_path, ADMIN_KEY=""), load(tmp_path))
    assert back.changed == (
        "admin_keys changed (1 set of 1)",
        "resolved: no admin key is set: /admin answers 401",
    )


def test_no_secret_is_ever_in_a_line(tmp_path: Path) -> None:
    old = load(tmp_path)
    new = load(
        tmp_path,
        CI_KEY="fake-ci-rotated",
        ADMIN_KEY="fake-admin-rotated",
        PAID_KEY="fake-paid-rotated",
    )
    changes = policy_changes(old, new)
    text = "\n".join(changes.changed + changes.warnings)
    assert "key 'ci' changed: secret" in text
    for secret in (*ENV.values(), "fake-ci-rotated", "fake-admin-rotated", "fake-paid-rotated"):
        assert secret not in text

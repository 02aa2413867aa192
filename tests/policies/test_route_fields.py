"""Fields that do nothing where they are written are refused: a cascade's knobs on a
route that never verifies, and `requires` (never read) on a deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from policies import DEFAULT_POLICY_PATH, EXAMPLES_DIR, PolicyError, load_policy
from policies.schema import Route
from policies.unserved import unserved_notes

ESCALATE = "applies to strategy 'cascade' or 'select' (routes that escalate)"
STREAMED = "stream_cascade applies to strategy 'cascade'"
MISPLACED = [
    ("fallback", {"verify_threshold": 0.5}, f"verify_threshold {ESCALATE}, not 'fallback'"),
    ("fallback", {"judge_timeout_ms": 2000}, f"judge_timeout_ms {ESCALATE}, not 'fallback'"),
    ("fixed", {"max_escalations": 1}, f"max_escalations {ESCALATE}, not 'fixed'"),
    ("fixed", {"stream_cascade": "buffer"}, f"{STREAMED}, not 'fixed'"),
    ("select", {"stream_cascade": "buffer"}, f"{STREAMED}, not 'select'"),
]  # fmt: skip


def route(strategy: str, **fields: Any) -> Route:
    return Route.model_validate({"strategy": strategy, "deployments": ["a"], **fields})


@pytest.mark.parametrize(("strategy", "fields", "message"), MISPLACED)
def test_a_cascade_field_on_a_route_that_never_verifies_is_refused(
    strategy: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        route(strategy, **fields)
    assert caught.value.errors()[0]["msg"] == f"Value error, {message}"


@pytest.mark.parametrize(
    ("strategy", "fields"),
    [
        ("cascade", {"verify_threshold": 0.5, "max_escalations": 1, "judge_timeout_ms": 2000}),
        ("cascade", {"stream_cascade": "buffer"}),
        ("select", {"verify": True, "verify_threshold": 0.5, "judge_timeout_ms": 2000}),
        # Unused until `verify: true`: kept, so that turning verification off is one edit.
        ("select", {"verify_threshold": 0.5, "max_escalations": 1, "judge_timeout_ms": 2000}),
        ("fallback", {}),  # the defaults are on every route: only what is written counts
    ],
)
def test_a_cascade_field_where_answers_are_verified_is_accepted(
    strategy: str, fields: dict[str, Any]
) -> None:
    assert route(strategy, **fields).strategy == strategy


def test_the_error_names_the_route_and_its_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "deployments:\n  a: {model: m, api_base: 'http://127.0.0.1:9/v1'}\n"
        "routes:\n  auto:\n    deployments: [a]\n    verify_threshold: 0.6\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy(path, env={})
    [problem] = caught.value.problems
    assert (problem.line, problem.field) == (5, "routes.auto")
    assert problem.message == f"verify_threshold {ESCALATE}, not 'fallback'"


def test_requires_is_ignored_and_noted(tmp_path: Path) -> None:
    """`requires: [tools, vision]` was declared, never read: a policy with it still loads
    (an upgrade must not stop serve), and check notes that it does nothing."""
    path = tmp_path / "policy.yaml"
    path.write_text(
        "deployments:\n"
        "  a: {model: m, api_base: 'http://127.0.0.1:9/v1', requires: [tools, vision]}\n"
        "routes:\n  auto: {deployments: [a]}\n"
    )
    policy = load_policy(path, env={}).policy
    assert (
        "deployment 'a': requires is ignored (it never took effect); capabilities says what "
        "a deployment serves"
    ) in unserved_notes(policy)


@pytest.mark.parametrize(
    "path",
    sorted([DEFAULT_POLICY_PATH, *EXAMPLES_DIR.glob("*.yaml")]),
    ids=lambda path: path.name,
)
def test_the_shipped_policies_still_load(path: Path) -> None:
    assert load_policy(path, env={}).policy.routes

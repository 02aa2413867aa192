"""`policy explain` on a `select` route says what the proxy does: the escalation chain
is shown when the answer will be verified, and not for a tool request, which the proxy
sends to its choice without climbing (`gateway.runtime.climbs`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import choice_summary, select_choice
from gateway.runtime import build_runtime, climbs
from policies import load_policy
from tests.gateway.select_fleet import PICK, PRICES, policy

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

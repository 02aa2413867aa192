"""A reload that brings an `autostart` engine says, as a warning, that it is not started:
`serve` starts its engines only as it starts."""

from __future__ import annotations

from pathlib import Path

from policies import Policy, load_policy
from policies.changes import policy_changes

POLICY = """\
engines:
  fake:
    model: fake-model
    port: 8101
    autostart: true
deployments:
  local:
    engine: fake
    model: fake-model
routes:
  auto:
    deployments: [local]
"""
FAKE2 = """\
  fake2:
    model: fake-model-2
    port: 8102
"""
NOT_STARTED = (
    "engine 'fake2' has autostart but is not started until the gateway restarts "
    "(a reload starts no engine; or run `cascade-gateway engine up --engine fake2`)"
)


def load(tmp_path: Path, engines: str = "", text: str = POLICY) -> Policy:
    path = tmp_path / "policy.yaml"
    path.write_text(text.replace("deployments:\n", engines + "deployments:\n", 1))
    return load_policy(path).policy


def test_an_autostart_engine_added_is_said_not_started(tmp_path: Path) -> None:
    changes = policy_changes(load(tmp_path), load(tmp_path, FAKE2 + "    autostart: true\n"))
    assert changes.changed == ("engine 'fake2' added",)
    assert changes.warnings == (NOT_STARTED,)


def test_autostart_turned_on_is_said_not_started(tmp_path: Path) -> None:
    changes = policy_changes(load(tmp_path, FAKE2), load(tmp_path, FAKE2 + "    autostart: true\n"))
    assert changes.changed == ("engine 'fake2' changed: autostart",)
    assert changes.warnings == (NOT_STARTED,)


def test_an_engine_without_autostart_or_autostarted_already_warns_nothing(tmp_path: Path) -> None:
    assert policy_changes(load(tmp_path), load(tmp_path, FAKE2)).warnings == ()
    moved = load(tmp_path, text=POLICY.replace("port: 8101", "port: 8103"))
    changes = policy_changes(load(tmp_path), moved)
    assert "engine 'fake' changed: port" in changes.changed
    assert changes.warnings == ()

"""PolicyReloader: good edits are applied, bad ones rejected while the old policy serves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from policies import LoadedPolicy, PolicyError, PolicyReloader, load_policy
from policies.document import FieldPath
from policies.sections import Sections

POLICY = """\
deployments:
  a:
    model: {model}
    api_base: http://127.0.0.1:9/v1
    api_key: ${{SECRET}}
routes:
  auto:
    deployments: [a]
"""
ENV = {"SECRET": "fake-reloader-secret"}
CLASSIFIER_POLICY = """\
deployments:
  a: {model: m1, api_base: "http://127.0.0.1:9/v1", tier: cheap}
  b: {model: m2, api_base: "http://127.0.0.1:9/v1", tier: premium}
routes:
  auto:
    strategy: classifier
    deployments: [a, b]
    tiers: [{tier: cheap, below: 0.5}, {tier: premium}]
"""


def write(path: Path, model: str = "m1", text: str | None = None) -> None:
    path.write_text(POLICY.format(model=model) if text is None else text)


def model_of(loaded: LoadedPolicy) -> str:
    return loaded.policy.deployments["a"].model


@pytest.fixture
def path(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    write(path)
    return path


async def test_good_edit_is_applied(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV, initial=load_policy(path, env=ENV))
    assert await reloader.check_now() is False
    write(path, model="m2")
    assert await reloader.check_now() is True
    assert [model_of(loaded) for loaded in applied] == ["m2"]
    assert reloader.current is applied[-1]
    assert await reloader.check_now() is False


async def test_first_check_loads_without_an_initial_policy(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV)
    assert await reloader.check_now() is True
    assert [model_of(loaded) for loaded in applied] == ["m1"]


async def test_an_edit_the_install_cannot_serve_is_rejected(path: Path) -> None:
    """The reloader asks the caller's install check, as `load_policy` does."""
    applied: list[LoadedPolicy] = []

    def features_missing(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
        for name, route in (sections.routes or {}).items():
            if route is not None and route.classifier == "features":
                yield ("routes", name, "classifier"), "not installed"

    reloader = PolicyReloader(path, applied.append, env=ENV, install_check=features_missing)
    write(path, text=CLASSIFIER_POLICY)
    with pytest.raises(PolicyError, match="not installed"):
        await reloader.reload_now()
    assert applied == []


async def test_bad_edit_is_rejected_and_the_last_good_policy_kept(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    applied: list[LoadedPolicy] = []
    initial = load_policy(path, env=ENV)
    reloader = PolicyReloader(path, applied.append, env=ENV, initial=initial)
    write(path, text=POLICY.format(model="m2").replace("deployments: [a]", "deployments: [zz]"))
    with caplog.at_level(logging.ERROR, logger="policies.reloader"):
        assert await reloader.check_now() is False
        assert await reloader.check_now() is False  # same bad file: not retried
    assert applied == []
    assert reloader.current is initial
    assert reloader.last_error is not None
    assert "routes.auto.deployments.0" in str(reloader.last_error)
    assert len(caplog.records) == 1
    assert ENV["SECRET"] not in caplog.text

    write(path, model="m3")
    assert await reloader.check_now() is True
    assert reloader.last_error is None
    assert [model_of(loaded) for loaded in applied] == ["m3"]


async def test_undoing_a_bad_edit_clears_the_error(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV, initial=load_policy(path, env=ENV))
    write(path, text="deployments: [")
    assert await reloader.check_now() is False
    assert reloader.last_error is not None
    write(path)
    assert await reloader.check_now() is False
    assert reloader.last_error is None
    assert applied == []


async def test_deleted_file_keeps_the_policy(path: Path) -> None:
    initial = load_policy(path, env=ENV)
    reloader = PolicyReloader(path, lambda _: None, env=ENV, initial=initial)
    path.unlink()
    assert await reloader.check_now() is False
    assert reloader.last_error is not None
    assert reloader.current is initial


async def test_a_deleted_file_put_back_unchanged_clears_the_error(path: Path) -> None:
    """As a ConfigMap's files vanish and return: the alert must not stay on for good."""
    reloader = PolicyReloader(path, lambda _: None, env=ENV, initial=load_policy(path, env=ENV))
    text = path.read_text()
    path.unlink()
    assert await reloader.check_now() is False
    assert reloader.last_error is not None
    path.write_text(text)
    assert await reloader.check_now() is False  # the serving policy: nothing to apply
    assert reloader.last_error is None


async def test_a_file_put_back_after_a_failed_operator_reload_clears_the_error(
    path: Path,
) -> None:
    reloader = PolicyReloader(path, lambda _: None, env=ENV, initial=load_policy(path, env=ENV))
    text = path.read_text()
    path.unlink()
    with pytest.raises(PolicyError):
        await reloader.reload_now()
    path.write_text(text)
    assert await reloader.check_now() is False
    assert reloader.last_error is None


async def test_each_operator_reload_that_fails_is_counted(path: Path) -> None:
    rejected: list[PolicyError] = []
    reloader = PolicyReloader(
        path, lambda _: None, env=ENV, initial=load_policy(path, env=ENV), on_reject=rejected.append
    )
    path.unlink()
    assert await reloader.check_now() is False
    assert await reloader.check_now() is False  # the same problem polled again: once
    with pytest.raises(PolicyError):
        await reloader.reload_now()  # asked for: counted again
    assert len(rejected) == 2


async def test_an_edited_reload_interval_applies(path: Path) -> None:
    reloader = PolicyReloader(path, lambda _: None, env=ENV, initial=load_policy(path, env=ENV))
    path.write_text(path.read_text() + "gateway: {reload_interval_s: 60}\n")
    assert await reloader.check_now() is True
    assert reloader.interval_s == 60


async def test_reload_now(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV)
    assert model_of(await reloader.reload_now()) == "m1"
    write(path, text="routes: {}\n")
    with pytest.raises(PolicyError, match="deployments"):
        await reloader.reload_now()
    assert reloader.last_error is not None
    assert [model_of(loaded) for loaded in applied] == ["m1"]


async def test_polling_task_applies_edits(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, interval_s=0.01, env=ENV)
    reloader.start()
    try:
        for _ in range(500):
            if applied:
                break
            await asyncio.sleep(0.01)
    finally:
        await reloader.stop()
    assert [model_of(loaded) for loaded in applied] == ["m1"]

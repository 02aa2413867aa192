"""PolicyReloader: good edits are applied, bad ones rejected while the old policy serves."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
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
ENV = {"SECRET": "fake-reloader-secret", "CLIENT_KEY": "fake-reloader-client-key"}
QUICK = 0.01  # the settle time of reloaders checked by hand
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


# Keys and teams after the routes: the part before `keys:` is a valid policy by itself.
KEYED_POLICY = (
    POLICY.format(model="m2")
    + """\
keys:
  k: {secret: "${CLIENT_KEY}", team: research}
teams:
  research: {}
"""
)


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
    reloader = PolicyReloader(
        path, applied.append, env=ENV, settle_s=QUICK, initial=load_policy(path, env=ENV)
    )
    assert await reloader.check_now() is False
    write(path, model="m2")
    assert await reloader.check_now() is True
    assert [model_of(loaded) for loaded in applied] == ["m2"]
    assert reloader.current is applied[-1]
    assert await reloader.check_now() is False


async def test_first_check_loads_without_an_initial_policy(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV, settle_s=QUICK)
    assert await reloader.check_now() is True
    assert [model_of(loaded) for loaded in applied] == ["m1"]


async def test_an_edit_the_install_cannot_serve_is_rejected(path: Path) -> None:
    """The reloader asks the caller's install check, as `load_policy` does."""
    applied: list[LoadedPolicy] = []

    def features_missing(sections: Sections) -> Iterator[tuple[FieldPath, str]]:
        for name, route in (sections.routes or {}).items():
            if route is not None and route.classifier == "features":
                yield ("routes", name, "classifier"), "not installed"

    reloader = PolicyReloader(
        path, applied.append, env=ENV, settle_s=QUICK, install_check=features_missing
    )
    write(path, text=CLASSIFIER_POLICY)
    with pytest.raises(PolicyError, match="not installed"):
        await reloader.reload_now()
    assert applied == []


async def test_bad_edit_is_rejected_and_the_last_good_policy_kept(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    applied: list[LoadedPolicy] = []
    initial = load_policy(path, env=ENV)
    reloader = PolicyReloader(path, applied.append, env=ENV, settle_s=QUICK, initial=initial)
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
    reloader = PolicyReloader(
        path, applied.append, env=ENV, settle_s=QUICK, initial=load_policy(path, env=ENV)
    )
    write(path, text="deployments: [")
    assert await reloader.check_now() is False
    assert reloader.last_error is not None
    write(path)
    assert await reloader.check_now() is False
    assert reloader.last_error is None
    assert applied == []


async def test_deleted_file_keeps_the_policy(path: Path) -> None:
    initial = load_policy(path, env=ENV)
    reloader = PolicyReloader(path, lambda _: None, env=ENV, settle_s=QUICK, initial=initial)
    path.unlink()
    assert await reloader.check_now() is False
    assert reloader.last_error is not None
    assert reloader.current is initial


async def test_a_deleted_file_put_back_unchanged_clears_the_error(path: Path) -> None:
    """As a ConfigMap's files vanish and return: the alert must not stay on for good."""
    reloader = PolicyReloader(
        path, lambda _: None, env=ENV, settle_s=QUICK, initial=load_policy(path, env=ENV)
    )
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
    reloader = PolicyReloader(
        path, lambda _: None, env=ENV, settle_s=QUICK, initial=load_policy(path, env=ENV)
    )
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
        path,
        lambda _: None,
        env=ENV,
        settle_s=QUICK,
        initial=load_policy(path, env=ENV),
        on_reject=rejected.append,
    )
    path.unlink()
    assert await reloader.check_now() is False
    assert await reloader.check_now() is False  # the same problem polled again: once
    with pytest.raises(PolicyError):
        await reloader.reload_now()  # asked for: counted again
    assert len(rejected) == 2


async def test_an_edited_reload_interval_applies(path: Path) -> None:
    reloader = PolicyReloader(
        path, lambda _: None, env=ENV, settle_s=QUICK, initial=load_policy(path, env=ENV)
    )
    path.write_text(path.read_text() + "gateway: {reload_interval_s: 60}\n")
    assert await reloader.check_now() is True
    assert reloader.interval_s == 60


async def test_reload_now(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, env=ENV, settle_s=QUICK)
    assert model_of(await reloader.reload_now()) == "m1"
    write(path, text="routes: {}\n")
    with pytest.raises(PolicyError, match="deployments"):
        await reloader.reload_now()
    assert reloader.last_error is not None
    assert [model_of(loaded) for loaded in applied] == ["m1"]


async def test_polling_task_applies_edits(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(path, applied.append, interval_s=0.01, env=ENV, settle_s=QUICK)
    reloader.start()
    try:
        for _ in range(500):
            if applied:
                break
            await asyncio.sleep(0.01)
    finally:
        await reloader.stop()
    assert [model_of(loaded) for loaded in applied] == ["m1"]


async def until(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def polling(
    path: Path, on_reload: Callable[[LoadedPolicy], None], interval_s: float, settle_s: float
) -> tuple[PolicyReloader, list[PolicyError]]:
    """A started reloader serving the file as it is now, and the rejections it reports."""
    rejected: list[PolicyError] = []
    reloader = PolicyReloader(
        path,
        on_reload,
        interval_s=interval_s,
        env=ENV,
        initial=load_policy(path, env=ENV),
        on_reject=rejected.append,
        settle_s=settle_s,
    )
    reloader.start()
    return reloader, rejected


async def test_a_file_rewritten_in_place_is_never_applied_half_written(path: Path) -> None:
    """As an SRE saw: a poll read the first part of an in-place rewrite, a valid policy
    without its keys and teams, and applied it; clients got 401 until the next poll."""
    half = KEYED_POLICY[: KEYED_POLICY.index("keys:")]
    (path.parent / "half.yaml").write_text(half)
    assert not load_policy(path.parent / "half.yaml", env=ENV).policy.keys  # valid, keyless
    applied: list[LoadedPolicy] = []
    reloader, rejected = polling(path, applied.append, interval_s=0.02, settle_s=0.3)
    try:
        with path.open("w") as stream:  # truncate, write part, flush, pause, write the rest
            stream.write(half)
            stream.flush()
            await asyncio.sleep(0.1)  # five polls' worth
            stream.write(KEYED_POLICY[len(half) :])
        await until(lambda: applied)
        await asyncio.sleep(0.1)
    finally:
        await reloader.stop()
    assert [list(loaded.policy.keys) for loaded in applied] == [["k"]]
    assert rejected == [] and reloader.last_error is None


async def test_an_edit_applies_within_the_interval_and_the_settle(path: Path) -> None:
    interval_s, settle_s = 0.05, 0.1
    applied: list[LoadedPolicy] = []
    reloader, _ = polling(path, applied.append, interval_s, settle_s)
    try:
        started = time.monotonic()
        write(path, model="m2")
        await until(lambda: applied)
        took = time.monotonic() - started
    finally:
        await reloader.stop()
    assert [model_of(loaded) for loaded in applied] == ["m2"]
    assert settle_s <= took < interval_s + settle_s + 0.5  # slack for a busy machine


async def test_a_file_that_keeps_changing_is_applied_once_it_has_settled(path: Path) -> None:
    settle_s = 0.2
    applied: list[LoadedPolicy] = []
    applied_at: list[float] = []

    def on_reload(loaded: LoadedPolicy) -> None:
        applied.append(loaded)
        applied_at.append(time.monotonic())

    reloader, rejected = polling(path, on_reload, interval_s=0.02, settle_s=settle_s)
    try:
        for n in range(2, 12):  # a new version every quarter settle, each written in place
            if n > 2:
                await asyncio.sleep(settle_s / 4)
            write(path, model=f"m{n}")
        last_write = time.monotonic()
        assert applied == []
        await until(lambda: applied)
        await asyncio.sleep(0.1)
    finally:
        await reloader.stop()
    assert [model_of(loaded) for loaded in applied] == ["m11"]
    assert applied_at[0] - last_write >= settle_s - 0.01
    assert rejected == []  # the truncated moments of each write were never read twice


async def test_a_change_that_changes_again_while_settling_is_not_tried(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(
        path, applied.append, env=ENV, initial=load_policy(path, env=ENV), settle_s=0.2
    )
    write(path, text="deployments: [")  # a broken moment of an edit
    check = asyncio.create_task(reloader.check_now())
    await asyncio.sleep(0.05)
    write(path, model="m2")
    assert await check is False
    assert reloader.last_error is None and applied == []
    assert await reloader.check_now() is True
    assert [model_of(loaded) for loaded in applied] == ["m2"]


async def test_an_operator_reload_applies_at_once_while_a_poll_settles(path: Path) -> None:
    applied: list[LoadedPolicy] = []
    reloader = PolicyReloader(
        path, applied.append, env=ENV, initial=load_policy(path, env=ENV), settle_s=0.5
    )
    write(path, model="m2")
    check = asyncio.create_task(reloader.check_now())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert model_of(await reloader.reload_now()) == "m2"
    assert time.monotonic() - started < 0.3
    assert await check is False  # the reload took it: not applied twice
    assert [model_of(loaded) for loaded in applied] == ["m2"]

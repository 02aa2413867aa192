"""Helpers every test package shares: waiting for something to happen, and tests that
need data or tools this host may lack.

    eventually(lambda: metric(base, "cascade_limits_degraded") == 0, 5, "limits back")
    record = await eventually_async(lambda: store.get(record_id), 5, "the record")
    serving(process, lambda: httpx.get(url).is_success, 60, log.read_text)

    pytestmark = requires(sandbox.available(), "the sandbox")  # None, or why it is absent
    @requires(None if MODEL.exists() else f"{MODEL} is absent", "the shipped model")

A test that needs what is missing is skipped, except under `CI=true`, where it fails:
CI has everything installed, so a skip there would hide a broken set-up.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar, overload

import httpx
import pytest

T = TypeVar("T")

POLL_S = 0.01


def eventually(
    check: Callable[[], T], timeout_s: float = 5.0, what: str = "", every_s: float = POLL_S
) -> T:
    """Call `check` every `every_s` until it returns something truthy, and return that;
    AssertionError naming `what` once `timeout_s` have passed."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        time.sleep(every_s)
    return value


@overload
async def eventually_async(
    check: Callable[[], Awaitable[T]], timeout_s: float = ..., what: str = ..., every_s: float = ...
) -> T: ...


@overload
async def eventually_async(
    check: Callable[[], T], timeout_s: float = ..., what: str = ..., every_s: float = ...
) -> T: ...


async def eventually_async(
    check: Callable[[], object],
    timeout_s: float = 5.0,
    what: str = "",
    every_s: float = POLL_S,
) -> object:
    """`eventually` on the running loop: `check` may be a coroutine function, and the
    loop runs other tasks between calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}")
        await asyncio.sleep(every_s)


def serving(
    process: subprocess.Popen[Any],
    check: Callable[[], bool],
    timeout_s: float,
    output: Callable[[], object] = lambda: "",
) -> None:
    """`eventually(check)` for a server `process` starting: a refused connection means not
    yet; the process exiting fails at once, with its `output()`."""

    def up() -> bool:
        if process.poll() is not None:
            pytest.fail(f"{process.args} exited with {process.returncode}: {output()}")
        try:
            return check()
        except httpx.TransportError:
            return False

    eventually(up, timeout_s, f"{process.args} to serve", every_s=0.1)


def unavailable(message: str) -> NoReturn:
    """Skip the test for want of `message`'s data or tool; fail it under `CI=true`."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (required under CI=true)")
    pytest.skip(message)


def requires(missing: str | None, what: str) -> pytest.MarkDecorator:
    """A mark for tests that need `what`: `missing` says why it is absent, None if it is
    there. Checked at set-up (tests/conftest.py), skipped or failed by `unavailable`."""
    return pytest.mark.requires(missing=missing, what=what)

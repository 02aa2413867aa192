"""`gateway.tasks.stop_tasks`: a background task that eats a cancel (as asyncio.timeout
can on Python 3.11) is cancelled again, and a shutdown never waits on it for good."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tasks import stop_tasks


async def test_a_task_that_eats_a_cancel_is_cancelled_again() -> None:
    eaten = 0

    async def poll() -> None:
        nonlocal eaten
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                eaten += 1
                if eaten == 1:
                    continue  # as a timeout that met the cancel would
                raise

    task = asyncio.create_task(poll())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks(task, None, every_s=0.05), 5)
    assert task.cancelled() and eaten == 2


async def test_a_task_that_never_stops_is_reported_not_waited_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    released = False

    async def stubborn() -> None:
        while not released:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    await asyncio.wait_for(stop_tasks(task, every_s=0.01, attempts=3), 5)
    assert not task.done()
    assert "background task stubborn did not stop" in caplog.text
    released = True  # the test's own clean-up
    task.cancel()
    await asyncio.wait([task])


async def test_a_failed_task_is_logged_and_a_cancelled_stop_is_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fail(), name="failing")
    await asyncio.sleep(0)
    await stop_tasks(failed)
    assert "background task failing failed" in caplog.text

    sleeping = asyncio.create_task(asyncio.sleep(10))
    stopping = asyncio.create_task(stop_tasks(sleeping))
    await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping

"""Stopping background tasks (pollers, scrapers, writers) at shutdown.

A cancel can be eaten below a task: on Python 3.11 `asyncio.timeout`, which redis-py
and httpx time their reads with, turns a cancel that meets its deadline into
TimeoutError, and a `while True` loop that logs it carries on. Awaiting such a task
would hold a shutdown for good, so the cancel is repeated until the task ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def stop_tasks(
    *tasks: asyncio.Task[Any] | None, every_s: float = 1.0, attempts: int = 10
) -> None:
    """Cancel `tasks` (None: none) and wait until they end, cancelling again every
    `every_s`; a cancel of the caller goes through. Tasks must tolerate a second cancel
    (no cleanup to finish after the first)."""
    live = [task for task in tasks if task is not None]
    for _ in range(attempts):
        pending = [task for task in live if not task.done()]
        if not pending:
            break
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=every_s)
    for task in live:
        if not task.done():
            log.error("background task %s did not stop", task.get_name())
        elif not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

"""Background tasks (pollers, scrapers, writers): started apart from any request, and
stopped at shutdown.

A task copies the context it is created in. One started lazily while a request is
served (the ledger's writer, the limiter's) would carry that request's context, its id
on every log line (`gateway.http.request_ids`), for as long as it runs:
`start_background` starts it in a context of its own.

A cancel can be eaten below a task: on Python 3.11 `asyncio.timeout`, which redis-py
and httpx time their reads with, turns a cancel that meets its deadline into
TimeoutError, and a `while True` loop that logs it carries on. Awaiting such a task
would hold a shutdown for good, so the cancel is repeated until the task ends.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def start_background(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`coro` as a task of the running loop, in a fresh context (no request's)."""
    return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())


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

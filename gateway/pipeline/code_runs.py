"""A cascade answer's code run against the examples it claims, for the verifier (a
route's `run_code_examples`): in the sandbox (`router.sandbox`), from a worker thread.

Each run is a child process (~100 ms); at most `MAX_RUNNING` at once and `MAX_WAITING`
queued behind them (more: "busy", verified without a run). Queue and run together
take at most half the request's time left (and `sandbox.WALL_SECONDS`), so answers
whose code sleeps cannot hold another request's check until its deadline and leave
its escalation no time. A run that cannot start is logged and counted, and the
answer verified without it: the request goes on.

    run = await run_code(endpoint, body, reply, ends_at)  # ExampleRun or None
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from gateway.pipeline.scoring import answer_parts, prompt_text, question_text
from gateway.upstreams.base import EndpointType
from router import sandbox

if TYPE_CHECKING:
    from router.code_examples import ExampleRun

log = logging.getLogger(__name__)

MAX_RUNNING = 4
MAX_WAITING = 4
MIN_RUN_SECONDS = 0.2  # less left before the check's end: verify without running
CHECK_SHARE = 0.5  # of the request's time left, for queue and run together
_THREADS = ThreadPoolExecutor(max_workers=MAX_RUNNING, thread_name_prefix="sandbox")
# A place for each run in the pool (running or queued) of this process, abandoned ones
# included until the pool drops them.
_PLACES = threading.BoundedSemaphore(MAX_RUNNING + MAX_WAITING)

OutcomeType = Literal["held", "failed", "none", "busy", "error"]


async def run_code(
    endpoint: EndpointType, body: Mapping[str, Any], reply: Mapping[str, Any], ends_at: float
) -> tuple[ExampleRun | None, OutcomeType]:
    """The answer's code run against its claims before ``ends_at`` (time.monotonic()),
    and the outcome for the metric; None when it claims nothing (or is not Python),
    the deadline came first, every place was taken, or the run broke."""
    budget = min(sandbox.WALL_SECONDS, (ends_at - time.monotonic()) * CHECK_SHARE)
    if budget < MIN_RUN_SECONDS:
        return None, "none"
    if not _PLACES.acquire(blocking=False):
        return None, "busy"
    check_ends = time.monotonic() + budget
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(_THREADS, _run_before, endpoint, body, reply, check_ends)
    future.add_done_callback(lambda _: _PLACES.release())  # when the pool is done with it
    try:
        # A run still queued at the check's end starts as nothing (`_run_before`); a
        # quarter more lets a run cut off at the end be killed and read.
        run = await asyncio.wait_for(asyncio.shield(future), budget * 1.25)
    except TimeoutError:
        return None, "none"
    except (OSError, RuntimeError):  # SandboxUnavailable is a RuntimeError
        log.exception("code examples not run; verifying without them")
        return None, "error"
    if run is None:
        return None, "none"
    return run, "held" if run.held else "failed"


def _run_before(
    endpoint: EndpointType, body: Mapping[str, Any], reply: Mapping[str, Any], ends_at: float
) -> ExampleRun | None:
    """In the worker: reading the answer is text work (kept off the event loop), and
    the time left is taken when the run's turn comes, not when it was queued (a run
    whose check gave up in the queue reads nothing)."""
    if ends_at - time.monotonic() < MIN_RUN_SECONDS:
        return None
    text, _, _ = answer_parts(reply)
    from router.verifier import code_job  # with the verifier's text checks

    job = code_job(prompt_text(endpoint, body), text, question_text(endpoint, body))
    seconds = ends_at - time.monotonic()
    if job is None or seconds < MIN_RUN_SECONDS:
        return None
    return sandbox.run_examples(job, wall_seconds=min(sandbox.WALL_SECONDS, seconds))

"""A cascade answer's code run against the examples it claims, for the verifier (a
route's `run_code_examples`): in the sandbox (`router.sandbox`), from a worker thread.

Each run is a child process (~100 ms); at most `MAX_RUNNING` at once, and a request
whose deadline comes before its turn verifies without one. A run that cannot start
is logged and counted, and the answer verified without it: the request goes on.

    run = await run_code(endpoint, body, reply, ends_at)  # ExampleRun or None
"""

from __future__ import annotations

import asyncio
import logging
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
MIN_RUN_SECONDS = 0.2  # less left before the deadline: verify without running
_THREADS = ThreadPoolExecutor(max_workers=MAX_RUNNING, thread_name_prefix="sandbox")

OutcomeType = Literal["held", "failed", "none", "error"]


async def run_code(
    endpoint: EndpointType, body: Mapping[str, Any], reply: Mapping[str, Any], ends_at: float
) -> tuple[ExampleRun | None, OutcomeType]:
    """The answer's code run against its claims before ``ends_at`` (time.monotonic()),
    and the outcome for the metric; None when it claims nothing (or is not Python),
    the deadline came first, or the run broke."""
    loop = asyncio.get_running_loop()
    try:
        run = await loop.run_in_executor(_THREADS, _run_before, endpoint, body, reply, ends_at)
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
    the time left is taken when the run's turn comes, not when it was queued."""
    text, _, _ = answer_parts(reply)
    from router.verifier import code_job  # with the verifier's text checks

    job = code_job(prompt_text(endpoint, body), text, question_text(endpoint, body))
    seconds = ends_at - time.monotonic()
    if job is None or seconds < MIN_RUN_SECONDS:
        return None
    return sandbox.run_examples(job, wall_seconds=min(sandbox.WALL_SECONDS, seconds))

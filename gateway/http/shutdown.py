"""What the client of a request still running when the shutdown grace ends gets.

At the end of `CASCADE_SHUTDOWN_GRACE_S` uvicorn cancels the tasks of the requests
still running (`Server.shutdown`), then runs the lifespan's shutdown at once, without
waiting for them; a task that ends in an exception before its response started gets a
bare `500 text/plain` from uvicorn (`RequestResponseCycle.run_asgi`), one whose
response started has its connection closed. The cancellation goes through the pipeline
as any other, which prices what was in flight (`gateway.pipeline.executor`,
`gateway.pipeline.proxy`) and settles a relayed stream (`gateway.pipeline.streaming`).

`Requests.serve` is the app's outermost layer. There, and only for a request whose task
is cancelled from outside after a shutdown signal reached the process (noted ahead of
uvicorn's own handlers, `Requests.watch_shutdown`: never a cancellation the pipeline
raised for its own reasons, nor one of an app run in-process), the client is told
instead of uvicorn's 500:

- a response not started yet: 503 `shutting_down` in its API's error shape, with
  `Retry-After` and its `x-request-id`;
- an event stream under way: the in-band error event that ends it (OpenAI's
  `data: {"error": ...}`, the Messages API's `event: error`); a Responses API stream
  (whose events are numbered) and any other response are cut as before.

Then the task ends there: uvicorn awaits nothing after the cancel. The lifespan waits
(`Requests.settled`) for the requests it cancelled to get that far, so what they priced
is queued on the ledger before the ledger flushes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import GatewayError, retry_after_header
from gateway.http.bridges import MESSAGES_PATH
from gateway.native.formats import messages_error_event

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1.0  # another replica (or this one, restarted) takes it
SETTLE_WAIT_S = 2.0  # at most, for the cancelled requests to price what they had in flight
OPENAI_STREAM_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})

Render = Callable[[Request, GatewayError], Response]


class ShuttingDown(GatewayError):
    status = 503
    default_code = "shutting_down"

    def __init__(self) -> None:
        super().__init__(
            "the gateway is shutting down; retry", headers=retry_after_header(RETRY_AFTER_S)
        )


class _Sent:
    """`send`, noting how far the response went."""

    __slots__ = ("_send", "complete", "events", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.events = False  # a `text/event-stream` response
        self.complete = False

    async def __call__(self, message: Message) -> None:
        await self._send(message)  # noted once sent: a send cut short wrote nothing
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            self.events = _event_stream(message.get("headers", ()))
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.complete = True


class Requests:
    """The HTTP requests in progress in this process, served by `serve`."""

    def __init__(self) -> None:
        self.running = 0
        # A shutdown signal reached this process: a cancel from outside is then the end
        # of the server's grace, not an embedding's timeout or another server's habit.
        self.stopping = False

    def watch_shutdown(self) -> Callable[[], None]:
        """Note SIGTERM and SIGINT, before the server's own handlers run them (uvicorn's,
        installed by now: the lifespan starts inside them); returns what puts them back.
        Does nothing off the main thread or where no handler is set (not under a server)."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        chained: dict[int, Callable[[int, FrameType | None], Any]] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            handler = signal.getsignal(signum)
            if callable(handler):
                chained[signum] = handler
                signal.signal(signum, functools.partial(self._noted, handler))

        def restore() -> None:
            for signum, handler in chained.items():
                signal.signal(signum, handler)

        return restore

    def _noted(
        self, handler: Callable[[int, FrameType | None], Any], signum: int, frame: FrameType | None
    ) -> None:
        self.stopping = True
        handler(signum, frame)

    async def serve(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send, render: Render
    ) -> None:
        """Serve one HTTP request with `app`; `render`: an error as its client gets it."""
        sent = _Sent(send)
        self.running += 1
        try:
            await app(scope, receive, sent)
        except asyncio.CancelledError:
            if sent.complete or not (self.stopping and _cancelled_from_outside()):
                raise
            if not await _tell_client(scope, receive, send, sent, render):
                raise
            # Answered: the task ends here (the server awaits nothing after its cancel).
        finally:
            self.running -= 1

    async def settled(self, timeout_s: float = SETTLE_WAIT_S) -> None:
        """Wait (at most `timeout_s`) until no request is in progress: at the lifespan's
        shutdown, those the server cancelled are still pricing and answering."""
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.running:
            log.warning("%d request(s) still running after the shutdown", self.running)


def _cancelled_from_outside() -> bool:
    """Is this task being cancelled from outside? After a shutdown signal, under uvicorn,
    that is the end of the grace: the pipeline's own cancellations (timeouts, losing
    hedges, task groups) are taken back (`uncancel`) where they are caught."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _tell_client(
    scope: Scope, receive: Receive, send: Send, sent: _Sent, render: Render
) -> bool:
    """Tell the client of a request cut off by the shutdown; False if it cannot be."""
    request = Request(scope, receive)
    error = ShuttingDown()
    request_id = getattr(request.state, "request_id", None)
    try:
        if not sent.started:
            await render(request, error)(scope, receive, send)
            told = "503 shutting_down"
        elif sent.events and (event := _error_event(scope["path"], error)) is not None:
            await send({"type": "http.response.body", "body": event, "more_body": False})
            told = "its stream ended with an error event"
        else:
            return False
    except Exception:  # the connection is gone, say: uvicorn ends it as before
        log.exception("answering request %s at shutdown failed", request_id)
        return False
    log.warning("request %s was still running when the shutdown grace ended: %s", request_id, told)
    return True


def _error_event(path: str, error: GatewayError) -> bytes | None:
    """The in-band event that ends a stream at `path` with `error` (None: none is sent)."""
    if path in OPENAI_STREAM_PATHS:
        return b"data: " + orjson.dumps(error.body()) + b"\n\n"
    if path == MESSAGES_PATH:
        return messages_error_event(error.message)
    return None


def _event_stream(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"content-type" and value.startswith(b"text/event-stream")
        for name, value in headers
    )

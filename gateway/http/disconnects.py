"""A request whose client hangs up before its answer is cancelled, not finished.

Once a request's body is read, nothing else arrives on its ASGI `receive` channel
but `http.disconnect`; uvicorn (ASGI 2.3) says nothing otherwise, so a handler that
never reads it works on for a client that is gone: retries, falls back to other
(dearer) deployments, and pays for their answers. `serve_watched` reads the channel
for it, as Starlette's `StreamingResponse` does, from the moment the app has read the
body:

- before the response starts, the disconnect cancels the request's task: the pipeline
  prices what it had in flight (the upstream had the prompt) and records the request
  once, as `cancelled` (`gateway.request.client_left` tells it from the shutdown
  grace's cancellation, an `error`), and the cancellation ends here;
- after it started (a relayed stream), the app's own reads of `receive` learn of it
  and end the stream, which settles as a stream cut short by its client.

Only the APIs that call upstreams are watched (`POST /v1/...`); the app reads
`receive` through the watch, which alone reads the server's once the body is in.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.request import client_left

log = logging.getLogger(__name__)

WATCHED_PREFIX = "/v1/"
DISCONNECT: Message = {"type": "http.disconnect"}


class _Watch:
    """The request's `receive` and `send` as the app sees them, and the task that reads
    the server's `receive` for the disconnect once the body is in."""

    def __init__(self, receive: Receive, send: Send, task: asyncio.Task[object]) -> None:
        self._receive = receive
        self._send = send
        self._task = task  # the request's, cancelled when its client goes first
        self._watcher: asyncio.Task[None] | None = None
        self.gone = asyncio.Event()
        self.started = False  # the response started: it is the app's to end
        self.running = True  # the app has not returned
        self.cancelled = False  # this watch cancelled the request

    async def receive(self) -> Message:
        if self._watcher is not None:  # the body is in: only the disconnect is left
            await self.gone.wait()
            return DISCONNECT
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.gone.set()
        elif not message.get("more_body", False):
            self._watcher = asyncio.create_task(self._watch())
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        # Runs only while the request's task waits, so a cancel lands in the app: the
        # flag is cleared, with no await, as soon as the app returns. A task already
        # being cancelled (the shutdown grace) is not cancelled again in its cleanup.
        if self.running and not self.started and not self._task.cancelling():
            self.cancelled = True
            self._task.cancel("the client disconnected")

    def stop(self) -> None:
        self.running = False
        if self._watcher is not None:
            self._watcher.cancel()


async def serve_watched(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one HTTP request with `app`, cancelling it if its client disconnects
    before the response starts (only for `POST /v1/...`: the APIs that call upstreams)."""
    task = asyncio.current_task()
    if task is None or scope["method"] != "POST" or not scope["path"].startswith(WATCHED_PREFIX):
        await app(scope, receive, send)
        return
    watch = _Watch(receive, send, task)
    left = client_left.set(lambda: watch.cancelled)
    try:
        await app(scope, watch.receive, watch.send)
    except asyncio.CancelledError:
        # Ours alone ends here; one from outside as well (the shutdown grace) goes on.
        if not watch.cancelled or task.uncancel() > 0:
            raise
        log.info("the client of %s went away before its answer: cancelled", scope["path"])
    else:
        if watch.cancelled:  # the app took the cancel in and returned: taken back
            task.uncancel()
    finally:
        watch.stop()  # no await since the app returned: the watch cancels no more
        client_left.reset(left)

"""The engine on a thread of its own, and asyncio streams of its outputs.

    runner = EngineRunner(engine); runner.start()
    async for output in runner.generate(request): ...
    runner.stop()

A stream that is closed early (the client went away) aborts its request, so the slot
frees at the next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

from local_engine.cpu.engine import Engine
from local_engine.cpu.errors import CpuEngineError
from local_engine.cpu.sequence import Output, Request

STOP_TIMEOUT_S = 10.0


class EngineRunner:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cpu-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
            self._thread = None

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def generate(self, request: Request) -> AsyncGenerator[Output, None]:
        """Outputs of `request` as the engine produces them, the last with finish_reason."""
        if not self.is_alive():
            raise CpuEngineError("the engine thread is not running")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Output] = asyncio.Queue()

        def sink(output: Output) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, output)

        self.engine.add(request, sink)
        finished = False
        try:
            while not finished:
                output = await queue.get()
                finished = output.finish_reason is not None
                yield output
        finally:
            if not finished:
                self.engine.abort(request.request_id)

    def _run(self) -> None:
        self.engine.run(self._stop)

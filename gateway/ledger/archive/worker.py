"""The exporter's own thread for its blocking work: parsing rows, writing and fsyncing
files, waiting for the directory lock.

Not the event loop's default pool: the request path uses that one (prompt counting),
and commits that queue for the lock must not take its threads. One thread per
exporter is enough: its streams' commits serialize on the directory lock anyway.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class FileWorker:
    """>>> worker = FileWorker(); rows = await worker.run(parse, raw)
    >>> worker.halt(); ...; worker.close()   # stopping: waits give up, then the thread ends"""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._stopping = threading.Event()  # read by work in the thread (lock waits)
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the worker's thread (started on first use)."""
        if self._pool is None:
            if self._closed:  # restarted after `close`; a `halt` before first use stays
                self._stopping.clear()
                self._closed = False
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ledger-archive")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args))

    def stopping(self) -> bool:
        """Whether `halt` was called: long waits in the thread give up."""
        return self._stopping.is_set()

    def halt(self) -> None:
        """Tell waits in the thread (for the directory lock) to give up."""
        self._stopping.set()

    def close(self) -> None:
        """`halt`, and let the thread end once its work is done (a later `run` starts a
        new one)."""
        self.halt()
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

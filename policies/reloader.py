"""Pick up policy edits without a restart; a bad edit never replaces a good policy.

    reloader = PolicyReloader(path, on_reload=state.use_policy, initial=loaded)
    reloader.start()           # polls every interval_s in an asyncio task
    ...
    await reloader.stop()

Each poll reads the files and compares their digest with the last one tried, so an
unchanged file costs a few small reads, and a broken file is reported once per edit,
not once per poll. A poll applies a change only once a second read, a settle time later,
finds the same bytes: a file rewritten in place can be read half-written, and a half
that happens to be a valid policy (all before `teams:`) would drop what follows it.
Reading and parsing run in worker threads, never on the event loop, and one check or
reload runs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from policies.errors import PolicyError
from policies.loader import (
    InstallCheck,
    LoadedPolicy,
    load_sources,
    read_sources,
    sources_digest,
)

log = logging.getLogger(__name__)

# A tool writes a policy file in milliseconds, so a pause in a rewrite is short; half a
# second outlasts a slow one's and adds a quarter to the default 2 s poll. It is capped
# at the interval so that a fast poll (0.1 s) stays fast.
SETTLE_S = 0.5


class PolicyReloader:
    """Polls a policy path and calls `on_reload` with each new valid policy.

    `last_error` holds the latest rejected edit (None once a good one loads); the policy
    passed to `on_reload` last keeps serving meanwhile.
    """

    def __init__(
        self,
        path: Path,
        on_reload: Callable[[LoadedPolicy], None],
        interval_s: float = 2.0,
        env: Mapping[str, str] | None = None,
        initial: LoadedPolicy | None = None,
        on_reject: Callable[[PolicyError], None] | None = None,
        install_check: InstallCheck | None = None,
        settle_s: float | None = None,
    ) -> None:
        self.path = path
        self.on_reload = on_reload
        self.on_reject = on_reject
        self.interval_s = interval_s
        self.env: Mapping[str, str] = os.environ if env is None else env
        self.install_check = install_check  # as `load_policy` takes it
        self.settle_s = settle_s  # None: min(SETTLE_S, interval_s), following the interval
        self.current = initial
        self.last_error: PolicyError | None = None
        self._tried_digest = initial.digest if initial is not None else None
        self._task: asyncio.Task[None] | None = None
        # A poll and /admin/reload each await a parse: unserialized, the slower one
        # could apply an older policy over a newer one.
        self._lock = asyncio.Lock()

    def start(self) -> None:
        """Start polling in the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._poll(), name="policy-reloader"
            )

    async def stop(self) -> None:
        """Stop polling and wait for the task to end."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def check_now(self) -> bool:
        """Load the policy if its files changed and then stayed the same for the settle
        time; True when a new policy was applied."""
        async with self._lock:
            first = await self._read_new()
        if first is None:
            return False
        # Unlocked meanwhile: an operator's reload need not wait behind a poll's settle.
        await asyncio.sleep(self._settle_s())
        async with self._lock:
            try:
                sources = await asyncio.to_thread(read_sources, self.path)
            except PolicyError:
                return False  # gone while settling: the next poll's read reports it
            # Changed again: still being written; the next poll looks again, nothing is
            # tried or reported yet. Not new: an operator's reload took it meanwhile.
            digest = sources_digest(sources)
            if digest != sources_digest(first):
                log.debug("policy %s changed while settling; the next poll looks again", self.path)
                return False
            if not self._is_new(digest):
                return False
            self._tried_digest = digest
            try:
                loaded = await asyncio.to_thread(self._load, sources)
            except PolicyError as exc:
                self._reject(exc)
                return False
            self._apply(loaded)
            return True

    async def reload_now(self) -> LoadedPolicy:
        """Load and apply the policy now, changed or not; raise PolicyError if it is bad.

        No settle: the operator asking has just saved the file and expects it now, and
        hears of a bad (even half-written) file in the answer, not from an alert later.
        """
        async with self._lock:
            try:
                sources = await self._read()
                self._tried_digest = sources_digest(sources)
                loaded = await asyncio.to_thread(self._load, sources)
            except PolicyError as exc:
                self._reject(exc, asked=True)
                raise
            self._apply(loaded)
            return loaded

    async def _read_new(self) -> list[tuple[Path, bytes]] | None:
        """The files if a poll has not tried them yet, else None (a read error rejected)."""
        try:
            sources = await self._read()
        except PolicyError as exc:
            self._reject(exc)
            return None
        return sources if self._is_new(sources_digest(sources)) else None

    def _is_new(self, digest: str) -> bool:
        if digest == self._tried_digest:
            return False
        if self.current is not None and digest == self.current.digest:
            self._tried_digest = digest
            if self.last_error is not None:  # a bad edit was undone
                self.last_error = None
                log.warning("policy %s is the serving policy again; edit undone", self.path)
            return False
        return True

    def _settle_s(self) -> float:
        return min(SETTLE_S, self.interval_s) if self.settle_s is None else self.settle_s

    async def _read(self) -> list[tuple[Path, bytes]]:
        try:
            return await asyncio.to_thread(read_sources, self.path)
        except PolicyError:
            # Gone or unreadable: whatever comes back next is new, even the serving
            # policy's own files (which then clear the error this leaves).
            self._tried_digest = None
            raise

    def _load(self, sources: list[tuple[Path, bytes]]) -> LoadedPolicy:
        return load_sources(sources, self.env, install_check=self.install_check)

    def _apply(self, loaded: LoadedPolicy) -> None:
        self.on_reload(loaded)
        previous, self.current = self.current, loaded
        interval = loaded.policy.gateway.reload_interval_s
        if previous is not None and interval != previous.policy.gateway.reload_interval_s:
            self.interval_s = interval  # an edit of the polling interval applies too
        self.last_error = None
        # on_reload logs what changed (the gateway: Services.apply); this says only when
        log.debug("policy applied from %s", ", ".join(map(str, loaded.source)))

    def _reject(self, exc: PolicyError, asked: bool = False) -> None:
        """Record a rejected edit; a poll meeting the same problem again (a missing
        file) is not another rejection, an operator's reload (`asked`) is."""
        if not asked and self.last_error is not None and str(self.last_error) == str(exc):
            return  # logged and counted already
        self.last_error = exc
        if self.on_reject is not None:
            self.on_reject(exc)
        log.error("policy %s rejected; the previous policy keeps serving:\n%s", self.path, exc)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check_now()
            except Exception:  # a bug must not end reloading for the process lifetime
                log.exception("policy reload check failed")

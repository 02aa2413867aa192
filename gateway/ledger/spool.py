"""A local file of spend records written while the ledger store is unreachable.

The file is JSON lines, one `SpendRecord` per line, each write flushed and fsynced.
`replay` first renames it to `<path>.replaying` (so appends go on into a fresh file),
sends every line to the store, and deletes the renamed file only once every line was
accepted. A crash or outage mid-replay leaves the file to be sent again; the store
de-duplicates on `record_id`, which makes the replay exactly-once while the record's
marker lives: for `window_s` (the store's dedupe window) after it was written. A line
spooled longer ago than that may have been written and forgotten, so it is not
replayed: it goes to `<path>.expired` (kept for a person to reconcile), logged and
counted (`expired`).

Writers take an exclusive `flock` on the spool file and replayers take it before the
rename, so an append never lands in a file that is already being replayed, even from
another worker process sharing the path; `<path>.lock` lets one replayer run at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.ledger.record import SpendRecord
from gateway.ledger.store import DEDUPE_WINDOW_S, LedgerStore

REPLAY_BATCH = 256  # records per pipelined write while replaying
SPOOLED_AT = "spooled_at"  # the field each line adds to its record

log = logging.getLogger(__name__)
T = TypeVar("T")


class Spool:
    """Append-only JSON-lines spool of `SpendRecord`s.

    `append` blocks for an fsync; call it from a thread (`asyncio.to_thread`).

    >>> spool = Spool(Path("/var/lib/cascade/spool.jsonl")); spool.append(rec)
    """

    def __init__(self, path: Path, window_s: float = DEDUPE_WINDOW_S) -> None:
        self.path = path
        self.window_s = window_s
        self.replaying_path = path.with_name(path.name + ".replaying")
        self.expired_path = path.with_name(path.name + ".expired")
        self._lock_path = path.with_name(path.name + ".lock")
        self._pending = _count_lines(self.replaying_path) + _count_lines(path)
        self.expired = _count_lines(self.expired_path)

    @property
    def pending(self) -> int:
        """Records spooled and not yet replayed (counted by this process)."""
        return self._pending

    def unwritable(self) -> str | None:
        """Why the spool cannot be written (None: it can), found by opening it and its
        lock file for appending, as the first append would."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for path in (self._lock_path, self.path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def append(self, rec: SpendRecord) -> None:
        """Write `rec` durably; raises OSError if the disk refuses it."""
        self.append_many([rec])

    def append_many(self, recs: Sequence[SpendRecord]) -> None:
        """Write `recs` durably with one fsync; raises OSError if the disk refuses them."""
        if not recs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Each line notes when it was spooled: its marker, if the failed write made one,
        # is about that old (the record's own `ts` may be much older: a backfill).
        stamp = b'{"%s":%.3f,' % (SPOOLED_AT.encode(), time.time())
        lines = b"".join(stamp + rec.to_json()[1:] + b"\n" for rec in recs)
        with self._locked_spool() as fd:
            size = os.fstat(fd).st_size
            # A crash mid-write leaves a line without its newline; end it so it alone is lost.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                lines = b"\n" + lines
            os.write(fd, lines)
            os.fsync(fd)
            self._pending += len(recs)  # under the lock: appends may come from several threads

    async def replay(self, store: LedgerStore) -> int:
        """Send every spooled record to `store`; returns how many lines were handled.

        Raises `LedgerUnavailable` (leaving the records spooled) if the store fails.
        Returns 0 without waiting if another replay of this spool is running.
        """
        handled = 0
        with self._replay_lock() as acquired:
            if not acquired:
                return 0
            # A leftover `.replaying` file (crash, outage) goes first, then the live file.
            for _ in range(2):
                # In a thread: the rename waits on the flock of an append mid-fsync.
                if not self.replaying_path.exists() and not await _to_thread(self._rotate):
                    break
                handled += await self._replay_file(store)
            # Re-count: appends may have raced the replay, or another process's replay ours.
            self._pending = _count_lines(self.replaying_path) + _count_lines(self.path)
        return handled

    async def _replay_file(self, store: LedgerStore) -> int:
        handled = 0
        batch: list[SpendRecord] = []
        expired: list[bytes] = []
        oldest = time.time() - self.window_s  # spooled before: its marker may be gone
        with self.replaying_path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                parsed = _parse(line, self.replaying_path, number)
                if parsed is not None and parsed[1] < oldest:
                    expired.append(line.rstrip(b"\n") + b"\n")
                elif parsed is not None:
                    batch.append(parsed[0])
                if len(batch) >= REPLAY_BATCH:
                    await store.record_many(batch)
                    batch = []
                handled += 1
        if batch:
            await store.record_many(batch)
        await _to_thread(self._finish, expired)
        return handled

    def _finish(self, expired: list[bytes]) -> None:
        if expired:  # kept before the replayed file goes: a crash here replays nothing twice
            self._keep_expired(expired)
        self.replaying_path.unlink()

    def _keep_expired(self, lines: list[bytes]) -> None:
        with self.expired_path.open("ab") as file:
            file.write(b"".join(lines))
            file.flush()
            os.fsync(file.fileno())
        self.expired += len(lines)
        log.error(
            "%d spooled spend record(s) are older than the ledger's dedupe window (%ds): "
            "not replayed, since they may be written already; kept in %s to reconcile",
            len(lines),
            self.window_s,
            self.expired_path,
        )

    def _rotate(self) -> bool:
        """Rename the live file to the replaying one; False if there is nothing to send."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A replay cancelled mid-rename (its thread runs on) may have moved this file
            # meanwhile: never rename another live file over one still to be replayed.
            if self.replaying_path.exists():
                return True
            if not _same_file(fd, self.path) or os.fstat(fd).st_size == 0:
                return False
            os.rename(self.path, self.replaying_path)
            return True
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _locked_spool(self) -> Iterator[int]:
        """The live spool file, opened for append and exclusively locked."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                # A replayer may have renamed the file while we waited for the lock.
                if _same_file(fd, self.path):
                    yield fd
                    return
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _replay_lock(self) -> Iterator[bool]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)


async def _to_thread(call: Callable[..., T], *args: Any) -> T:
    """`call` in a thread; a replay cancelled meanwhile (once or more) waits for the
    thread to end, so the replay lock is not released while its rename or unlink is
    still to come, then is cancelled."""
    future = asyncio.ensure_future(asyncio.to_thread(call, *args))
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # the thread's: raised by `result()` below
            break
    if cancelled:
        raise asyncio.CancelledError
    return future.result()


def _parse(line: bytes, path: Path, number: int) -> tuple[SpendRecord, float] | None:
    """The line's record and when it was spooled (a line from before the stamp: its
    record's time), or None when it cannot be read."""
    try:
        data = orjson.loads(line)
        rec = SpendRecord.from_dict(data)
        return rec, float(data.get(SPOOLED_AT, rec.ts))
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
        log.warning("skipping unreadable spool line %s:%d (%s): %.200r", path, number, exc, line)
        return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        on_disk, opened = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as file:
            return sum(1 for line in file if line.strip())
    except FileNotFoundError:
        return 0

"""A local file of spend records written while the ledger store is unreachable.

The file is JSON lines, one `SpendRecord` per line, each write flushed and fsynced.
`replay` first renames it to `<path>.replaying` (so appends go on into a fresh file),
sends every line to the store, and deletes the renamed file only once every line was
accepted. A crash or outage mid-replay leaves the file to be sent again; the store
de-duplicates on `record_id`, which makes the replay exactly-once.

Writers take an exclusive `flock` on the spool file and replayers take it before the
rename, so an append never lands in a file that is already being replayed, even from
another worker process sharing the path; `<path>.lock` lets one replayer run at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from gateway.ledger.record import SpendRecord
from gateway.ledger.store import LedgerStore

REPLAY_BATCH = 256  # records per pipelined write while replaying

log = logging.getLogger(__name__)


class Spool:
    """Append-only JSON-lines spool of `SpendRecord`s.

    `append` blocks for an fsync; call it from a thread (`asyncio.to_thread`).

    >>> spool = Spool(Path("/var/lib/cascade/spool.jsonl")); spool.append(rec)
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replaying_path = path.with_name(path.name + ".replaying")
        self._lock_path = path.with_name(path.name + ".lock")
        self._pending = _count_lines(self.replaying_path) + _count_lines(path)

    @property
    def pending(self) -> int:
        """Records spooled and not yet replayed (counted by this process)."""
        return self._pending

    def append(self, rec: SpendRecord) -> None:
        """Write `rec` durably; raises OSError if the disk refuses it."""
        self.append_many([rec])

    def append_many(self, recs: Sequence[SpendRecord]) -> None:
        """Write `recs` durably with one fsync; raises OSError if the disk refuses them."""
        if not recs:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = b"".join(orjson.dumps(rec) + b"\n" for rec in recs)
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
                if not self.replaying_path.exists() and not self._rotate():
                    break
                handled += await self._replay_file(store)
            # Re-count: appends may have raced the replay, or another process's replay ours.
            self._pending = _count_lines(self.replaying_path) + _count_lines(self.path)
        return handled

    async def _replay_file(self, store: LedgerStore) -> int:
        handled = 0
        batch: list[SpendRecord] = []
        with self.replaying_path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                if not line.strip():
                    continue
                rec = _parse(line, self.replaying_path, number)
                if rec is not None:
                    batch.append(rec)
                if len(batch) >= REPLAY_BATCH:
                    await store.record_many(batch)
                    batch = []
                handled += 1
        if batch:
            await store.record_many(batch)
        self.replaying_path.unlink()
        return handled

    def _rotate(self) -> bool:
        """Rename the live file to the replaying one; False if there is nothing to send."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size == 0:
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


def _parse(line: bytes, path: Path, number: int) -> SpendRecord | None:
    try:
        return SpendRecord.from_dict(orjson.loads(line))
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

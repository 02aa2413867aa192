"""Durable files: a Parquet file appears whole or not at all, and survives a power cut
once it has appeared; one committer at a time per archive directory.

`write_durably` writes a temporary file, fsyncs it, renames it over its final name (an
atomic step) and fsyncs the directory, so after it returns the file is on disk under
its name, and a crash before leaves at most a temporary file (`remove_temps` clears
them). `directory_lock` is an exclusive `flock` on `DIR/.lock`, taken around each commit;
it is polled (LOCK_NB), never waited on, so a stopping exporter's thread is not parked
behind another process's commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from gateway.ledger.archive.deps import require
from gateway.ledger.archive.layout import LOCK_NAME, stale_temps, temp_name
from gateway.ledger.archive.schema import table_of

COMPRESSION = "zstd"
LOCK_POLL_S = 0.05


class LockNotTaken(Exception):
    """`directory_lock` gave up waiting: its caller no longer wanted it."""


def write_durably(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """`rows` as the Parquet file `path`, durably and atomically."""
    [pq] = require("pyarrow.parquet")
    durably(path, lambda temp: pq.write_table(table_of(rows), temp, compression=COMPRESSION))


def durably(path: Path, write: Callable[[Path], None]) -> None:
    """`write(temp)` makes the file; it then becomes `path`, durably and atomically."""
    created = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    if created:
        fsync_directory(path.parent.parent)  # the new day directory's entry
    temp = path.with_name(temp_name(path.name, uuid.uuid4().hex[:12]))
    try:
        write(temp)
        fd = os.open(temp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temps(root: Path) -> int:
    """Delete the temporary files of commits that never finished; returns how many.
    Call it holding the lease and the directory lock: no commit of ours is under way."""
    removed = 0
    for path in stale_temps(root):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


@contextlib.contextmanager
def directory_lock(root: Path, keep_waiting: Callable[[], bool]) -> Iterator[None]:
    """Exclusive use of `root` for a commit: waits while it is busy and `keep_waiting()`
    says so, else raises `LockNotTaken`."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_NAME, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not keep_waiting():
                    raise LockNotTaken(f"gave up waiting for {root / LOCK_NAME}") from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock

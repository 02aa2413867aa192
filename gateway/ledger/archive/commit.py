"""Turning a batch of stream entries into archive files, each entry exactly once.

Under the directory lock, each entry of the batch that some file of its day already
covers (see `layout`) is archived already: it is only acked again, never rewritten. The
others are written in runs, one file per run: a run is consecutive uncovered entries of
one day that no existing file's range falls between, so a new file's range holds no
entry that is not in it, and never overlaps another file of its day. That keeps the
promise of every name, and with it the coverage test, true.

Why a batch's uncovered entries of a day are all the entries of that day within the
run's range that will ever be read: a batch is either the exporter's own pending
entries (all of them, in id order) or consecutive new entries, and then exactly its
pending entries (checked before the commit: a read whose reply was lost delivered a
page that no batch holds, and the batch is dropped for the pending ones); entries
acked before are deleted from the stream in the same step as their ack, and entry ids
only grow. The batch is the holder's alone: a lease that lapsed drops it, even when
its holder takes the lease straight back, since another may have claimed its entries.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.ledger.archive.files import LockNotTaken, directory_lock, write_durably
from gateway.ledger.archive.layout import (
    Range,
    covers,
    day_dir,
    file_name,
    ranges_in,
)
from gateway.ledger.stream_ids import StreamId

_TOP: StreamId = (2**63, 2**63)


class LeaseLost(Exception):
    """The exporter no longer holds the stream's lease: another may be exporting it."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry read for the archive; `row` is None for an entry trimmed from
    the stream after it was delivered (its content is gone)."""

    id: str
    sid: StreamId
    row: dict[str, Any] | None

    @property
    def day(self) -> str:
        assert self.row is not None
        return str(self.row["day"])


@dataclass
class Outcome:
    covered: int = 0  # entries found archived already (a commit cut short before its ack)
    lost: int = 0  # entries whose content was gone


def plan_runs(entries: Sequence[Entry], existing: dict[str, list[Range]]) -> list[list[Entry]]:
    """The uncovered entries of `entries` (in id order) as runs to write, one file each."""
    runs: list[list[Entry]] = []
    by_day = sorted((e for e in entries if e.row is not None), key=lambda e: (e.day, e.sid))
    for day, group in itertools.groupby(by_day, key=lambda e: e.day):
        ranges = existing.get(day, [])
        run: list[Entry] = []
        for entry in group:
            if covers(ranges, entry.sid):
                if run:
                    runs.append(run)
                    run = []
            elif run and _range_between(ranges, run[-1].sid, entry.sid):
                runs.append(run)
                run = [entry]
            else:
                run.append(entry)
        if run:
            runs.append(run)
    return sorted(runs, key=lambda run: run[0].sid)


def commit(
    root: Path,
    slug: str,
    entries: Sequence[Entry],
    still_leased: Callable[[], bool],
    stopping: Callable[[], bool] = lambda: False,
) -> Outcome:
    """Write `entries` that are not archived yet; blocking (run it in a thread).

    `still_leased` is asked while waiting for the directory lock and before each file
    appears: a lease lost mid-commit stops it (LeaseLost), so an exporter that was paused
    past its lease does not write what its successor may be writing. `stopping` ends the
    wait for the lock too (`LockNotTaken`): the entries stay pending."""
    outcome = Outcome(lost=sum(1 for e in entries if e.row is None))
    days = {e.day for e in entries if e.row is not None}
    try:
        with directory_lock(root, lambda: still_leased() and not stopping()):
            existing = {day: ranges_in(day_dir(root, day), slug) for day in days}
            runs = plan_runs(entries, existing)
            outcome.covered = len(entries) - outcome.lost - sum(len(run) for run in runs)
            for run in runs:
                if not still_leased():
                    raise LeaseLost(f"its lease was lost committing {len(entries)} entries")
                path = day_dir(root, run[0].day) / file_name(slug, run[0].sid, run[-1].sid)
                write_durably(path, [entry.row for entry in run if entry.row is not None])
    except LockNotTaken:  # only the wait for the lock raises it
        if not still_leased():
            raise LeaseLost(f"its lease ran out waiting for {root}'s lock") from None
        raise
    return outcome


def _range_between(ranges: list[Range], low: StreamId, high: StreamId) -> bool:
    """Whether a range of `ranges` (sorted, disjoint) lies strictly between two ids."""
    i = bisect.bisect_right(ranges, (low, _TOP))  # the first range starting after `low`
    return i < len(ranges) and ranges[i][1] < high

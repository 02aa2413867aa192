"""Compaction: each stream's files of a closed day merged into a few.

The exporter writes a file per flush (hundreds a day at a steady load), which DuckDB
then opens one by one for every report. Under the directory lock, so no commit runs
meanwhile, `compact` reads a run of a day's files of one stream, a batch at a time,
writes their rows as one file whose range spans theirs (durably, as every file), then
deletes them; it lets go of the lock between runs, so commits wait for one merge at
most, never for a whole backlog of days. The merged name
keeps the layout's promise: the files of a stream and day hold every record of that
day in their ranges, and a range between two of them holds no record of that day
(entry ids only grow, and an exporter writes a day's pending entries in id order), so
the span of all of them holds exactly their rows. Killed after the new file appears
and before the old ones are gone, the old ones are superseded (`layout.outermost`):
read and counted nowhere, and deleted by the next compaction.

    cascade-gateway spend compact --archive DIR [--before YYYY-MM-DD]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from gateway.ledger.archive.deps import require
from gateway.ledger.archive.files import COMPRESSION, directory_lock, durably
from gateway.ledger.archive.layout import (
    Range,
    archive_days,
    file_name,
    named_files,
    outermost,
)

# A merged file holds up to this many rows (about a day at 60 records/s): a busier
# day keeps several files, and memory holds one input file at a time, never the day.
MAX_ROWS = 5_000_000
BATCH_ROWS = 65_536  # rows read and written at a time


@dataclass
class Compaction:
    days: int = 0  # day directories looked at
    merged: int = 0  # files merged into others
    written: int = 0  # files written
    superseded: int = 0  # leftovers of a compaction cut short, deleted
    rows: int = 0  # rows in the files written
    complete: bool = True  # False: stopped at `max_writes`, more is left to merge


def compact(
    root: Path,
    before: date,
    max_rows: int = MAX_ROWS,
    keep_waiting: Callable[[], bool] = lambda: True,
    max_writes: int | None = None,
) -> Compaction:
    """Merge each stream's files of every day before `before`, consecutive ones into
    files of up to `max_rows` rows. The directory lock is held for one merge at a time
    (the exporters' commits wait for that merge only); `keep_waiting` is as the lock's.
    `max_writes`: stop after that many merged files (`complete` is then False)."""
    [pq] = require("pyarrow.parquet")
    done = Compaction()
    for day, directory in sorted(archive_days(root)):
        if day >= before:
            continue
        done.days += 1
        for slug in named_files(directory):
            while True:
                if max_writes is not None and done.written >= max_writes:
                    done.complete = False
                    return done
                with directory_lock(root, keep_waiting):  # the files as they are now
                    files = named_files(directory).get(slug, [])
                    live = outermost(files)
                    for _, path in set(files) - set(live):
                        path.unlink()
                        done.superseded += 1
                    sizes = [pq.read_metadata(path).num_rows for _, path in live]
                    runs = _runs(live, sizes, max_rows)
                    if not runs:
                        break
                    run = runs[0]
                    first, last = run[0][0][0], run[-1][0][1]
                    done.rows += _merge(directory / file_name(slug, first, last), run)
                    for _, path in run:
                        path.unlink()
                    done.merged += len(run)
                    done.written += 1
    return done


def _runs(
    files: Sequence[tuple[Range, Path]], sizes: Sequence[int], max_rows: int
) -> list[list[tuple[Range, Path]]]:
    """Consecutive files, in range order, grouped up to `max_rows` rows; only groups of
    two or more are worth merging."""
    runs: list[list[tuple[Range, Path]]] = []
    run: list[tuple[Range, Path]] = []
    rows = 0
    for file, size in zip(files, sizes, strict=True):
        if run and rows + size > max_rows:
            runs.append(run)
            run, rows = [], 0
        run.append(file)
        rows += size
    runs.append(run)
    return [run for run in runs if len(run) > 1]


def _merge(path: Path, run: Sequence[tuple[Range, Path]]) -> int:
    """The rows of `run`'s files as one file `path`, written durably, one input at a
    time; columns a file lacks (written before a field existed) come out null."""
    [pa, pq] = require("pyarrow", "pyarrow.parquet")
    schema = pa.unify_schemas([pq.read_schema(p) for _, p in run], promote_options="default")
    rows = 0

    def write(temp: Path) -> None:
        nonlocal rows
        with pq.ParquetWriter(temp, schema, compression=COMPRESSION) as writer:
            for _, source in run:  # a batch at a time: memory holds no whole file
                for batch in pq.ParquetFile(source).iter_batches(batch_size=BATCH_ROWS):
                    table = pa.Table.from_batches([batch])
                    writer.write_table(_aligned(pa, table, schema))
                    rows += table.num_rows

    durably(path, write)
    return rows


def _aligned(pa: Any, table: Any, schema: Any) -> Any:
    """`table` with `schema`'s columns in its order, nulls where it has none."""
    columns = [
        table.column(field.name).cast(field.type)
        if field.name in table.column_names
        else pa.nulls(table.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)

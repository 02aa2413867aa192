"""Spend aggregates from the archive's Parquet files, with DuckDB: the same rows the
Redis ledger's daily aggregates give (`AggregateRow`), for any range of days.

It is an `Aggregates` (gateway.spend.report), so `aggregate` and `render` format
its rows exactly as they format the ledger's. Each metric is the SQL twin of
`rollup.metrics_of`; `METRIC_SQL` must name every metric (checked on import), and the
tests compare the two on the same records.

A column missing from every file in the range (archived before the field existed)
reads as NULL, which the sums take as 0, as the ledger reads a metric added later. A
file DuckDB cannot read (not Parquet, cut short, columns of other types) is an
`ArchiveUnreadable` naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from gateway.ledger.archive.deps import require
from gateway.ledger.archive.layout import files_between
from gateway.ledger.record import DIMENSIONS, AggregateRow
from gateway.ledger.rollup import METRICS, Rollup, check_group_by

_UNREFERENCED = (  # as `rollup.metrics_of`: a cancelled request is not one to compare
    "((reference_model IS NULL OR reference_model = '') AND status IS DISTINCT FROM 'cancelled')"
)
# metric -> (SQL summed per row, the columns it reads)
METRIC_SQL: dict[str, tuple[str, tuple[str, ...]]] = {
    "requests": ("CASE WHEN record_id = request_id THEN 1 ELSE 0 END", ("record_id",)),
    "errors": ("CASE WHEN status = 'error' THEN 1 ELSE 0 END", ("status",)),
    "prompt_tokens": ("prompt_tokens", ("prompt_tokens",)),
    "completion_tokens": ("completion_tokens", ("completion_tokens",)),
    "cost_nanos": ("cost_nanos", ("cost_nanos",)),
    "reference_cost_nanos": ("reference_cost_nanos", ("reference_cost_nanos",)),
    "sla_met": ("CASE WHEN sla_met IS TRUE THEN 1 ELSE 0 END", ("sla_met",)),
    "sla_missed": ("CASE WHEN sla_met IS FALSE THEN 1 ELSE 0 END", ("sla_met",)),
    "calls": (
        "CASE WHEN status IN ('error', 'cancelled') THEN 0 ELSE 1 END",  # NULL: a call
        ("status",),
    ),
    "unreferenced": (
        f"CASE WHEN {_UNREFERENCED} THEN 1 ELSE 0 END",
        ("reference_model", "status"),
    ),
    "unreferenced_cost_nanos": (
        f"CASE WHEN {_UNREFERENCED} THEN cost_nanos ELSE 0 END",
        ("reference_model", "cost_nanos", "status"),
    ),
}
for _name in METRICS:  # the token classes and cache savings: plain sums of their fields
    METRIC_SQL.setdefault(_name, (f'"{_name}"', (_name,)))
if tuple(METRIC_SQL) != METRICS:
    raise RuntimeError(f"METRIC_SQL must follow METRICS: {tuple(METRIC_SQL)} != {METRICS}")


class ArchiveUnreadable(Exception):
    """A file of the archive (or the archive as a whole) cannot be read as the ledger's
    Parquet files."""


class ArchiveAggregates:
    """`aggregate` over the archive under `root`.

    >>> rows = await spend_report(ArchiveAggregates(Path("/archive")), day_from, day_to, ["team"])
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        require("duckdb")  # before any work: the error names the extra

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]:
        return await asyncio.to_thread(self.aggregate_now, day_from, day_to, group_by)

    def aggregate_now(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]:
        names = check_group_by(group_by)
        [duckdb] = require("duckdb")
        try:
            found = self._rows_listed_again(day_from, day_to, names)
        except duckdb.Error as exc:
            raise self._unreadable(day_from, day_to, names, exc) from exc
        rollup = Rollup(names)
        for row in found:
            rollup.add(tuple(row[: len(names)]), [int(amount) for amount in row[len(names) :]])
        return rollup.rows()

    def _rows_listed_again(
        self, day_from: date, day_to: date, names: Sequence[str]
    ) -> list[tuple[Any, ...]]:
        """`_rows`, read once more if a file listed was gone when DuckDB opened it."""
        [duckdb] = require("duckdb")
        try:
            return self._rows(day_from, day_to, names)
        except duckdb.IOException:  # a compaction replaced a file listed: list them again
            return self._rows(day_from, day_to, names)

    def _rows(self, day_from: date, day_to: date, names: Sequence[str]) -> list[tuple[Any, ...]]:
        """The summed rows of the files the range has now."""
        files = [str(path) for path in files_between(self.root, day_from, day_to)]
        return _summed(files, day_from, day_to, names) if files else []

    def _unreadable(
        self, day_from: date, day_to: date, names: Sequence[str], error: Exception
    ) -> ArchiveUnreadable:
        """The error to report: the first file the query fails on alone (DuckDB's own
        message names no file for some damage), else the archive as a whole."""
        [duckdb] = require("duckdb")
        for path in files_between(self.root, day_from, day_to):
            try:
                _summed([str(path)], day_from, day_to, names)
            except duckdb.Error as exc:
                return ArchiveUnreadable(f"cannot read {path} in the archive: {_first_line(exc)}")
        return ArchiveUnreadable(f"cannot read the archive at {self.root}: {_first_line(error)}")


def _summed(
    files: list[str], day_from: date, day_to: date, names: Sequence[str]
) -> list[tuple[Any, ...]]:
    """The summed rows of `files`, grouped by `names`."""
    [duckdb] = require("duckdb")
    with duckdb.connect() as db:
        # By name: files written before a field existed lack its column.
        db.read_parquet(files, union_by_name=True, hive_partitioning=False).create_view("archive")
        present = {row[0] for row in db.execute("DESCRIBE archive").fetchall()}
        sql = _query(names, present)
        rows: list[tuple[Any, ...]] = db.execute(
            sql, [day_from.isoformat(), day_to.isoformat()]
        ).fetchall()
    return rows


def _query(names: Sequence[str], present: set[str]) -> str:
    groups = [_group_sql(name, present) for name in names]
    sums = []
    for metric, (expression, columns) in METRIC_SQL.items():
        usable = all(column in present for column in columns)
        sums.append(f"COALESCE(SUM({expression}), 0)" if usable else "0")
        sums[-1] += f" AS {metric}"
    group_by = f"GROUP BY {', '.join(str(i + 1) for i in range(len(groups)))}" if groups else ""
    return (
        f"SELECT {', '.join([*groups, *sums])} FROM archive "
        f"WHERE day BETWEEN ? AND ? {group_by} HAVING COUNT(*) > 0"
    )


def _group_sql(name: str, present: set[str]) -> str:
    """A group column as the ledger keys it: the value as text ('None' for a null, as
    `SpendRecord.dimension` writes one)."""
    assert name == "day" or name in DIMENSIONS
    if name not in present:
        return "'None'"
    return f"COALESCE(CAST(\"{name}\" AS VARCHAR), 'None')"


def _first_line(error: Exception) -> str:
    """DuckDB's message without the candidates and hints it adds on later lines."""
    return str(error).strip().splitlines()[0]

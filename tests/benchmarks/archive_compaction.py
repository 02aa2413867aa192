"""Archive compaction: a day of small files against the same day compacted, same run.

    python -m tests.benchmarks.archive_compaction [--files 720] [--rows 500]

Writes one UTC day of `--files` archive files of `--rows` records each through the
exporter's own commit path (one file per minute for 12 hours at ~8 records/s by
default: what a gateway's 60 s flushes leave), times `spend report --archive`'s query
over the day (median of 5), compacts the day, times the same report again, and checks
that both give the same rows. Prints JSON: files before and after, rows, the seconds
the compaction took and its peak memory growth, and the report's seconds before and
after with their ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from gateway.ledger.archive import compact
from gateway.ledger.archive.commit import Entry, commit
from gateway.ledger.archive.schema import row_of
from gateway.ledger.stream_ids import parse_id
from gateway.spend.archive_report import ArchiveAggregates
from tests.gateway.archive_support import varied_record
from tests.gateway.ledger_fixtures import DAY0

STREAM = "cg:{ledger}:events"
SLUG = "cg-ledger-events-bench"
GROUPS = ["team", "route", "deployment"]


def write_day(root: Path, files: int, rows: int) -> None:
    for f in range(files):
        batch = []
        for j in range(rows):
            i = f * rows + j
            entry_id = f"{10_000 + i}-0"
            record = varied_record(i, day=0)
            row = row_of(STREAM, entry_id, {"json": record.to_json().decode()})
            batch.append(Entry(entry_id, parse_id(entry_id), row))
        commit(root, SLUG, batch, still_leased=lambda: True)


def timed(fn: Callable[[], Any], reps: int = 5) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(reps):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--files", type=int, default=720)
    p.add_argument("--rows", type=int, default=500)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cgcompact-") as tmp:
        root = Path(tmp)
        write_day(root, args.files, args.rows)
        day_dir = next(root.glob("day=*"))
        archive = ArchiveAggregates(root)

        def report() -> Any:
            return archive.aggregate_now(DAY0, DAY0 + timedelta(days=1), GROUPS)

        before_s, before = timed(report)
        files_before = len(list(day_dir.glob("*.parquet")))
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        done = compact(root, DAY0 + timedelta(days=1))
        compact_s = time.perf_counter() - started
        peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        after_s, after = timed(report)
    result = {
        "files_before": files_before,
        "files_after": done.written,
        "rows": done.rows,
        "compaction_s": round(compact_s, 3),
        "peak_rss_growth_mb": round((peak_after - peak_before) / 1024, 1),
        "report_before_s": round(before_s, 4),
        "report_after_s": round(after_s, 4),
        "report_speedup": round(before_s / after_s, 1),
        "same_rows": before == after,
    }
    print(json.dumps(result, indent=2))
    return 0 if before == after else 1


if __name__ == "__main__":
    sys.exit(main())

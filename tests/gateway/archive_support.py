"""Helpers for the archive tests: varied records, reading an archive back, fast exporter
options, and a child process that exports and is killed at a chosen point."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from gateway.ledger import SpendRecord
from gateway.ledger.archive import ArchiveOptions
from tests.gateway.ledger_fixtures import make_record

REPO = Path(__file__).resolve().parents[2]
# Short waits, so takeovers and flushes happen within a test's seconds.
FAST = ArchiveOptions(flush_s=0.2, poll_s=0.05, lease_ttl_s=1.0, stats_s=0.0, retry_s=0.1)


def varied_record(i: int, day: int = 0) -> SpendRecord:
    """`make_record`, plus what the reports treat apart: escalations (no request of
    their own), routes without a reference model, token classes and cache savings,
    requests their clients cancelled (neither an error nor a call)."""
    overrides: dict[str, Any] = {}
    if i % 29 == 3:
        overrides |= {"status": "cancelled", "prompt_tokens": 0, "completion_tokens": 0}
    if i % 5 == 1:
        overrides |= {"record_id": f"req-{i - 1}:1", "request_id": f"req-{i - 1}"}
    if i % 6 == 2:
        overrides |= {"reference_model": None, "reference_cost_nanos": 0}
    if i % 4 == 3:
        overrides |= {
            "cache_read_tokens": i,
            "reasoning_tokens": 2 * i,
            "cache_savings_nanos": -i if i % 8 == 7 else 3 * i,
        }
    return make_record(i, day=day, **overrides)


def archived_rows(root: Path) -> list[dict[str, Any]]:
    """Every row of every archive file (never the temporary files)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(root.glob("day=*/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def archived_counts(root: Path) -> Counter[str]:
    """How many times each record id is in the archive."""
    return Counter(row["record_id"] for row in archived_rows(root))


def assert_exactly_once(root: Path, written: set[str]) -> None:
    counts = archived_counts(root)
    duplicated = {record_id: n for record_id, n in counts.items() if n > 1}
    missing = written - set(counts)
    assert not duplicated, f"archived more than once: {sorted(duplicated)[:5]}"
    assert not missing, f"{len(missing)} never archived: {sorted(missing)[:5]}"
    assert set(counts) == written


# A child that drains the ledger into the archive and is SIGKILLed at `point`:
# after-rename (its files are on disk, nothing acked) or mid-file (a temporary file
# written, not renamed).
_CHILD = """
import asyncio, os, signal, sys
from pathlib import Path
from gateway.ledger import RedisStore
from gateway.ledger.archive import ArchiveOptions, build_exporter, files, stream_export

url, prefix, root, point = sys.argv[1:5]

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if point == "after-rename":
    async def ack_never(self, entries):
        die()
    stream_export.StreamExport._acknowledge = ack_never
elif point == "mid-file":
    files.os.rename = die

async def main():
    store = RedisStore(url, prefix=prefix)
    options = ArchiveOptions(flush_s=0.1, poll_s=0.05, lease_ttl_s=1.0)
    await build_exporter(store, Path(root), options).drain()

asyncio.run(main())
"""


def export_and_die(url: str, prefix: str, root: Path, point: str) -> int:
    """Run the child; its exit status (-9 when it was killed)."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, prefix, str(root), point],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode

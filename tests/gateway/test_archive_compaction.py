"""Archive compaction: a closed day's files of each stream merged into one, with the
same report totals, every entry still covered (a restarted exporter acks, never
rewrites), a compaction killed half-way counted once, and the exporters' lock kept."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
import uuid
from datetime import date, timedelta
from pathlib import Path

import pytest

from gateway.ledger import RedisStore
from gateway.ledger.archive import ArchiveExporter, compact
from gateway.ledger.archive.commit import Entry, commit
from gateway.ledger.archive.files import COMPRESSION, directory_lock, durably
from gateway.ledger.archive.layout import covers, day_dir, file_name, named_files, ranges_in
from gateway.ledger.archive.schema import row_of
from gateway.ledger.stream_ids import parse_id
from gateway.spend.archive_report import ArchiveAggregates
from tests.gateway.archive_support import FAST, REPO, archived_counts, varied_record
from tests.gateway.ledger_fixtures import DAY0, delete_prefix
from tests.support import eventually_async

STREAM = "cg:{ledger}:events"
SLUG = "cg-ledger-events-test"
GROUPS = ["day", "team", "route", "deployment"]


def archive(root: Path, batches: int = 4, per_batch: int = 25, days: int = 2) -> list[Entry]:
    """`batches` commits of records spread over `days` days: several files per day."""
    entries = []
    for b in range(batches):
        batch = []
        for j in range(per_batch):
            i = b * per_batch + j
            record = varied_record(i, day=i % days)
            entry_id = f"{1_000 + i}-0"
            row = row_of(STREAM, entry_id, {"json": record.to_json().decode()})
            batch.append(Entry(entry_id, parse_id(entry_id), row))
        commit(root, SLUG, batch, still_leased=lambda: True)
        entries += batch
    return entries


def report(root: Path) -> list[object]:
    day_to = DAY0 + timedelta(days=5)
    return ArchiveAggregates(root).aggregate_now(DAY0, day_to, GROUPS)


def files_per_day(root: Path) -> dict[str, int]:
    return {path.name: len(list(path.glob("*.parquet"))) for path in sorted(root.glob("day=*"))}


def test_a_closed_day_becomes_one_file_with_the_same_totals(tmp_path: Path) -> None:
    entries = archive(tmp_path)
    before, counts = report(tmp_path), archived_counts(tmp_path)
    assert all(n >= 4 for n in files_per_day(tmp_path).values())
    done = compact(tmp_path, before=DAY0 + timedelta(days=1))  # day 0 closed, day 1 not
    assert (done.days, done.written) == (1, 1) and done.merged >= 4 and done.rows == 50
    assert files_per_day(tmp_path)[f"day={DAY0}"] == 1
    assert files_per_day(tmp_path)[f"day={DAY0 + timedelta(days=1)}"] >= 4  # untouched
    assert report(tmp_path) == before and archived_counts(tmp_path) == counts
    # Every entry of the day is still covered: a restarted exporter acks it again.
    for entry in entries:
        assert entry.row is not None
        assert covers(ranges_in(day_dir(tmp_path, entry.day), SLUG), entry.sid)
    assert compact(tmp_path, before=DAY0 + timedelta(days=1)).written == 0  # nothing left


def test_a_compaction_killed_before_deleting_counts_each_row_once(tmp_path: Path) -> None:
    """The merged file is written, the inputs are still there (killed in between): the
    inputs are superseded, read by no report, and the next compaction deletes them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    archive(tmp_path)
    before = report(tmp_path)
    directory = day_dir(tmp_path, str(DAY0))
    [(slug, files)] = named_files(directory).items()
    files.sort()
    merged = pa.concat_tables([pq.read_table(path) for _, path in files])
    target = directory / file_name(slug, files[0][0][0], files[-1][0][1])
    durably(target, lambda temp: pq.write_table(merged, temp, compression=COMPRESSION))
    assert len(list(directory.glob("*.parquet"))) == len(files) + 1
    assert report(tmp_path) == before
    assert ranges_in(directory, slug) == [(files[0][0][0], files[-1][0][1])]
    done = compact(tmp_path, before=DAY0 + timedelta(days=1))
    assert done.superseded == len(files) and done.written == 0
    assert report(tmp_path) == before and len(list(directory.glob("*.parquet"))) == 1


def test_compaction_waits_for_a_commit_in_progress(tmp_path: Path) -> None:
    archive(tmp_path)
    finished = threading.Event()
    with directory_lock(tmp_path, lambda: True):  # an exporter's commit under way
        worker = threading.Thread(
            target=lambda: (compact(tmp_path, DAY0 + timedelta(days=1)), finished.set())
        )
        worker.start()
        time.sleep(0.3)
        assert not finished.is_set()
    worker.join(timeout=10)
    assert finished.is_set()


def test_the_command_line_compacts_and_names_a_bad_day(tmp_path: Path) -> None:
    archive(tmp_path)
    command = [sys.executable, "-m", "gateway.cli", "spend", "compact", "--archive", str(tmp_path)]
    ok = subprocess.run(
        [*command, "--before", str(DAY0 + timedelta(days=1))],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("compacted 1 day(s) before ")
    bad = subprocess.run(
        [*command, "--before", "yesterday"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and "'yesterday' is not a date as YYYY-MM-DD" in bad.stderr
    missing = subprocess.run(
        [*command[:-1], str(tmp_path / "nowhere")], cwd=REPO, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "no archive at" in missing.stderr


def test_a_busy_day_keeps_files_of_at_most_max_rows(tmp_path: Path) -> None:
    archive(tmp_path, batches=6, per_batch=10, days=1)  # 6 files of 10 rows, one day
    before = report(tmp_path)
    done = compact(tmp_path, DAY0 + timedelta(days=1), max_rows=25)
    assert (done.merged, done.written, done.rows) == (6, 3, 60)  # 10+10, 10+10, 10+10
    assert files_per_day(tmp_path)[f"day={DAY0}"] == 3
    assert report(tmp_path) == before


async def test_a_running_exporter_compacts_the_closed_days_once(
    redis_url: str, tmp_path: Path
) -> None:
    """The holder of the first stream merges the days before today, then exports on."""
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    store = RedisStore(redis_url, prefix=prefix)
    archive(tmp_path)
    before = report(tmp_path)
    exporter = ArchiveExporter(
        store.client, store.event_stream_keys(), tmp_path, dataclasses.replace(FAST, compact=True)
    )
    try:
        exporter.start()
        await eventually_async(
            lambda: all(n == 1 for n in files_per_day(tmp_path).values()), 10, "compaction"
        )
        assert report(tmp_path) == before
        await store.record_many([varied_record(500)])  # the export goes on
        await eventually_async(lambda: archived_counts(tmp_path)["req-500"] == 1, 10, "export")
    finally:
        await exporter.stop()
        await delete_prefix(redis_url, prefix)
        await store.close()


def test_a_capped_compaction_stops_and_the_next_one_finishes(tmp_path: Path) -> None:
    archive(tmp_path, days=3)
    before = report(tmp_path)
    first = compact(tmp_path, DAY0 + timedelta(days=3), max_writes=1)
    assert (first.written, first.complete) == (1, False)
    rest = compact(tmp_path, DAY0 + timedelta(days=3))
    assert (rest.written, rest.complete) == (2, True)
    assert set(files_per_day(tmp_path).values()) == {1} and report(tmp_path) == before


def test_a_report_lists_the_files_again_when_a_compaction_replaced_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report lists the files, then a compaction deletes one before DuckDB opens it:
    the report lists them again, and counts each row once."""
    from gateway.spend import archive_report

    archive(tmp_path)
    before = report(tmp_path)
    listed = archive_report.files_between
    calls = []

    def stale_once(root: Path, day_from: date, day_to: date) -> list[Path]:
        calls.append(1)
        if len(calls) == 1:
            return [*listed(root, day_from, day_to), root / "day=2026-11-28" / "gone.parquet"]
        return listed(root, day_from, day_to)

    monkeypatch.setattr(archive_report, "files_between", stale_once)
    assert report(tmp_path) == before and len(calls) == 2

"""Where the archive keeps its files, and what a file's name promises.

    DIR/day=YYYY-MM-DD/<stream>_<first id>_<last id>.parquet

`day` is the records' UTC day (`SpendRecord.day`, as the reports group them), so a
range of days reads only its own directories. `<stream>` names the ledger event stream
the rows came from (its key made file-safe, plus a digest of it: a sharded ledger has
several); the ids are the first and last stream entry ids (`<ms>-<seq>`) in the file.

The name is a promise the exporter keeps (see `commit`): the file holds every record of
that stream and day whose entry id lies in the range, of those the exporter ever read.
So an entry is archived exactly when some file of its day and stream covers its id;
that is how a restarted exporter acks, without writing them again, entries it had
archived before it was killed. Files of one stream and day never overlap.

Compaction (`compact`) merges a stream's files of a day into one whose range spans
theirs, then deletes them. Until they are gone (a compaction killed in between), a file
whose range lies inside another's of its stream and day is superseded: readers and the
coverage test see only the outermost files (`outermost`), so the rows count once.

A file being written is `.<name>.<random>.tmp` in the same directory (never matched by
`*.parquet`; `<random>` is new for each file written, so two writers never share one);
it becomes the file by an atomic rename, after an fsync.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from gateway.ledger.stream_ids import StreamId, format_id, parse_id

Range = tuple[StreamId, StreamId]

DAY_DIR = re.compile(r"day=(\d{4}-\d{2}-\d{2})")
FILE_NAME = re.compile(r"([a-z0-9-]+)_(\d+-\d+)_(\d+-\d+)\.parquet")
TEMP_GLOB = ".*.tmp"
LOCK_NAME = ".lock"


def stream_slug(key: str) -> str:
    """`cg:{ledger}:events` -> `cg-ledger-events-1a2b3c4d`: readable, and unique per key."""
    readable = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def day_dir(root: Path, day: str) -> Path:
    return root / f"day={day}"


def file_name(slug: str, first: StreamId, last: StreamId) -> str:
    return f"{slug}_{format_id(first)}_{format_id(last)}.parquet"


def temp_name(final: str, token: str) -> str:
    return f".{final}.{token}.tmp"


def ranges_in(directory: Path, slug: str) -> list[Range]:
    """The id ranges of `slug`'s live files in one day directory, sorted (disjoint)."""
    return [span for span, _ in outermost(named_files(directory).get(slug, []))]


def named_files(directory: Path) -> dict[str, list[tuple[Range, Path]]]:
    """Per stream slug, the range and path of each of its files in one day directory."""
    found: dict[str, list[tuple[Range, Path]]] = {}
    if directory.is_dir():
        for path in directory.iterdir():
            match = FILE_NAME.fullmatch(path.name)
            if match:
                span = (parse_id(match.group(2)), parse_id(match.group(3)))
                found.setdefault(match.group(1), []).append((span, path))
    return found


def outermost(files: list[tuple[Range, Path]]) -> list[tuple[Range, Path]]:
    """The files no other file's range contains, sorted by range: what a compaction
    killed before deleting its inputs left beside its output is dropped."""
    kept: list[tuple[Range, Path]] = []
    for span, path in sorted(files, key=lambda f: (f[0][0], _desc(f[0][1]), f[1].name)):
        if kept and span[1] <= kept[-1][0][1]:  # inside the last kept range
            continue
        kept.append((span, path))
    return kept


def _desc(sid: StreamId) -> StreamId:
    return (-sid[0], -sid[1])


def covers(ranges: list[Range], sid: StreamId) -> bool:
    """Whether a range of `ranges` (sorted, disjoint) holds `sid`."""
    i = bisect.bisect_right(ranges, (sid, (2**63, 2**63))) - 1
    return i >= 0 and ranges[i][0] <= sid <= ranges[i][1]


def archive_days(root: Path) -> Iterator[tuple[date, Path]]:
    """Every day directory of the archive, with its day."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        match = DAY_DIR.fullmatch(path.name)
        if match and path.is_dir():
            yield date.fromisoformat(match.group(1)), path


def files_between(root: Path, day_from: date, day_to: date) -> list[Path]:
    """The archive's live files for days in [day_from, day_to], in name order."""
    return sorted(
        path
        for day, directory in archive_days(root)
        if day_from <= day <= day_to
        for files in named_files(directory).values()
        for _, path in outermost(files)
    )


def stale_temps(root: Path) -> list[Path]:
    """Temporary files an exporter left when it was killed mid-file."""
    return [path for _, directory in archive_days(root) for path in directory.glob(TEMP_GLOB)]

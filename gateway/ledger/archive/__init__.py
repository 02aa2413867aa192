"""The spend archive: every ledger record, exactly once, in daily Parquet files.

The ledger's event streams hold the latest records only (MAXLEN); the exporter drains
them through a consumer group into `DIR/day=YYYY-MM-DD/*.parquet` (`layout`), and
`gateway.spend.archive_report` reads any range back with DuckDB. pyarrow (to export)
and duckdb (to report), the `archive` extra, are imported on first use (`deps`).
"""

from gateway.ledger.archive import build
from gateway.ledger.archive.build import build_exporter
from gateway.ledger.archive.compact import Compaction, compact
from gateway.ledger.archive.deps import ArchiveDependencyMissing, check_installed
from gateway.ledger.archive.exporter import ArchiveBusy, ArchiveExporter
from gateway.ledger.archive.group import GROUP
from gateway.ledger.archive.stream_export import ArchiveOptions

__all__ = [
    "GROUP",
    "ArchiveBusy",
    "ArchiveDependencyMissing",
    "ArchiveExporter",
    "ArchiveOptions",
    "Compaction",
    "build",
    "build_exporter",
    "check_installed",
    "compact",
]

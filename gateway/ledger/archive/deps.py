"""The archive's optional dependencies (the `archive` extra): pyarrow writes its Parquet
files, DuckDB reads them back. Imported on first use, so a gateway without an archive
never loads them, and a missing one is an error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "archive"
INSTALL_HINT = f"pip install 'cascade-gateway[{EXTRA}]'"


class ArchiveDependencyMissing(RuntimeError):
    """pyarrow (to export) or duckdb (to report) is not installed, and is needed."""


def require(*modules: str) -> list[ModuleType]:
    """The named modules, imported; `ArchiveDependencyMissing` naming the extra if any
    is absent."""
    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as exc:
            raise ArchiveDependencyMissing(
                f"the spend archive needs {name.split('.')[0]}, which is not installed: "
                f"{INSTALL_HINT} (the '{EXTRA}' extra)"
            ) from exc
    return loaded


def check_installed() -> None:
    """Fail fast, at startup, when the archive is configured but cannot run. The
    exporter writes with pyarrow alone: DuckDB, for reports (`spend report --archive`),
    is not loaded into every gateway worker."""
    require("pyarrow", "pyarrow.parquet")

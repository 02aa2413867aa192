"""The archive's columns, derived from `SpendRecord`, and its rows, built from stream entries.

Every field of `SpendRecord` is a column, typed from its annotation (str and Literal
-> string, int -> int64, float -> float64, bool -> bool; all nullable), so a field added
to the record is archived without a change here. Four columns follow them:

    day           the record's UTC day (its `ts`; the entry id's day if that is unreadable)
    event_stream  the ledger event stream the entry came from
    event_id      its entry id there (`<ms>-<seq>`): with `event_stream`, the provenance
    extra         JSON of the fields this version does not know (a newer gateway wrote
                  them), null when there are none: nothing a record carried is dropped

A record is read as the gateway reads it (`SpendRecord.from_dict`: fields written
before they existed take their defaults). One that does not parse is kept as far as it
goes: each known field converted if it can be, null if not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
import typing
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from gateway.ledger.archive.deps import require
from gateway.ledger.record import SpendRecord, utc_day

log = logging.getLogger(__name__)

KindType = Literal["string", "int64", "float64", "bool"]
RECORD_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(SpendRecord))
EXTRA_COLUMNS: tuple[str, ...] = ("day", "event_stream", "event_id", "extra")
COLUMNS: tuple[str, ...] = (*RECORD_FIELDS, *EXTRA_COLUMNS)
_KNOWN = frozenset(RECORD_FIELDS)
if _KNOWN & set(EXTRA_COLUMNS):  # a record field would be overwritten: rename the column
    raise TypeError(f"SpendRecord fields clash with archive columns: {_KNOWN & set(EXTRA_COLUMNS)}")


def kind_of(annotation: Any) -> KindType:
    """The column kind of a field annotation; `X | None` is X (every column is nullable)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = {kind_of(arg) for arg in typing.get_args(annotation) if arg is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "string"
    if origin is Literal:
        return kind_of(type(typing.get_args(annotation)[0]))
    if annotation is bool:  # before int: bool is an int
        return "bool"
    if annotation is int:
        return "int64"
    if annotation is float:
        return "float64"
    return "string"


@functools.cache
def column_kinds() -> dict[str, KindType]:
    hints = typing.get_type_hints(SpendRecord)
    kinds: dict[str, KindType] = {name: kind_of(hints[name]) for name in RECORD_FIELDS}
    return kinds | dict.fromkeys(EXTRA_COLUMNS, "string")


def arrow_schema() -> Any:
    """The archive's `pyarrow.Schema`."""
    [pa] = require("pyarrow")
    types_ = {
        "string": pa.string(),
        "int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
    }
    return pa.schema([pa.field(name, types_[kind]) for name, kind in column_kinds().items()])


def row_of(stream: str, entry_id: str, fields: Mapping[str, str]) -> dict[str, Any]:
    """One archive row from a stream entry's fields (`id`, `json`)."""
    try:
        data = orjson.loads(fields["json"])
        if not isinstance(data, dict):
            raise TypeError(f"the record is a {type(data).__name__}, not an object")
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        log.warning("stream entry %s of %s has no readable record (%s)", entry_id, stream, exc)
        data, extra = {}, dict(fields)
    else:
        extra = {name: value for name, value in data.items() if name not in _KNOWN}
    try:
        rec = SpendRecord.from_dict(data)
        row = {name: getattr(rec, name) for name in RECORD_FIELDS}
        day = rec.day
    except (TypeError, ValueError) as exc:
        if data:
            log.warning("archiving stream entry %s of %s as it is (%s)", entry_id, stream, exc)
        row = {name: _convert(data.get(name), column_kinds()[name]) for name in RECORD_FIELDS}
        day = _day_of(row["ts"], entry_id)
    row.update(
        day=day,
        event_stream=stream,
        event_id=entry_id,
        extra=orjson.dumps(extra).decode() if extra else None,
    )
    return row


def table_of(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The rows as a `pyarrow.Table` in the archive's schema."""
    [pa] = require("pyarrow")
    schema = arrow_schema()
    columns = {name: [row[name] for row in rows] for name in schema.names}
    return pa.Table.from_pydict(columns, schema=schema)


def _convert(value: Any, kind: KindType) -> Any:
    if value is None or value == "":
        return None
    try:
        if kind == "int64":
            return int(value)
        if kind == "float64":
            return float(value)
        if kind == "bool":
            return value in (True, 1, "1", "true", "True")
        return value if isinstance(value, str) else orjson.dumps(value).decode()
    except (TypeError, ValueError):
        return None


def _day_of(ts: float | None, entry_id: str) -> str:
    """The record's day; failing that, the day its entry reached the stream."""
    if ts is not None:
        return utc_day(int(ts // 86400))
    ms = int(entry_id.partition("-")[0])
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")

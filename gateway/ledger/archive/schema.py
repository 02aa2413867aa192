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
before they existed take their defaults), then every field is converted to its column's
type, parsed or not: a string column takes any other value as its JSON ("team": 123 ->
"123"), a number column a number or a string of one; a value that converts to none (a
number that does not parse, or past int64) is null, and kept as written in `extra`.
So one odd record never fails its file.
"""

from __future__ import annotations

import contextlib
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
from gateway.ledger.record import SpendRecord, truthy, utc_day

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
    """One archive row from a stream entry's fields (`id`, `json`); never raises, so one
    odd entry cannot hold up its batch."""
    extra: dict[str, Any]
    try:
        data = orjson.loads(fields["json"])
        if not isinstance(data, dict):
            raise TypeError(f"the record is a {type(data).__name__}, not an object")
    except (KeyError, TypeError, orjson.JSONDecodeError) as exc:
        log.warning("stream entry %s of %s has no readable record (%s)", entry_id, stream, exc)
        data, extra = {}, dict(fields)
    else:
        extra = {name: value for name, value in data.items() if name not in _KNOWN}
    values, day = _values_of(data, stream, entry_id)
    kinds = column_kinds()
    row: dict[str, Any] = {}
    for name in RECORD_FIELDS:
        # Every value through `_convert`: a record can parse and still hold a wrong type
        # ("team": 123), which pyarrow would refuse for the whole file.
        row[name] = _convert(values.get(name), kinds[name])
        if row[name] is UNREADABLE:
            row[name] = None
            extra[name] = data.get(name)  # as it was written: nothing is dropped
    row.update(
        day=day or _day_of(row["ts"], entry_id),
        event_stream=stream,
        event_id=entry_id,
        extra=orjson.dumps(extra, default=str).decode() if extra else None,
    )
    return row


def table_of(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The rows as a `pyarrow.Table` in the archive's schema."""
    [pa] = require("pyarrow")
    schema = arrow_schema()
    columns = [_column(pa, [row[field.name] for row in rows], field) for field in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def _values_of(
    data: dict[str, Any], stream: str, entry_id: str
) -> tuple[dict[str, Any], str | None]:
    """The record's fields as the gateway reads them, and its day; failing that (it does
    not parse), its fields as they are, and no day."""
    try:
        rec = SpendRecord.from_dict(data)
        return {name: getattr(rec, name) for name in RECORD_FIELDS}, rec.day
    except (TypeError, ValueError, OverflowError, OSError) as exc:
        if data:
            log.warning("archiving stream entry %s of %s as it is (%s)", entry_id, stream, exc)
        return data, None


UNREADABLE: Any = object()  # a value its column cannot hold: null, and kept in `extra`
_INT64 = range(-(2**63), 2**63)


def _convert(value: Any, kind: KindType) -> Any:
    """`value` as its column holds it: a string column takes anything else as JSON, a
    number column a number or a string of one; otherwise `UNREADABLE`."""
    if value is None:
        return None
    if kind == "string":
        return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    if value == "":
        return None
    if kind == "bool":
        return truthy(value)
    try:
        if kind == "float64":
            return float(value)
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return UNREADABLE
    return number if number in _INT64 else UNREADABLE


def _column(pa: Any, values: list[Any], field: Any) -> Any:
    """One column; a value it cannot hold (`row_of` makes none) becomes null rather
    than failing the file, and with it the batch, again and again."""
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        log.error("archive column %s: %s; writing null for what it cannot hold", field.name, exc)
        return pa.array([_held(pa, value, field.type) for value in values], type=field.type)


def _held(pa: Any, value: Any, type_: Any) -> Any:
    try:
        pa.scalar(value, type=type_)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None
    return value


def _day_of(ts: float | None, entry_id: str) -> str:
    """The record's day; failing that, the day its entry reached the stream."""
    with contextlib.suppress(TypeError, ValueError, OverflowError, OSError):
        if ts is not None:
            return utc_day(int(ts // 86400))
    ms = int(entry_id.partition("-")[0])
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d")

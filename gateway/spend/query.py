"""The spend API's query parameters, checked: bad ones are a 400 naming the parameter.

    GET /v1/spend?from=2026-11-01&to=2026-11-30&group_by=team,model&team=research&format=csv

`from`/`to` default to the 30 days ending today (UTC); both ends are inclusive.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from typing import get_args

from gateway.errors import InvalidRequest
from gateway.ledger.rollup import GROUPABLE
from gateway.spend.report import FormatType

DEFAULT_DAYS = 30
MAX_DAYS = 400  # the ledger keeps daily aggregates this long
MAX_LIMIT = 10_000
FORMATS: tuple[str, ...] = get_args(FormatType)


@dataclass(frozen=True, slots=True)
class SpendQuery:
    day_from: date
    day_to: date
    group_by: tuple[str, ...] = ()
    teams: frozenset[str] | None = None
    fmt: FormatType = "json"
    sort: str | None = None  # a column; `descending` when it was given as `-column`
    descending: bool = False
    limit: int | None = None


def parse_query(
    params: Mapping[str, str],
    allowed: Collection[str],
    today: date,
    max_days: int | None = MAX_DAYS,
) -> SpendQuery:
    """`params` checked against the names in `allowed` (a subset of SpendQuery's).
    `max_days`: the longest range (None: any, as the archive keeps every day)."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter '{unknown[0]}'; this endpoint takes "
            f"{', '.join(sorted(allowed))}",
            param=unknown[0],
        )
    day_to = parse_day(params, "to") or today
    day_from = parse_day(params, "from") or day_to - timedelta(days=DEFAULT_DAYS - 1)
    if day_from > day_to:
        raise InvalidRequest(f"from ({day_from}) is after to ({day_to})", param="from")
    if max_days is not None and (day_to - day_from).days >= max_days:
        raise InvalidRequest(
            f"from {day_from} to {day_to} spans more than {max_days} days, the ledger's retention",
            param="from",
        )
    sort, descending = parse_sort(params.get("sort"))
    return SpendQuery(
        day_from=day_from,
        day_to=day_to,
        group_by=parse_group_by(params.get("group_by", "")),
        teams=parse_teams(params.get("team")),
        fmt=parse_format(params.get("format", "json")),
        sort=sort,
        descending=descending,
        limit=parse_limit(params.get("limit")),
    )


def parse_day(params: Mapping[str, str], name: str) -> date | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        return date.fromisoformat(raw) if len(raw) == 10 else _bad_day(name, raw)
    except ValueError:
        return _bad_day(name, raw)


def _bad_day(name: str, raw: str) -> date:
    raise InvalidRequest(f"{name} is '{raw}'; expected a date as YYYY-MM-DD", param=name)


def parse_group_by(raw: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in raw.split(",") if name.strip()))
    for name in names:
        if name not in GROUPABLE:
            raise InvalidRequest(
                f"group_by has '{name}'; choose from {', '.join(GROUPABLE)} (comma-separated)",
                param="group_by",
            )
    return names


def parse_teams(raw: str | None) -> frozenset[str] | None:
    if raw is None:
        return None
    teams = frozenset(team.strip() for team in raw.split(",") if team.strip())
    if not teams:
        raise InvalidRequest("team is empty; give team names, comma-separated", param="team")
    return teams


def parse_format(raw: str) -> FormatType:
    if raw == "csv":
        return "csv"
    if raw == "json":
        return "json"
    raise InvalidRequest(f"format is '{raw}'; choose from {', '.join(FORMATS)}", param="format")


def parse_sort(raw: str | None) -> tuple[str | None, bool]:
    if raw is None or raw == "":
        return None, False
    return (raw[1:], True) if raw.startswith("-") else (raw, False)


def parse_limit(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest(
            f"limit is '{raw}'; expected a whole number from 1 to {MAX_LIMIT}", param="limit"
        )
    return int(raw)

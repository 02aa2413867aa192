"""The spend API, for finance keys (the policy's `finance_keys`) and admin keys.

    GET /v1/spend?from=&to=&group_by=&team=&sort=&limit=&format=json|csv
    GET /v1/spend/budgets?team=&format=json|csv
    GET /v1/spend/sla?from=&to=&team=&format=json|csv
    GET /v1/spend/access        -> {"role": "finance" | "admin"} (the dashboard's login)

A JSON reply with no rows says why in `note` (no requests in the range, no budgets in
the policy, no route with an SLA); `note` is null otherwise.

Replies are never cached (`cache-control: no-store`). Plain Starlette routes, like the
OpenAI surface: the parameters are checked by `gateway.spend.query`, whose 400s name
the parameter.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.auth import bearer_secret
from gateway.errors import (
    AuthenticationFailed,
    InvalidRequest,
    PermissionDenied,
    UpstreamUnavailable,
)
from gateway.http.services import Services, services_of
from gateway.ledger import LedgerLayoutError, LedgerUnavailable
from gateway.runtime import Runtime
from gateway.spend import budgets as budget_report
from gateway.spend import sla as sla_report
from gateway.spend.query import SpendQuery, parse_query
from gateway.spend.report import (
    COLUMNS,
    aggregate,
    csv_text,
    range_of,
    report_body,
    report_row,
)
from policies.keys import hash_key

RoleType = Literal["admin", "finance"]
NO_STORE = {"cache-control": "no-store"}
SPEND_PARAMS = ("from", "to", "group_by", "team", "sort", "limit", "format")
BUDGET_PARAMS = ("team", "format")
SLA_PARAMS = ("from", "to", "team", "format")


def authorize(request: Request) -> tuple[Services, RoleType]:
    """The caller's role; 401 without a finance or admin key, 403 for a client key."""
    services = services_of(request)
    runtime = services.runtime
    secret = bearer_secret(request.headers.get("authorization"))
    if secret is None:
        raise AuthenticationFailed(
            "missing key: send 'Authorization: Bearer <finance or admin key>'",
            code="missing_api_key",
        )
    digest = hash_key(secret)
    if digest in runtime.keys.admin_hashes:
        return services, "admin"
    if digest in finance_hashes(runtime):
        return services, "finance"
    principal = runtime.keys.principals.get(digest)
    if principal is not None:
        raise PermissionDenied(
            f"key '{principal.key_id}' is a client key; the spend API takes a finance or admin key",
            code="finance_key_required",
        )
    raise AuthenticationFailed("invalid finance or admin key")


def query_of(request: Request, allowed: Sequence[str]) -> SpendQuery:
    """The query string checked; a repeated parameter's values are joined by commas."""
    params = request.query_params
    joined = {name: ",".join(params.getlist(name)) for name in params}
    return parse_query(joined, allowed, datetime.now(UTC).date())


@contextmanager
def ledger_errors() -> Iterator[None]:
    try:
        yield
    except LedgerUnavailable as exc:
        raise UpstreamUnavailable(
            f"the spend ledger cannot be read now: {exc}", code="ledger_unavailable"
        ) from exc
    except LedgerLayoutError as exc:  # the gateway's shard count is not the ledger's
        raise UpstreamUnavailable(
            f"the spend ledger cannot be read: {exc}", code="ledger_layout_mismatch"
        ) from exc


async def spend(request: Request) -> Response:
    services, _ = authorize(request)
    query = query_of(request, SPEND_PARAMS)
    columns = [*query.group_by, *COLUMNS]
    check_sort(query, columns)
    with ledger_errors():
        rows = await aggregate(
            services.ledger, query.day_from, query.day_to, query.group_by, query.teams
        )
    data = ordered([report_row(row) for row in rows], query)
    if query.fmt == "csv":
        return csv_response(csv_text(data, columns), "spend", query)
    return JSONResponse(report_body(query, rows, data), headers=NO_STORE)


async def budgets(request: Request) -> Response:
    services, _ = authorize(request)
    query = query_of(request, BUDGET_PARAMS)
    policy = services.runtime.policy
    key_teams = {key_id: key.team for key_id, key in policy.keys.items()}
    now = datetime.now(UTC)
    with ledger_errors():
        data = await budget_report.budget_statuses(
            services.ledger, policy.budgets, now, query.teams, key_teams
        )
    if query.fmt == "csv":
        return csv_response(budget_report.render_budgets(data, "csv"), "budgets", None)
    note = None if data else budget_report.no_budgets_note(policy.budgets, query.teams)
    body = {"object": "spend.budgets", "as_of": now.isoformat(), "data": data, "note": note}
    return JSONResponse(body, headers=NO_STORE)


async def sla(request: Request) -> Response:
    services, _ = authorize(request)
    query = query_of(request, SLA_PARAMS)
    routes = services.runtime.policy.routes
    with ledger_errors():
        data = await sla_report.sla_report(
            services.ledger, query.day_from, query.day_to, routes, query.teams
        )
    if query.fmt == "csv":
        return csv_response(csv_text(data, sla_report.COLUMNS), "sla", query)
    note = None if data else sla_report.NO_SLA_NOTE
    body = {"object": "spend.sla", **range_of(query), "data": data, "note": note}
    return JSONResponse(body, headers=NO_STORE)


async def access(request: Request) -> Response:
    _, role = authorize(request)
    return JSONResponse({"role": role}, headers=NO_STORE)


def check_sort(query: SpendQuery, columns: Sequence[str]) -> None:
    if query.sort is not None and query.sort not in columns:
        raise InvalidRequest(
            f"sort is '{query.sort}'; choose a column ({', '.join(columns)}), "
            "with a leading '-' for descending",
            param="sort",
        )


def ordered(rows: list[dict[str, Any]], query: SpendQuery) -> list[dict[str, Any]]:
    """Rows sorted by `query.sort` (stable; group order otherwise), cut at `limit`.
    Rows without a value in that column (no savings: no reference) come last."""
    if query.sort is not None:
        known = [row for row in rows if row[query.sort] is not None]
        known.sort(key=itemgetter(query.sort), reverse=query.descending)
        rows = known + [row for row in rows if row[query.sort] is None]
    return rows if query.limit is None else rows[: query.limit]


def csv_response(text: str, name: str, query: SpendQuery | None) -> Response:
    span = "" if query is None else f"-{query.day_from}-{query.day_to}"
    headers = {**NO_STORE, "content-disposition": f'attachment; filename="{name}{span}.csv"'}
    return Response(text, media_type="text/csv", headers=headers)


def finance_hashes(runtime: Runtime) -> frozenset[str]:
    return frozenset(hash_key(key) for key in runtime.policy.finance_keys if key)


ROUTES = [
    Route("/v1/spend", spend, methods=["GET"]),
    Route("/v1/spend/budgets", budgets, methods=["GET"]),
    Route("/v1/spend/sla", sla, methods=["GET"]),
    Route("/v1/spend/access", access, methods=["GET"]),
]

"""Finance's figures where there is nothing to compare with, and the command line's
replies: no percentage of nothing, the API's JSON from `spend report`, one-line errors
for a ledger or archive that cannot be read, and exact dollars in budget rows."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli import main
from gateway.ledger import AggregateRow, MemoryStore, RedisStore, SpendRecord
from gateway.ledger.archive import ArchiveExporter
from gateway.spend.budgets import Period, budget_status, render_budgets
from gateway.spend.report import COLUMNS, aggregate, csv_text, report_row, total
from policies.access import Budget
from tests.gateway.archive_support import FAST, varied_record
from tests.gateway.conftest import StartGateway
from tests.gateway.ledger_fixtures import DAY0, delete_prefix, make_record

NOW = datetime.now(UTC)
NOON0 = datetime(DAY0.year, DAY0.month, DAY0.day, 12, tzinfo=UTC).timestamp()
TODAY = NOW.date().isoformat()


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW and TODAY are each test's own moment: taken at import, a run crossing midnight
    UTC filed its records under yesterday while budgets counted today."""
    now = datetime.now(UTC)
    monkeypatch.setattr(sys.modules[__name__], "NOW", now)
    monkeypatch.setattr(sys.modules[__name__], "TODAY", now.date().isoformat())


GROUPS = ["team", "route", "deployment"]
FINANCE_KEY = "fake-finance-key"
REFERENCE = 315_000  # the request's first answer's tokens on the reference model
COMPARED = ("reference_cost_usd", "savings_usd", "savings_pct")

POLICY = """
deployments:
  cheap:
    api_base: http://127.0.0.1:9/v1
    model: small-model
    tier: cheap
    price: {input_per_mtok: 1, output_per_mtok: 1}
  premium:
    api_base: http://127.0.0.1:9/v1
    model: big-model
    tier: premium
    price: {input_per_mtok: 10, output_per_mtok: 10}
routes:
  auto:
    strategy: cascade
    deployments: [cheap, premium]
    reference_model: premium
keys:
  k: {secret: "${GATEWAY_TEST_KEY}", team: research}
teams:
  research: {}
admin_keys: ["${GATEWAY_ADMIN_KEY}"]
finance_keys: ["${FINANCE_KEY}"]
budgets:
  - {scope: team, name: research, period: day, limit_usd: 10, soft_limit_usd: 0.00001}
  - {scope: key, name: k, period: month, limit_usd: 2.5}
"""


def traffic(ts: float) -> list[SpendRecord]:
    """A cascade's request answered by `cheap` (the request, with its reference cost)
    and escalated to `premium` (cost only: the reference counts once per request), and
    a request that got no answer (an error record, on `down`)."""
    mine: dict[str, Any] = {"ts": ts, "team": "research", "key": "k", "route": "auto"}
    first = make_record(
        1, **mine, deployment="cheap", cost_nanos=42_000, reference_cost_nanos=REFERENCE
    )
    escalation = make_record(
        1,
        **mine,
        record_id="req-1:1",
        deployment="premium",
        cost_nanos=REFERENCE,
        reference_cost_nanos=0,
    )
    failed = make_record(
        7,  # an error record (7 % 7 == 0)
        **mine,
        deployment="down",
        prompt_tokens=0,
        completion_tokens=0,
        cost_nanos=0,
        reference_cost_nanos=0,
    )
    return [first, escalation, failed]


async def test_a_row_with_no_reference_cost_has_no_savings_percentage() -> None:
    store = MemoryStore()
    for rec in traffic(NOON0):
        await store.record(rec)
    rows = await aggregate(store, DAY0, DAY0, GROUPS)
    by_deployment = {row.group["deployment"]: report_row(row) for row in rows}

    cheap = by_deployment["cheap"]
    assert cheap["savings_nanos"] == REFERENCE - 42_000
    assert cheap["savings_pct"] == round(100 * (REFERENCE - 42_000) / REFERENCE, 2)
    # The escalation's deployment: called, no request, no reference cost of its own.
    premium = by_deployment["premium"]
    assert (premium["requests"], premium["calls"], premium["reference_coverage"]) == (0, 1, "full")
    assert (premium["reference_cost_nanos"], premium["savings_nanos"]) == (0, -REFERENCE)
    assert (premium["savings_pct"], premium["error_rate_pct"]) == (None, None)
    # A request that got no answer: an error rate, no saving to express as a share.
    down = by_deployment["down"]
    assert (down["requests"], down["errors"], down["error_rate_pct"]) == (1, 1, 100.0)
    assert (down["savings_nanos"], down["savings_pct"]) == (0, None)

    table = list(csv.DictReader(io.StringIO(csv_text(list(by_deployment.values()), COLUMNS))))
    by_cell = {row["cost_usd"]: row for row in table}
    escalated, failed = by_cell["0.000315000"], by_cell["0.000000000"]
    assert (escalated["savings_usd"], escalated["savings_pct"]) == ("-0.000315000", "")
    assert escalated["error_rate_pct"] == ""  # no requests: no rate either
    assert (failed["savings_pct"], failed["error_rate_pct"]) == ("", "100.0")
    assert by_cell["0.000042000"]["savings_pct"] == str(cheap["savings_pct"])


def test_the_total_of_no_rows_has_no_reference() -> None:
    row = report_row(total([]))
    assert row["reference_coverage"] == "none"
    assert [row[column] for column in COMPARED] == [None, None, None]
    assert (row["reference_cost_nanos"], row["savings_nanos"], row["error_rate_pct"]) == (
        None,
        None,
        None,
    )
    assert (row["cost_usd"], row["cost_nanos"], row["requests"]) == (0.0, 0, 0)
    [cells] = csv.DictReader(io.StringIO(csv_text([row], COLUMNS)))
    assert [cells[column] for column in (*COMPARED, "error_rate_pct")] == ["", "", "", ""]
    assert cells["cost_usd"] == "0.000000000"


def test_rows_written_before_calls_were_counted_still_compare() -> None:
    """Days aggregated before the `calls` counter existed have requests and cost, no
    calls: records went into them, so they compare as they did."""
    old = AggregateRow({}, 2, 0, 10, 5, cost_nanos=300, reference_cost_nanos=900)
    assert (old.has_records, old.coverage, old.savings_nanos) == (True, "full", 600)
    escalations_only = AggregateRow({}, 0, 0, 10, 5, cost_nanos=300, reference_cost_nanos=0)
    assert (escalations_only.coverage, escalations_only.savings_nanos) == ("full", -300)


def test_budget_dollars_are_exact_decimals_in_csv() -> None:
    budgets = [
        Budget(scope="team", name="research", period="day", limit_usd=10, soft_limit_usd=0.00001),
        Budget(scope="key", name="k", period="day", limit_usd=2.5),
    ]
    period = Period.containing("day", NOW)
    statuses = [budget_status(b, period, NOW, {TODAY: 437_500}) for b in budgets]
    assert (statuses[0]["limit_nanos"], statuses[0]["soft_limit_nanos"]) == (10**10, 10_000)
    assert (statuses[1]["soft_limit_nanos"], statuses[1]["soft_limit_usd"]) == (None, None)
    research, key = csv.DictReader(io.StringIO(render_budgets(statuses, "csv")))
    assert (research["limit_usd"], research["soft_limit_usd"]) == ("10.000000000", "0.000010000")
    assert (research["spent_usd"], research["remaining_usd"]) == ("0.000437500", "9.999562500")
    assert (key["limit_usd"], key["soft_limit_usd"]) == ("2.500000000", "")
    for column in ("burn_rate_usd_per_day", "forecast_usd"):
        whole, _, places = research[column].partition(".")
        assert whole.lstrip("-").isdigit() and len(places) == 9, (column, research[column])


@pytest.fixture
def finance_gateway(
    start_gateway: StartGateway,
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
) -> str:
    """A gateway with a finance key over a Redis ledger holding today's `traffic`, and
    the command line pointed at the same ledger; the gateway's URL."""

    async def fill() -> None:
        store = RedisStore(redis_url, prefix=redis_prefix)
        await store.record_many(traffic(NOW.timestamp()))
        await store.close()

    asyncio.run(fill())
    server = start_gateway(POLICY, FINANCE_KEY=FINANCE_KEY)
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CASCADE_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("CASCADE_POLICY", str(tmp_path / "policy-0.yaml"))
    return server.url


def api(base: str, path: str, **params: str) -> httpx.Response:
    reply = httpx.get(
        f"{base}{path}", params=params, headers={"authorization": f"Bearer {FINANCE_KEY}"}
    )
    assert reply.status_code == 200, reply.text
    return reply


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["spend", *args]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    return out


def test_spend_report_prints_the_apis_reply(
    finance_gateway: str, capsys: pytest.CaptureFixture[str]
) -> None:
    days = {"from": TODAY, "to": TODAY, "group_by": ",".join(GROUPS)}
    args = ["report", "--from", TODAY, "--to", TODAY, "--group-by", ",".join(GROUPS)]
    body = json.loads(cli(capsys, *args, "--format", "json"))
    assert body == api(finance_gateway, "/v1/spend", **days).json()
    assert [row["deployment"] for row in body["data"]] == ["cheap", "down", "premium"]
    assert body["data"][2]["savings_pct"] is None and body["note"] is None
    assert body["total"]["savings_nanos"] == REFERENCE - 42_000 - REFERENCE
    assert cli(capsys, *args) == api(finance_gateway, "/v1/spend", **days, format="csv").text

    # An empty range: the same total of nothing (no reference: null) and the same note.
    empty = {"from": "2026-01-01", "to": "2026-01-01"}
    out = cli(capsys, "report", "--from", "2026-01-01", "--to", "2026-01-01", "--format", "json")
    body = json.loads(out)
    assert body == api(finance_gateway, "/v1/spend", group_by="team", **empty).json()
    assert (body["data"], body["note"]) == ([], "no requests from 2026-01-01 to 2026-01-01")
    assert body["total"]["reference_coverage"] == "none"
    assert [body["total"][column] for column in (*COMPARED, "error_rate_pct")] == [None] * 4


def test_budget_rows_write_every_dollar_alike(
    finance_gateway: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spent = "0.000357000"  # the request's two answers; the error record cost nothing
    exact = ["limit_usd", "soft_limit_usd", "spent_usd", "remaining_usd"]
    from_api = list(
        csv.DictReader(io.StringIO(api(finance_gateway, "/v1/spend/budgets", format="csv").text))
    )
    from_cli = list(csv.DictReader(io.StringIO(cli(capsys, "budgets"))))
    for rows in (from_api, from_cli):
        research, key = rows
        assert [research[c] for c in exact] == ["10.000000000", "0.000010000", spent, "9.999643000"]
        assert [key[c] for c in exact] == ["2.500000000", "", spent, "2.499643000"]
    body = api(finance_gateway, "/v1/spend/budgets").json()
    assert [b["limit_nanos"] for b in body["data"]] == [10**10, 2_500_000_000]


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"cgtest-{uuid.uuid4().hex[:10]}:"
    yield prefix
    await delete_prefix(redis_url, prefix)


def test_a_file_that_is_not_parquet_is_named_not_a_traceback(
    redis_url: str, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def archive() -> None:
        store = RedisStore(redis_url, prefix=prefix)
        await store.record_many([varied_record(i) for i in range(20)])
        await ArchiveExporter(store.client, store.event_stream_keys(), tmp_path, FAST).drain()
        await store.close()

    asyncio.run(archive())
    [good] = tmp_path.glob("day=*/*.parquet")
    # Named as an exporter names its files, so the report lists it beside the real one.
    bad = good.parent / "x-ledger-events-garbage_1-0_2-0.parquet"
    window = ["report", "--from", DAY0.isoformat(), "--to", DAY0.isoformat()]
    args = ["spend", *window, "--format", "json", "--archive", str(tmp_path)]
    for content in (b"garbage", b"PAR1" + b"\0" * 4096 + good.read_bytes()[-64:]):
        bad.write_bytes(content)
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"spend report: cannot read {bad} in the archive: "), err
        assert len(err.splitlines()) == 1 and "Traceback" not in err
    bad.unlink()
    assert main(args) == 0


def test_a_database_redis_lacks_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/99")  # 16 databases: 0-15
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    monkeypatch.setenv("GATEWAY_TEST_KEY", "k")
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "a")
    monkeypatch.setenv("FINANCE_KEY", "f")
    for args in (["report"], ["budgets", "--policy", str(policy)]):
        assert main(["spend", *args]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        [line] = [
            line for line in captured.err.splitlines() if not line.startswith("spend report: from")
        ]
        assert line == (
            "redis at 127.0.0.1:6379/99 refused to read the ledger: DB index is out of range"
        )

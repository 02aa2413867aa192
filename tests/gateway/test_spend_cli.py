"""`cascade-gateway spend` and the finance notes of `policy check`, run through the
CLI's `main` on real Redis: defaults as the spend API's, and an empty answer that says
why it is empty."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.ledger import RedisStore, SpendRecord
from policies import DEFAULT_POLICY_PATH
from tests.gateway.ledger_fixtures import make_record

NOW = datetime.now(UTC)


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOW is each test's own moment: taken at import, a run crossing midnight UTC filed
    its records under yesterday while the CLI's defaults had moved on to today."""
    now = datetime.now(UTC)
    monkeypatch.setattr(sys.modules[__name__], "NOW", now)


def record_days_ago(i: int, days: int) -> SpendRecord:
    return make_record(i, ts=(NOW - timedelta(days=days)).timestamp(), status="ok")


@pytest.fixture
def ledger_env(monkeypatch: pytest.MonkeyPatch, redis_url: str, redis_prefix: str) -> None:
    """The CLI pointed at a Redis ledger holding records from today, 29 and 30 days ago."""
    records = [record_days_ago(1, 0), record_days_ago(2, 29), record_days_ago(3, 30)]

    async def fill() -> None:
        store = RedisStore(redis_url, prefix=redis_prefix)
        await store.record_many(records)
        await store.close()

    asyncio.run(fill())
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("CASCADE_REDIS_PREFIX", redis_prefix)


def test_spend_report_defaults_to_the_last_thirty_days_as_the_api(
    ledger_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spend", "report", "--group-by", "day", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    first = (NOW - timedelta(days=29)).date().isoformat()
    assert [row["day"] for row in json.loads(out)["data"]] == [first, NOW.date().isoformat()]
    assert f"from {first} to {NOW.date().isoformat()} (UTC)" in err

    to = (NOW - timedelta(days=1)).date().isoformat()  # `from` defaults to 29 days before `to`
    assert main(["spend", "report", "--to", to, "--group-by", "day", "--format", "json"]) == 0
    days = [row["day"] for row in json.loads(capsys.readouterr().out)["data"]]
    assert days == [(NOW - timedelta(days=30)).date().isoformat(), first]


def test_spend_report_checks_its_days_as_the_api_does(
    ledger_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spend", "report", "--from", "2026-13-01"]) == 2
    assert "from is '2026-13-01'; expected a date as YYYY-MM-DD" in capsys.readouterr().err
    assert main(["spend", "report", "--group-by", "colour"]) == 2
    assert "group_by has 'colour'" in capsys.readouterr().err


def test_spend_report_help_gives_the_default_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["spend", "report", "--help"])
    assert "by default the last 30 days" in " ".join(capsys.readouterr().out.split())


def test_spend_budgets_says_why_it_lists_none(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --policy it reads what serve reads (CASCADE_POLICY, else the embedded
    default, which has no budgets) and says so, rather than print a bare header."""
    assert main(["spend", "budgets"]) == 0  # no Redis needed to list no budgets
    out, err = capsys.readouterr()
    assert out.startswith("scope,name,period,") and len(out.splitlines()) == 1
    assert f"the policy {DEFAULT_POLICY_PATH} (the embedded default) has no budgets" in err
    assert "--policy FILE or CASCADE_POLICY" in err


def test_policy_check_notes_that_no_finance_key_is_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FINANCE_KEY", raising=False)
    assert main(["policy", "check", str(DEFAULT_POLICY_PATH)]) == 0
    assert "note: no finance key in the policy: the spend API and /dashboard/ answer" in (
        capsys.readouterr().out
    )

    # The default policy's commented example, switched on: a note while FINANCE_KEY is
    # unset, none once it is set.
    text = DEFAULT_POLICY_PATH.read_text()
    assert '\n# finance_keys: ["${FINANCE_KEY}"]\n' in text
    path = tmp_path / "policy.yaml"
    path.write_text(text.replace("\n# finance_keys:", "\nfinance_keys:"))
    assert main(["policy", "check", str(path)]) == 0
    assert "note: no finance key is set: the spend API" in capsys.readouterr().out
    monkeypatch.setenv("FINANCE_KEY", "fake-finance-key")
    assert main(["policy", "check", str(path)]) == 0
    assert "finance key" not in capsys.readouterr().out

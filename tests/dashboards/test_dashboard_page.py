"""The finance dashboard in a real headless Chromium (Debian's `chromium`, driven by
Playwright; never a downloaded browser build), against a gateway whose ledger was
filled by real requests. Screenshots land in `test-artifacts/` (gitignored)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboards.conftest import (
    BARE_REQUESTS,
    FINANCE_KEY,
    REFUSED,
    FilledGateway,
    finance_headers,
)
from tests.support import unavailable

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-crash-reporter",
]


def chromium_path() -> str:
    """Debian's chromium; under CI a missing browser fails the test, locally it skips."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        unavailable("chromium is not installed (apt-get install -y chromium)")
    return path


@dataclass
class Tab:
    """A browser page and what it logged: console errors, uncaught exceptions, URLs."""

    page: Any
    problems: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def watch(self) -> None:
        def console(message: Any) -> None:
            if message.type == "error":
                self.problems.append(message.text)

        self.page.on("console", console)
        self.page.on("pageerror", lambda exc: self.problems.append(str(exc)))
        self.page.on("request", lambda request: self.urls.append(request.url))


@pytest.fixture
async def tab() -> AsyncIterator[Tab]:
    executable = chromium_path()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        context = await browser.new_context(
            viewport={"width": 1440, "height": 900}, accept_downloads=True
        )
        tab = Tab(await context.new_page())
        tab.watch()
        try:
            yield tab
        finally:
            await browser.close()


def api(gateway: FilledGateway, path: str, **params: str) -> Any:
    reply = httpx.get(f"{gateway.url}{path}", params=params, headers=finance_headers())
    assert reply.status_code == 200, reply.text
    return reply.json() if params.get("format") != "csv" else reply.text


async def chart(page: Any, name: str) -> dict[str, Any]:
    """A chart's labels and datasets, as Chart.js holds them."""
    return await page.evaluate(
        """(id) => {
            const c = Chart.getChart(id);
            return {type: c.config.type, labels: c.data.labels,
                    datasets: c.data.datasets.map(d => ({label: d.label, data: d.data}))};
        }""",
        f"chart-{name}",
    )


async def cells(page: Any, name: str) -> dict[str, dict[str, dict[str, str]]]:
    """A table's body: first cell's text -> column -> the cell's text, value and title."""
    rows: dict[str, dict[str, dict[str, str]]] = await page.evaluate(
        """(name) => Object.fromEntries([...document.querySelectorAll(`#table-${name} tbody tr`)]
            .map((tr) => [tr.cells[0].textContent, Object.fromEntries([...tr.cells].map((td) =>
                [td.dataset.column || "", {text: td.textContent, value: td.dataset.value ?? "",
                 title: td.title}]))]))""",
        name,
    )
    return rows


async def kpi(page: Any, name: str) -> float:
    """The exact number behind a headline figure (the text shown is rounded)."""
    return float(await page.get_attribute(f"#kpi-{name}", "data-value"))


async def sign_in(page: Any, key: str) -> None:
    await page.fill("#key", key)
    await page.click("#login-form button[type=submit]")


async def test_dashboard_renders_filters_and_exports_what_the_api_serves(
    filled: FilledGateway, tab: Tab, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tab.page
    await page.goto(f"{filled.url}/dashboard/")
    assert await page.is_visible("#login-form")
    await sign_in(page, "fake-wrong-key")
    await page.wait_for_function("document.getElementById('login-error').textContent !== ''")
    assert "invalid" in await page.text_content("#login-error")
    tab.problems.clear()  # the browser logs the 401 above, as it should

    await sign_in(page, FINANCE_KEY)
    await page.wait_for_selector("body[data-state=ready]")
    span = {"from": await page.input_value("#from"), "to": await page.input_value("#to")}

    # Spend over time, stacked by team: one dataset per team, the API's numbers per day.
    stacked = api(filled, "/v1/spend", **span, group_by="day,team")["data"]
    spend = await chart(page, "spend")
    assert spend["type"] == "bar"
    assert [d["label"] for d in spend["datasets"]] == ["research", "sales"]
    assert spend["labels"] == sorted({row["day"] for row in stacked})
    for dataset in spend["datasets"]:
        expected = {r["day"]: r["cost_usd"] for r in stacked if r["team"] == dataset["label"]}
        assert dict(zip(spend["labels"], dataset["data"], strict=True)) == expected

    total = api(filled, "/v1/spend", **span)["total"]
    assert await kpi(page, "cost") == total["cost_usd"]
    assert await kpi(page, "savings") == total["savings_usd"]
    assert await kpi(page, "cache-savings") == total["cache_savings_usd"]
    assert await kpi(page, "per-1k") == total["cost_per_1k_requests_usd"]
    assert await kpi(page, "requests") == total["requests"]

    tiers = api(filled, "/v1/spend", **span, group_by="tier")["data"]
    doughnut = await chart(page, "tiers")
    assert doughnut["labels"] == [row["tier"] for row in tiers] == ["cheap", "premium"]
    assert doughnut["datasets"][0]["data"] == [row["requests"] for row in tiers]
    savings = await chart(page, "savings")
    assert [d["label"] for d in savings["datasets"]] == ["Cost", "Reference cost"]
    sla = await chart(page, "sla")
    assert sla["labels"] == ["auto", "strict"]
    assert sla["datasets"][0]["data"] == [100.0, 0.0]
    budget = await chart(page, "budget")
    assert [d["label"] for d in budget["datasets"]] == ["Spent", "Forecast", "Limit", "Soft limit"]

    await save(page, "dashboard.png", capsys)

    # The team filter changes the numbers, to the API's numbers for that team.
    await page.select_option("#team", "sales")
    await page.click("#filters button[type=submit]")
    await page.wait_for_selector("body[data-state=ready][data-loads='2']")
    sales = api(filled, "/v1/spend", **span, team="sales")["total"]
    assert sales["requests"] < total["requests"]
    assert await kpi(page, "requests") == sales["requests"]
    assert await kpi(page, "cost") == sales["cost_usd"]
    assert [d["label"] for d in (await chart(page, "spend"))["datasets"]] == ["sales"]

    # Export downloads the API's CSV for the table as shown (filter included).
    async with page.expect_download() as download_info:
        await page.click("#panel-keys button.export")
    download = await download_info.value
    exported = Path(await download.path()).read_text()
    params = {**span, "team": "sales", "group_by": "key", "sort": "-cost_usd", "limit": "10"}
    assert exported == api(filled, "/v1/spend", **params, format="csv")
    assert exported.splitlines()[1].startswith("sales-1,")
    assert download.suggested_filename == f"spend-{span['from']}-{span['to']}.csv"

    assert tab.problems == []
    assert not [url for url in tab.urls if FINANCE_KEY in url]  # never in a URL

    await page.emulate_media(media="print")
    await save(page, "dashboard-print.png", capsys)
    await page.emulate_media(media="screen")

    await page.click("#sign-out")
    assert await page.evaluate("sessionStorage.length") == 0
    assert await page.is_visible("#login-form")


async def save(page: Any, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    with capsys.disabled():  # the artifact's path, shown even when output is captured
        print(f"\nscreenshot: {path}")


def test_dashboard_files_are_served_with_a_strict_policy(filled: FilledGateway) -> None:
    page = httpx.get(f"{filled.url}/dashboard/")
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{filled.url}/dashboard").status_code == 308
    chart_js = httpx.get(f"{filled.url}/dashboard/vendor/chartjs/chart.umd.min.js")
    assert chart_js.status_code == 200 and "Chart.js v4" in chart_js.text[:200]
    assert httpx.get(f"{filled.url}/dashboard/vendor/chartjs/LICENSE.md").status_code == 200
    for path in ("../gateway/http/app.py", "..%2F..%2Fpyproject.toml", "nope.js"):
        assert httpx.get(f"{filled.url}/dashboard/{path}").status_code == 404


async def test_dashboard_shows_errors_missing_references_and_why_panels_are_empty(
    bare: FilledGateway, tab: Tab, capsys: pytest.CaptureFixture[str]
) -> None:
    """46 requests of which 41 failed must not read as 46 served; a route without a
    reference model shows no savings (and says why); an empty panel names its reason."""
    page = tab.page
    await page.goto(f"{bare.url}/dashboard/")
    await sign_in(page, FINANCE_KEY)
    await page.wait_for_selector("body[data-state=ready]")
    span = {"from": await page.input_value("#from"), "to": await page.input_value("#to")}
    total = api(bare, "/v1/spend", **span)["total"]

    # Failures are a headline figure, and a column of every spend table.
    assert await kpi(page, "error-rate") == total["error_rate_pct"] == 40.0
    assert await page.text_content("#kpi-error-rate") == "40.00%"
    assert await page.text_content("#kpi-errors") == f"{REFUSED} of {BARE_REQUESTS} failed"
    assert await page.text_content("#kpi-answered") == f"{BARE_REQUESTS - REFUSED} answered"
    routes = await cells(page, "routes")
    by_route = {r["route"]: r for r in api(bare, "/v1/spend", **span, group_by="route")["data"]}
    assert set(routes) == {"auto", "plain"}
    for route, row in routes.items():
        assert int(row["errors"]["value"]) == by_route[route]["errors"]
        assert float(row["error_rate_pct"]["value"]) == by_route[route]["error_rate_pct"]
    assert routes["plain"]["error_rate_pct"]["text"] == "57.14%"
    teams = await cells(page, "teams")
    assert teams["ops"]["errors"]["text"] == str(REFUSED)

    # No reference model: no savings, a dash that says why on hover.
    for table, name in (("routes", "plain"), ("teams", "ops"), ("keys", "ops-1")):
        row = (await cells(page, table))[name]
        for column in ("savings_usd", "savings_pct"):
            assert (row[column]["text"], row[column]["value"]) == ("—", ""), (table, column)
            assert row[column]["title"].startswith("No reference model"), (table, column)
    assert float(routes["auto"]["savings_usd"]["value"]) == by_route["auto"]["savings_usd"]
    assert routes["auto"]["savings_usd"]["title"] == ""
    # The totals compare `auto` only, and say what they leave out.
    assert await kpi(page, "savings") == total["savings_usd"] > 0
    assert "left out" in await page.get_attribute("#kpi-savings", "title")
    assert "left out" in await page.text_content("#note-savings")

    # Empty panels name their reason, and draw no empty chart.
    budgets = await page.text_content("#table-budgets tbody")
    assert budgets.startswith("The policy has no budgets")
    assert "No route in the policy has an SLA" in await page.text_content("#table-sla tbody")
    assert await page.is_hidden("#chart-budget") and await page.is_hidden("#chart-sla")
    assert await page.is_visible("#chart-savings")

    await save(page, "dashboard-no-reference.png", capsys)

    # A team that only used the route without a reference: no savings at all.
    await page.select_option("#team", "ops")
    await page.click("#filters button[type=submit]")
    await page.wait_for_selector("body[data-state=ready][data-loads='2']")
    assert await page.text_content("#kpi-savings") == "—"
    assert await page.text_content("#kpi-savings-pct") == "no reference model"
    assert (await page.get_attribute("#kpi-savings", "title")).startswith("No reference model")
    assert await page.text_content("#kpi-error-rate") == "57.14%"

    # A range with no requests at all: nothing to compare, not "no reference model".
    await page.select_option("#team", "")
    await page.fill("#from", "2020-01-01")
    await page.fill("#to", "2020-01-02")
    await page.click("#filters button[type=submit]")
    await page.wait_for_selector("body[data-state=ready][data-loads='3']")
    assert await page.text_content("#kpi-savings-pct") == "no requests"
    assert (await page.text_content("#note-savings")).startswith("No requests in this range")
    assert (await page.get_attribute("#kpi-savings", "title")).startswith("No requests")
    assert tab.problems == []

"""Grafana dashboards and Prometheus alert rules name only metrics that exist: the
gateway's, scraped from a running gateway after real requests, or vLLM's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.health.breaker import STATE_VALUES
from tests.dashboards.conftest import FilledGateway

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
GRAFANA = sorted((DASHBOARDS / "grafana").glob("*.json"))
ALERTS = sorted((DASHBOARDS / "alerts").glob("*.yaml"))
# vLLM 0.33's names for what the engines dashboard shows (histograms marked).
VLLM_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:generation_tokens_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:spec_decode_num_draft_tokens_total": "counter",
    "vllm:spec_decode_num_accepted_tokens_total": "counter",
    "vllm:spec_decode_num_drafts_total": "counter",
}
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
KEYWORDS |= {"unless", "bool", "offset", "inf", "nan"}
SEVERITIES = {"warning", "critical"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range windows
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("(") or match.group() in KEYWORDS:
            continue  # a function, or an operator word
        names.add(match.group())
    return names


def test_metric_names_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, route) (rate(cascade_ttft_seconds_bucket{route=~"$r"}'
        "[$__rate_interval]))) / on (route) group_left sum(vllm:kv_cache_usage_perc) > 1e3 and x"
    )
    assert metric_names(expr) == {"cascade_ttft_seconds_bucket", "vllm:kv_cache_usage_perc", "x"}


@pytest.fixture
def exported(filled: FilledGateway) -> set[str]:
    """Every series name the gateway's /metrics can hold, after real requests."""
    text = httpx.get(f"{filled.url}/metrics").text
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    for name, kind in VLLM_METRICS.items():
        names.add(name)
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ()) if kind == "histogram")
    return names


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every templating query."""
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield f"panel '{panel['title']}'", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert found, variable["query"]
            yield f"variable '{variable['name']}'", found.group(1)


@pytest.mark.parametrize("path", GRAFANA, ids=[p.name for p in GRAFANA])
def test_grafana_panels_query_real_metrics(path: Path, exported: set[str]) -> None:
    board = json.loads(path.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            grid = panel["gridPos"]
            assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
    for where, expr in queries(board):
        names = metric_names(expr)
        assert names, f"{path.name}: {where} selects no metric: {expr}"
        unknown = names - exported
        assert not unknown, f"{path.name}: {where} names unknown metrics {unknown}"


def test_dashboards_cover_what_ops_watch() -> None:
    used = set()
    for path in GRAFANA:
        for _, expr in queries(json.loads(path.read_text())):
            used |= metric_names(expr)
    must = {
        "cascade_requests_total",
        "cascade_errors_total",
        "cascade_ttft_seconds_bucket",
        "cascade_request_duration_seconds_bucket",
        "cascade_sla_requests_total",
        "cascade_cost_usd_total",
        "cascade_reference_cost_usd_total",
        "cascade_budget_remaining_usd",
        *(name + ("_bucket" if kind == "histogram" else "") for name, kind in VLLM_METRICS.items()),
    }
    assert must <= used, must - used


def test_alert_rules_are_prometheus_rules_on_real_metrics(exported: set[str]) -> None:
    assert {p.name for p in ALERTS} >= {"budgets.yaml", "operations.yaml", "sla.yaml"}
    seen: set[str] = set()
    for path in ALERTS:
        document = yaml.safe_load(path.read_text())
        assert set(document) == {"groups"}
        for group in document["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
                assert rule["alert"] not in seen
                seen.add(rule["alert"])
                assert re.fullmatch(r"\d+[smhd]", rule.get("for", "0s")), rule
                assert rule["labels"]["severity"] in SEVERITIES
                assert rule["annotations"]["summary"] and rule["annotations"]["description"]
                names = metric_names(rule["expr"])
                assert names and names <= exported, (rule["alert"], names - exported)
    assert {
        "CascadeBudgetSoftLimitCrossed",
        "CascadeSlaAttainmentLow",
        "CascadePolicyEditRejected",
        "CascadeLedgerArchiveBacklogNearCap",
        "CascadeLedgerArchiveDroppedRecords",
    } <= seen


def alert_rule(name: str) -> dict[str, Any]:
    for path in ALERTS:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if rule["alert"] == name:
                    return dict(rule)
    raise AssertionError(f"no alert rule {name}")


def test_the_ejection_alert_outlasts_the_breakers_cycle() -> None:
    """A failing deployment's breaker goes open -> half-open -> open with each cooldown
    (30 s by default), so no single state lasts a `for:` of minutes: the rule asks that
    the breaker was never closed over its window, and was open in it (one half-open
    only for want of a request to probe it does not fire), on a series that reaches back
    over the window (a restart's young series does not fire early)."""
    assert STATE_VALUES == {"closed": 0, "half_open": 1, "open": 2}  # the gauge's encoding
    rule = alert_rule("CascadeDeploymentEjected")
    assert " ".join(rule["expr"].split()) == (
        "max by (deployment) ( min_over_time(cascade_breaker_state[5m]) >= 1 "
        "and max_over_time(cascade_breaker_state[5m]) == 2 "
        "and present_over_time(cascade_breaker_state[1m] offset 4m) )"
    )
    assert rule["for"] == "1m"
    assert "5 minutes" in rule["annotations"]["summary"]


def test_live_savings_leave_out_routes_without_a_reference_model(bare: FilledGateway) -> None:
    """`plain` has no reference_model: no reference series (a zero one would read as a
    100% loss), and the spend board compares only the cost of routes that have one."""
    text = httpx.get(f"{bare.url}/metrics").text
    references = {
        sample.labels["route"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cascade_reference_cost_usd_total"
    }
    assert references == {"auto"}
    board = json.loads((DASHBOARDS / "grafana" / "spend.json").read_text())
    savings = [
        expr
        for _, expr in queries(board)
        if "cascade_reference_cost_usd_total" in expr and "cascade_cost_usd_total" in expr
    ]
    assert len(savings) == 3
    for expr in savings:  # each cost selection keeps the series of referenced routes only
        compared = "and on (route, team) cascade_reference_cost_usd_total)"
        assert expr.count("cascade_cost_usd_total") == expr.count(compared) == 1, expr

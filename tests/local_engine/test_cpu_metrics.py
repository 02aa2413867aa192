"""The CPU engine's /metrics, scraped over a real loopback socket: vLLM's names, labels
and buckets, and every vLLM metric the dashboards and alert rules read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from local_engine.cpu.app import create_app
from tests.local_engine.loopback_server import Server
from tests.local_engine.tiny_models import speculative_service

MODEL = "tiny-metrics"
DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
# vLLM v1's buckets of vllm:e2e_request_latency_seconds (vllm/v1/metrics/loggers.py).
VLLM_E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
VLLM_NAME = re.compile(r"vllm:[a-zA-Z0-9_:]+")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with Server(create_app(speculative_service(MODEL))) as running:
        yield running


def scrape(server: Server) -> list[Sample]:
    text = httpx.get(server.url + "/metrics").text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def complete(server: Server) -> None:
    body = {"model": MODEL, "prompt": "Once upon", "max_tokens": 5, "temperature": 0}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_e2e_request_latency_is_observed_per_request(server: Server) -> None:
    before = scrape(server)
    complete(server)
    samples = scrape(server)

    def count(of: list[Sample]) -> float:
        counts = [s for s in of if s.name == "vllm:e2e_request_latency_seconds_count"]
        assert [s.labels for s in counts] == [{"model_name": MODEL, "engine": "0"}]
        return counts[0].value

    assert count(samples) == count(before) + 1
    buckets = [s for s in samples if s.name == "vllm:e2e_request_latency_seconds_bucket"]
    assert [float(s.labels["le"]) for s in buckets] == [*VLLM_E2E_BUCKETS, float("inf")]
    assert all(s.labels["model_name"] == MODEL and s.labels["engine"] == "0" for s in buckets)
    total = next(s for s in samples if s.name == "vllm:e2e_request_latency_seconds_sum")
    assert 0 < total.value < 30


def dashboard_vllm_names() -> set[str]:
    """Every vllm:* series the Grafana dashboards and the alert rules select."""
    names: set[str] = set()
    for path in sorted((DASHBOARDS / "grafana").glob("*.json")):
        names |= set(VLLM_NAME.findall(json.dumps(json.loads(path.read_text()))))
    for path in sorted((DASHBOARDS / "alerts").glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                names |= set(VLLM_NAME.findall(rule["expr"]))
    return names


def test_the_cpu_engine_exports_every_vllm_metric_the_dashboards_read(server: Server) -> None:
    complete(server)
    wanted = dashboard_vllm_names()
    assert "vllm:e2e_request_latency_seconds_bucket" in wanted  # the engines board's e2e panel
    samples = scrape(server)
    exported = {s.name for s in samples}
    assert wanted <= exported, wanted - exported
    for sample in samples:
        if sample.name in wanted:
            assert sample.labels["model_name"] == MODEL, sample
